"""pdboot.transport.ssh against a real sshd (testbed hosts): one reused connection per host,
argv quoting through the remote shell, stdin, put_text modes, timeouts, fan-out with an
unreachable host. Under CI=true a testbed that cannot start fails; elsewhere it skips."""

from __future__ import annotations

import time
from typing import Any

import pytest

from pdboot.inventory.schema import Host, SSHSettings
from pdboot.transport.connection import RemoteError
from pdboot.transport.fanout import fan_out
from pdboot.transport.ssh import connect
from tests.conftest import module_testbed
from tests.testbed.harness import HostSpec

pytestmark = [pytest.mark.testbed, pytest.mark.slow]


tb = module_testbed(
    [HostSpec("r1"), HostSpec("r2"), HostSpec("down", sshd=False)], images_needed=False
)


def settings(tb: Any, **kw: Any) -> SSHSettings:
    base: dict[str, Any] = dict(
        user="root",
        identity_file=str(tb.identity_file),
        known_hosts=str(tb.known_hosts),
        use_ssh_config=False,
        connect_timeout=5,
        command_timeout=30,
    )
    base.update(kw)
    return SSHSettings(**base)


def test_one_connection_is_reused_for_every_command(tb: Any) -> None:
    c = connect("r1", Host(address=tb.hosts["r1"].address), settings(tb))
    try:
        # SSH_CONNECTION holds the client's source port: the same for every command
        seen = {c.run("echo $SSH_CONNECTION").stdout for _ in range(3)}
        assert len(seen) == 1 and tb.hosts["r1"].address in seen.pop()
    finally:
        c.close()


def test_argv_is_quoted_and_stdin_reaches_the_command(tb: Any) -> None:
    c = connect("r1", Host(address=tb.hosts["r1"].address), settings(tb))
    try:
        tricky = ["it's", "$(id)", "a b", ";rm -rf /tmp/x", "*"]
        r = c.run(["printf", "%s\\n", *tricky])
        assert r.ok and r.stdout.splitlines() == tricky
        r = c.run(["cat"], stdin="via stdin\n")
        assert r.stdout == "via stdin\n"
        r = c.run("echo out; echo err >&2; exit 7")
        assert (r.rc, r.stdout, r.stderr) == (7, "out\n", "err\n")
    finally:
        c.close()


def test_put_text_is_never_world_readable(tb: Any) -> None:
    c = connect("r1", Host(address=tb.hosts["r1"].address), settings(tb))
    try:
        path = "/var/lib/pdboot/rt-test/secrets.env"
        c.put_text(path, "HF_TOKEN=hf_abc\n", 0o600)
        r = c.run(["stat", "-c", "%a %s", path])
        assert r.stdout.split() == ["600", "16"]
        assert c.run(["cat", path]).stdout == "HF_TOKEN=hf_abc\n"
        c.run(["rm", "-rf", "/var/lib/pdboot/rt-test"])
    finally:
        c.close()


def test_a_command_timeout_is_reported_and_the_connection_survives(tb: Any) -> None:
    c = connect("r1", Host(address=tb.hosts["r1"].address), settings(tb))
    try:
        with pytest.raises(RemoteError) as e:
            c.run("sleep 10", timeout=0.5)
        assert e.value.kind == "timeout"
        assert c.run("echo alive").stdout == "alive\n"
    finally:
        c.close()


def test_fan_out_reports_the_unreachable_host_and_runs_the_others(tb: Any) -> None:
    s = settings(tb)

    def work(name: str, host: Host) -> str:
        c = connect(name, host, s)
        try:
            return c.run("hostname").stdout.strip()
        finally:
            c.close()

    hosts = {n: Host(address=tb.hosts[n].address) for n in ("r1", "r2", "down")}
    t0 = time.monotonic()
    res = fan_out(hosts, work, deadline=30)
    assert time.monotonic() - t0 < 30
    assert res["r1"].value == "r1" and res["r2"].value == "r2"
    err = res["down"].error
    assert err is not None and err.kind == "unreachable"


def test_wrong_key_is_an_auth_error(tb: Any, tmp_path: Any) -> None:
    import subprocess

    key = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    with pytest.raises(RemoteError) as e:
        connect(
            "r1",
            Host(address=tb.hosts["r1"].address),
            settings(tb, identity_file=str(key)),
        )
    assert e.value.kind == "auth"
