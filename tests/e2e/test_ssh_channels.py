"""Many channels on one host's SSH connection at once, as `down` has them: docker SDK
requests over `dial-stdio` channels while short commands (`rm -f`) run beside them.

A short command can exit before paramiko has put our stdin EOF on the wire; the EOF then
arrived after the channel's CLOSE, sshd dropped the whole connection ("ieof packet
referred to nonexistent channel") and the engine calls on it failed with "Connection
aborted" / RemoteDisconnected (a flake of `pdboot down` on a busy machine).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from pdboot.inventory.schema import Host, SSHSettings
from pdboot.transport.docker_host import Engine
from pdboot.transport.ssh import connect
from tests.testbed.inventory import ssh_settings

pytestmark = [pytest.mark.testbed, pytest.mark.slow]

ENGINE_THREADS = 8
EXEC_THREADS = 3
EXECS_EACH = 120


def to_ingress(tb: Any) -> Any:
    """pdboot's SSH connection to the testbed's ingress host, with the testbed's settings."""
    ssh = SSHSettings(**ssh_settings(tb))
    return connect("ingress", Host(address=tb.hosts["ingress"].address), ssh)


def test_short_commands_beside_engine_calls_keep_the_connection(testbed: Any) -> None:
    conn = to_ingress(testbed)
    engine = Engine.open(conn)
    transport = conn._conn.client.get_transport()  # type: ignore[attr-defined]
    errors: list[str] = []
    calls = [0]
    done = threading.Event()

    def engine_calls() -> None:
        while not done.is_set():
            try:
                engine.api.containers(all=True)
                calls[0] += 1
            except Exception as e:
                errors.append(f"engine: {e!r}")
                return

    def short_commands() -> None:
        for _ in range(EXECS_EACH):
            try:
                res = conn.run(["rm", "-f", "/tmp/pdboot-e2e-nothing"], timeout=60)
                assert res.rc == 0, res
            except Exception as e:
                errors.append(f"exec: {e!r}")
                return

    workers = [threading.Thread(target=engine_calls) for _ in range(ENGINE_THREADS)]
    execs = [threading.Thread(target=short_commands) for _ in range(EXEC_THREADS)]
    try:
        for t in workers + execs:
            t.start()
        for t in execs:
            t.join()
    finally:
        done.set()
        for t in workers:
            t.join()
        engine.close()
    try:
        assert errors == []
        assert calls[0] > 0
        # the same SSH connection all along: pdboot reopens a dropped one for commands,
        # but the engine's channels would have died with it
        assert conn._conn.client.get_transport() is transport  # type: ignore[attr-defined]
        assert transport.is_active()
    finally:
        conn.close()


def test_a_command_that_exits_without_reading_its_input_keeps_its_answer(testbed: Any) -> None:
    """A refusal before the script reads its stdin (ship's script on a project path pdboot did
    not create): 8 MiB of input fill the channel's window, the command exits, sshd closes the
    channel and paramiko's send fails ("Socket is closed"). The command's exit status and
    message must come back, and the connection stay usable (no late EOF)."""
    conn = to_ingress(testbed)
    try:
        res = conn.run("echo refused, not reading >&2; exit 3", timeout=60, stdin="x" * (8 << 20))
        assert res.rc == 3 and "refused, not reading" in res.stderr, res
        assert conn.run(["echo", "still here"], timeout=30).stdout.strip() == "still here"
    finally:
        conn.close()


def test_output_written_after_the_exit_status_still_comes_back(testbed: Any) -> None:
    """sshd sends the exit status when it reaps the command, not when the output ends: what
    is still in the pipe (here a child's line, written after its shell exited) follows it.
    Stopping at the status cut preflight's report short on a loaded machine (its last
    sections empty). The EOF marks the end."""
    conn = to_ingress(testbed)
    try:
        res = conn.run("(sleep 1; echo late; echo late-err >&2) & echo early", timeout=60)
        assert res.rc == 0, res
        assert res.stdout.split() == ["early", "late"], res
        assert res.stderr.strip() == "late-err", res
    finally:
        conn.close()


def _until(cond: Any, what: str, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, f"not within {seconds:g}s: {what}"
        time.sleep(0.05)


def test_engine_calls_outlive_a_channel_or_connection_the_host_ended(testbed: Any) -> None:
    """The docker SDK keeps its `dial-stdio` channels for the next call and skips urllib3's
    check for a dropped one; a kept channel that the host had ended failed the next call with
    "Socket is closed" (CI: a real-engine `up`, after 142 s of waiting for an engine). Here
    the host ends them for real: sshd's own processes for this connection are signalled."""
    conn = to_ingress(testbed)
    engine = Engine.open(conn)
    try:
        engine.containers("pdboot-e2e-none")  # leaves a dial-stdio channel in the pool
        # $PPID: this connection's sshd process; its other children are the dial-stdio ones
        res = conn.run("pkill -KILL -P $PPID -x docker; echo $?", timeout=30)
        assert res.stdout.strip() == "0", res  # at least one channel ended by the host
        pool = engine.api.adapters["http+docker://ssh"].pools.get("engine")
        kept = [c for c in list(pool.pool.queue) if c is not None and c.sock is not None]
        _until(lambda: all(c.sock.eof_received for c in kept), "the end of the output")
        assert engine.containers("pdboot-e2e-none") == []
        transport = conn._conn.client.get_transport()  # type: ignore[attr-defined]
        conn.run("nohup sh -c 'sleep 0.3; kill \"$0\"' $PPID >/dev/null 2>&1 &", timeout=30)
        _until(lambda: not transport.is_active(), "sshd closing the connection")
        assert conn.lost is None  # a closed connection, not a silent host
        assert engine.containers("pdboot-e2e-none") == []
        assert conn._conn.client.get_transport() is not transport  # type: ignore[attr-defined]
    finally:
        engine.close()
        conn.close()
