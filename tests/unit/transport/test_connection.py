"""Pure parts of pdboot.transport.ssh (quoting, masking, error classification, fan-out) and the
`local` connection, which runs real bash. SSH itself is tested against a real sshd in
tests/e2e/."""

from __future__ import annotations

import os
import shlex
import socket
import stat
import threading
import time
from pathlib import Path

import paramiko
import pytest

from pdboot.inventory.schema import Host, SSHOverride, SSHSettings
from pdboot.transport.connection import (
    HostLost,
    LocalConnection,
    RemoteError,
    command_line,
    put_text_script,
)
from pdboot.transport.fanout import fan_out
from pdboot.transport.known_hosts import (
    UnknownHostKey,
    classify,
    known_hosts_name,
    split_known_hosts_name,
)
from pdboot.transport.masking import Masker
from pdboot.transport.ssh import connect, effective_ssh


@pytest.mark.parametrize(
    "argv",
    [
        ["echo", "a b"],
        ["echo", "$HOME", "`id`", "$(id)"],
        ["printf", "%s\n", "it's", 'say "hi"; rm -rf /'],
        ["echo", "", "*", "\n"],
    ],
)
def test_argv_is_quoted_for_the_remote_shell(argv: list[str]) -> None:
    line = command_line(argv)
    assert shlex.split(line) == argv
    out = LocalConnection("t").run(["printf", "%s\\0", *argv[1:]])
    assert out.stdout.split("\0")[:-1] == argv[1:]


def test_a_string_is_a_script_and_an_empty_argv_is_refused() -> None:
    assert command_line("a | b") == "a | b"
    with pytest.raises(ValueError):
        command_line([])


def test_local_run_reports_rc_stdout_stderr_and_stdin() -> None:
    c = LocalConnection("t")
    r = c.run("cat; echo oops >&2; exit 3", stdin="hello")
    assert (r.rc, r.stdout, r.stderr) == (3, "hello", "oops\n")
    assert not r.ok and r.seconds >= 0


def test_local_timeout_is_a_remote_error() -> None:
    with pytest.raises(RemoteError) as e:
        LocalConnection("t").run("sleep 5", timeout=0.2)
    assert e.value.kind == "timeout"


def test_put_text_writes_with_the_mode_and_never_world_readable(tmp_path: os.PathLike[str]) -> None:
    target = os.path.join(tmp_path, "sub dir", "secrets.env")
    c = LocalConnection("t")
    c.put_text(target, "HF_TOKEN=abc\n", 0o600)
    assert Path(target).read_text() == "HF_TOKEN=abc\n"
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o600
    assert os.listdir(os.path.dirname(target)) == ["secrets.env"]  # no temp file left
    script = put_text_script(target, 0o600)
    assert script.index("umask 077") < script.index("mktemp") < script.index("chmod 600")


def test_masker_hides_registered_values_longest_first() -> None:
    m = Masker()
    m.register("hf_secret")
    m.register("hf_secret_long")
    m.register("a")  # too short to mask safely
    assert m.mask("token=hf_secret_long x=hf_secret a") == "token=*** x=*** a"


def _key() -> paramiko.PKey:
    return paramiko.ECDSAKey.generate()  # a throwaway key; only its fingerprint matters


def test_split_known_hosts_name() -> None:
    assert split_known_hosts_name("[10.77.0.2]:2222") == ("10.77.0.2", 2222)
    assert split_known_hosts_name("gpu-a") == ("gpu-a", None)
    assert known_hosts_name("h", 22) == "h"
    assert known_hosts_name("h", 2222) == "[h]:2222"


def test_unknown_host_key_error_shows_fingerprint_and_keyscan_line() -> None:
    key = _key()
    exc = UnknownHostKey("[10.77.0.2]:2222", key, "/tmp/kh")
    e = classify(exc, "gpu-a")
    assert e.kind == "host_key"
    assert key.fingerprint in e.message
    assert "ssh-keyscan -t ecdsa-sha2-nistp256 -p 2222 10.77.0.2 >> /tmp/kh" in e.fix
    assert "--accept-new-host-keys" in e.fix


def test_changed_host_key_is_its_own_kind() -> None:
    key = _key()
    other = _key()
    exc = paramiko.BadHostKeyException("10.77.0.2", key, other)
    e = classify(exc, "gpu-a", known_hosts="/tmp/kh", kh_name="[10.77.0.2]:2222")
    assert e.kind == "host_key_changed"
    assert "ssh-keygen -R '[10.77.0.2]:2222' -f /tmp/kh" in e.fix


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (paramiko.AuthenticationException("Authentication failed."), "auth"),
        (OSError(113, "No route to host"), "unreachable"),
        (TimeoutError(), "timeout"),
        (
            paramiko.ssh_exception.NoValidConnectionsError({("10.0.0.1", 22): OSError()}),
            "unreachable",
        ),
        (ConnectionRefusedError(111, "Connection refused"), "unreachable"),
        (socket.gaierror(-2, "Name or service not known"), "unreachable"),
        (paramiko.SSHException("Error reading SSH protocol banner"), "timeout"),
        (paramiko.SSHException("No authentication methods available"), "auth"),
        (ValueError("odd"), "error"),
    ],
)
def test_classify(exc: BaseException, kind: str) -> None:
    e = classify(exc, "h")
    assert e.kind == kind
    assert e.host == "h"


def test_fan_out_reports_each_host_and_never_waits_past_the_deadline() -> None:
    release = threading.Event()

    def fn(name: str, item: int) -> int:
        if item == 0:
            raise RemoteError(name, "auth", "refused")
        if item == 2:
            release.wait(30)  # a hung host
        return item * 10

    t0 = time.monotonic()
    res = fan_out({"a": 0, "b": 1, "c": 2}, fn, deadline=0.5)
    elapsed = time.monotonic() - t0
    release.set()
    assert list(res) == ["a", "b", "c"]
    assert res["a"].error is not None and res["a"].error.kind == "auth"
    assert res["b"].value == 10 and res["b"].ok
    assert res["c"].error is not None and res["c"].error.kind == "timeout"
    assert elapsed < 25  # not joined on the hung thread (which would take 30 s)


def test_effective_ssh_applies_host_overrides() -> None:
    base = SSHSettings(user="ops", port=22, connect_timeout=10)
    host = Host(address="10.0.0.2", ssh=SSHOverride(port=2222, connect_timeout=3))
    eff = effective_ssh(base, host)
    assert (eff.user, eff.port, eff.connect_timeout) == ("ops", 2222, 3)


def test_local_host_gets_a_local_connection() -> None:
    c = connect("me", Host(address="local"), SSHSettings())
    assert isinstance(c, LocalConnection)
    assert c.run(["echo", "ok"]).stdout == "ok\n"


def test_unreachable_names_each_address_and_its_cause() -> None:
    exc = paramiko.ssh_exception.NoValidConnectionsError(
        {
            ("10.0.0.2", 22): OSError(113, "No route to host"),
            ("fd00::2", 22, 0, 0): ConnectionRefusedError(111, "Connection refused"),
        }
    )
    e = classify(exc, "h2")
    assert e.kind == "unreachable"
    assert e.message == (
        "cannot connect to 10.0.0.2:22 (No route to host), [fd00::2]:22 (Connection refused)"
    )
    assert "Errno None" not in e.message


def test_host_lost_names_the_host_and_is_both_kinds_in_the_engine() -> None:
    from pdboot.transport.docker_parse import EngineError, EngineLost

    e = HostLost("gpu-a", "no answer for 12s")
    assert e.message == "host gpu-a lost: no answer for 12s" and e.kind == "unreachable"
    el = EngineLost("gpu-a", "no answer for 12s")
    assert isinstance(el, EngineError) and isinstance(el, HostLost)
    assert el.message == e.message and classify(el, "gpu-a") is el
