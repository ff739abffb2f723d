"""`logs` as `docker compose logs` does it: --follow across every service at once (lines as
they arrive, each after its service's name), --timestamps, --tail all; a stream that breaks
is named and the others go on (fake hosts and engine, as test_orchestrator)."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from typing import Any

from pdboot import events as ev
from pdboot.deploy.logs import LogOptions, logs
from pdboot.deploy.up import UpOptions
from pdboot.inventory.schema import Inventory
from pdboot.timestamps import parse_rfc3339
from pdboot.transport.docker_parse import EngineLost
from pdboot.transport.hosts import Hosts, Link
from tests.unit.orchestrator_fakes import Recorder, World, inventory, up_in

SERVICES = ("decode@d1", "prefill@p1", "router@r", "proxy@r")


def _deployed() -> World:
    world = World(inventory())
    code = up_in(world, UpOptions(skip_preflight=True, prove=False), Recorder())
    assert code == 0
    for c in world.containers.values():
        c.logs.extend(f"line {i}" for i in range(1, 150))
    return world


class _Engine:
    """The fake engine, with follow_logs replaced by ``follow`` (key of the container)."""

    def __init__(self, inner: Any, follow: Any) -> None:
        self.inner, self.follow = inner, follow

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def follow_logs(self, cid: str, **kw: Any) -> Iterator[str]:
        return self.follow(cid, **kw)  # type: ignore[no-any-return]


def _run(world: World, selector: str | None, opts: LogOptions, follow: Any = None) -> Any:
    def hosts(inv: Inventory, names: Iterable[str], _: LogOptions) -> Hosts:
        opened = world.hosts(inv, names, False)
        if follow is not None:
            for name, link in opened.links.items():
                opened.links[name] = Link(link.conn, _Engine(link.engine, follow))  # type: ignore[arg-type]
        return opened

    lines: list[str] = []
    rec = Recorder()
    code = logs(world.inv, selector, lines.append, rec, opts, hosts_factory=hosts)
    return code, lines, rec


def _service(world: World, cid: str) -> str:
    c = world.containers[cid]
    return f"{c.labels['io.pdboot.role']}@{c.host}"


def test_follow_reads_every_service_at_once() -> None:
    """Each stream waits for the others' first line before its second: read one after the
    other, as before, this would never end (the event waits fail it instead)."""
    world = _deployed()
    firsts = {s: threading.Event() for s in SERVICES}

    def follow(cid: str, **_: Any) -> Iterator[str]:
        me = _service(world, cid)
        yield f"{me} first"
        firsts[me].set()
        for e in firsts.values():
            assert e.wait(10), "a stream was not read while another one was open"
        yield f"{me} second"

    code, lines, rec = _run(world, None, LogOptions(follow=True), follow)
    assert code == 0, rec.events
    named = [ln.split(" | ", 1) for ln in lines]
    assert {n.strip() for n, _ in named} == set(SERVICES)
    # every first line came before any second one
    assert [t.endswith("first") for _, t in named] == [True] * 4 + [False] * 4
    width = max(map(len, SERVICES))
    assert f"{'decode@d1':<{width}} | decode@d1 second" in lines


def test_a_broken_stream_is_named_and_the_others_go_on() -> None:
    world = _deployed()

    def follow(cid: str, **_: Any) -> Iterator[str]:
        me = _service(world, cid)
        if me == "prefill@p1":
            raise EngineLost("p1", "no answer to SSH keepalives for 12s")
        yield f"{me} alive"

    code, lines, rec = _run(world, None, LogOptions(follow=True), follow)
    assert code == 1
    assert len(lines) == 3 and not any("prefill@p1" in ln for ln in lines)
    (note,) = [e for e in rec.of(ev.Note) if e.level == "error"]
    assert "p1" in note.message


def test_one_service_follows_without_a_name_before_its_lines() -> None:
    world = _deployed()
    code, lines, _ = _run(world, "decode", LogOptions(follow=True, tail=2))
    assert code == 0 and lines == ["line 148", "line 149"]


def test_timestamps_and_tail_all() -> None:
    world = _deployed()
    code, lines, _ = _run(world, "router", LogOptions(tail=None, timestamps=True))
    assert code == 0 and len(lines) == 150  # "router loading" and 149 more
    stamp, text = lines[-1].split(" ", 1)
    assert parse_rfc3339(stamp) is not None and text == "line 149"
    code, plain, _ = _run(world, "router", LogOptions(tail=3))
    assert plain == ["line 147", "line 148", "line 149"]
