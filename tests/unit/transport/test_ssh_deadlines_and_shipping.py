"""Shipping, reading and connecting (issue 18, items 10-14), each on the reproduction the review
gave (real bash, real sockets): a compose file over 128 KiB, SSH deadlines on every hop, a
known_hosts that forgets, FIFOs as secret or known_hosts files. The same review's rendering,
inventory and route-script cases: plan/test_render_round_trip.py, inventory/test_special_files.py,
preflight/test_route_script.py."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
from fabric import Connection as FabricConnection

from pdboot.inventory.schema import SSHSettings
from pdboot.transport import sshdeadline
from pdboot.transport.connection import LocalConnection, RemoteError
from pdboot.transport.docker_host import PROJECT_MARKER, Engine, ship_script
from pdboot.transport.ssh import SSHConnection

# --------------------------------------------------------------------------- item 10


def test_a_compose_file_over_128_kib_ships_over_stdin(tmp_path: Path) -> None:
    big = "services: {}\n# " + "x" * (300 * 1024) + "\n"
    # the old way (the file inside the one exec argument) fails as the review saw
    with pytest.raises(OSError) as exc:
        subprocess.run(["bash", "-c", f"cat <<'E'\n{big}E\n"], capture_output=True, check=False)
    assert exc.value.errno == 7  # E2BIG
    d = tmp_path / "demo"
    extra = {"rdma.json": '{"x": "é"}'}
    script, _stdin = ship_script(str(d), {"compose.yaml": big, **extra}, "HF_TOKEN=t0k\n")
    assert len(script) < 8192 and "x" * 100 not in script and "t0k" not in script
    Engine(LocalConnection("box"), api=None).ship(str(d), big, "HF_TOKEN=t0k\n", extra)
    assert (d / "compose.yaml").read_text() == big
    assert (d / "rdma.json").read_text() == '{"x": "é"}\n'
    assert (d / "secrets.env").read_text() == "HF_TOKEN=t0k\n"
    assert (d / "secrets.env").stat().st_mode & 0o777 == 0o600
    assert (d / PROJECT_MARKER).read_text() == "demo\n"


# --------------------------------------------------------------------------- item 12


def _silent_server() -> tuple[socket.socket, int]:
    """Accepts TCP and never says a word (a hung bastion or sshd)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            held.append(c)

    threading.Thread(target=accept, daemon=True).start()
    return srv, srv.getsockname()[1]


def test_every_hop_gets_the_timeouts() -> None:
    hop2 = FabricConnection("bastion-2", port=22)
    hop1 = FabricConnection("bastion-1", port=22, gateway=hop2)
    target = FabricConnection("gpu-a", port=22, gateway=hop1)
    sshdeadline.apply_timeouts(target, 4)
    chain = sshdeadline.hop_chain(target)
    assert [c.host for c in chain] == ["gpu-a", "bastion-1", "bastion-2"]
    for c in chain:
        assert c.connect_timeout == 4
        assert c.connect_kwargs["banner_timeout"] == 4
        assert c.connect_kwargs["auth_timeout"] == 4
        assert c.connect_kwargs["channel_timeout"] == 4


@pytest.mark.timeout(60)
def test_a_silent_proxyjump_hop_fails_within_the_deadline() -> None:
    srv, port = _silent_server()
    try:
        hop = FabricConnection("127.0.0.1", port=port)
        target = FabricConnection("10.0.0.1", port=22, gateway=hop)
        sshdeadline.apply_timeouts(target, 1)
        t0 = time.monotonic()
        with pytest.raises((TimeoutError, Exception)) as exc:
            sshdeadline.open_with_deadline(target, sshdeadline.overall_deadline(1, 2), "t")
        took = time.monotonic() - t0
        assert took < 12, took  # paramiko's defaults: 15 s banner, then up to 3,600 s
        assert exc.value is not None
    finally:
        srv.close()


@pytest.mark.timeout(60)
def test_the_overall_deadline_cuts_a_stalled_open() -> None:
    class Stalled:
        host = "gpu-a"
        gateway = None

        def __init__(self) -> None:
            self.closed = threading.Event()
            self.client = self

        def open(self) -> None:
            self.closed.wait(30)

        def close(self) -> None:
            self.closed.set()

    c = Stalled()
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="no SSH session within 1s"):
        sshdeadline.open_with_deadline(c, 1.0, "gpu-a")
    assert time.monotonic() - t0 < 5 and c.closed.is_set()


@pytest.mark.timeout(60)
def test_sshconnection_to_a_silent_host_is_a_timeout_error() -> None:
    srv, port = _silent_server()
    try:
        s = SSHSettings(port=port, connect_timeout=1, use_ssh_config=False)
        conn = SSHConnection("gpu-a", "127.0.0.1", s)
        t0 = time.monotonic()
        with pytest.raises(RemoteError) as exc:
            conn.open()
        assert time.monotonic() - t0 < 10
        assert exc.value.kind == "timeout", exc.value
    finally:
        srv.close()


# --------------------------------------------------------------------------- item 13


def test_accept_new_with_a_known_hosts_that_forgets_is_refused(tmp_path: Path) -> None:
    s = SSHSettings(known_hosts="/dev/null", use_ssh_config=False)
    with pytest.raises(RemoteError, match="forgotten") as exc:
        SSHConnection("gpu-a", "192.0.2.10", s, accept_new_host_keys=True)
    assert "known_hosts" in exc.value.fix
    cfg = tmp_path / "ssh_config"
    cfg.write_text("Host *\n  UserKnownHostsFile /dev/null\n")
    assert sshdeadline.discarding_known_hosts("/dev/null")
    assert not sshdeadline.discarding_known_hosts(str(tmp_path / "known_hosts"))
    # without --accept-new-host-keys every key is unknown and refused: no silent trust
    SSHConnection("gpu-a", "192.0.2.10", s, accept_new_host_keys=False).close()


# --------------------------------------------------------------------------- item 14


@pytest.mark.timeout(20)
def test_a_fifo_secret_or_known_hosts_file_does_not_block(tmp_path: Path) -> None:
    from pdboot.transport.hosts import SecretError, read_secret
    from pdboot.transport.known_hosts import load_known_hosts

    fifo = tmp_path / "token"
    os.mkfifo(fifo)
    with pytest.raises(SecretError, match="FIFO"):
        read_secret(f"file:{fifo}", "secrets.hf_token")
    assert load_known_hosts(str(fifo)).keys == []
