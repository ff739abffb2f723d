"""`docker.image_args` in preflight: the image's own `vllm serve` parser on the engine commands,
when the image the plan names is already on the host (an earlier pull, a previous `up`).

The engine commands are rendered from the inventory alone (``build_plan(inv)``): what
preflight finds (RDMA, NICs, interfaces) goes into environment variables, not the argv the
parser judges, so the commands are known before any host answers. Whether the image is on a
host is one more command of that host's one batch (``batch_commands``: `docker image inspect
--format {{.Id}}`, no SSH exec of its own: issue 35's one round trip per host). After the
batch, ``start`` reads the image IDs from its output and, where an image is there, runs
preflight/image_args.py's ``judge`` on its own thread: the verdicts kept on pdboot's machine
(preflight/args_cache.py) for that ID, the image's container only for what they lack (then
on the same connection, a second exec). An absent image is a skip note: `up` checks it after
the pull. The host's connection is closed when this check is done.
"""

from __future__ import annotations

import shlex
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from pdboot.inventory.schema import Inventory
from pdboot.plan.build import build_plan
from pdboot.preflight.args_cache import Cache
from pdboot.preflight.checks import MISSING, CheckResult, Command, Section, by_key, parse_sections
from pdboot.preflight.image_args import (
    ARGS_ID,
    TIMEOUT_S,
    default_cache,
    engine_commands,
    inspect_argv,
    judge,
    not_run,
    read_id,
)
from pdboot.transport.connection import Connection, RemoteError
from pdboot.transport.masking import mask

# ``wait``'s bound past the parser's own timeout: a thread's exec gives up at ``timeout`` and
# then still closes its connection; only one stuck past that is reported as not answering.
JOIN_GRACE_S = 10.0

Commands = Mapping[str, Mapping[str, Mapping[str, list[str]]]]  # host -> image -> engine -> argv


def commands_of(inv: Inventory) -> tuple[dict[str, dict[str, dict[str, list[str]]]], str]:
    """(host -> image -> engine -> argv, "") or ({}, why the commands could not be rendered)."""
    try:
        return engine_commands(build_plan(inv)), ""
    except Exception as e:  # an inventory render refuses is reported by render/up, not here
        return {}, f"{type(e).__name__}: {e}"


def absent_note(image: str) -> CheckResult:
    return CheckResult(
        ARGS_ID,
        "skip",
        f"{image} is not on this host yet: `up` checks the engine commands with its own "
        f"`vllm serve` parser after the pull",
    )


def inspect_command(image: str) -> Command:
    """The batch's command telling whether ``image`` is on the host, and its ID."""
    return Command(f"args_image {image}", shlex.join(inspect_argv(image)), "docker")


def found_ids(images: Iterable[str], sections: Mapping[str, Section]) -> dict[str, tuple[str, str]]:
    """image -> ``read_id`` of its inspect's section in the batch output (``by_key``'s). Pure."""
    out: dict[str, tuple[str, str]] = {}
    for image in images:
        sec = sections.get(inspect_command(image).key, MISSING)
        out[image] = read_id(sec.rc, sec.output)
    return out


def host_check(
    run: Callable[[list[str], float], tuple[int, str]],
    images: Mapping[str, Mapping[str, list[str]]],
    ids: Mapping[str, tuple[str, str]],
    cache: Cache,
    timeout: float = TIMEOUT_S,
) -> list[CheckResult]:
    """One engine host: per image, a skip note when it is not there (``ids``: image ->
    ``read_id``'s answer), else the verdicts."""
    out: list[CheckResult] = []
    for image in sorted(images):
        iid, why = ids.get(image, ("", "docker image inspect did not run"))
        if not iid:
            if why == "absent":
                out.append(absent_note(image))
            else:
                msg = f"cannot tell whether {image} is on this host ({why})"
                out.append(CheckResult(ARGS_ID, "skip", f"{msg}: `up` checks it after the pull"))
            continue
        out += judge(run, image, images[image], cache, timeout, known_id=iid)
    return out


def _runner(conn: Connection) -> Callable[[list[str], float], tuple[int, str]]:
    def run(argv: list[str], timeout: float) -> tuple[int, str]:
        res = conn.run(argv, timeout=timeout)
        return res.rc, mask(res.stdout + res.stderr)

    return run


@dataclass
class ArgsProbes:
    """The check on every engine host of one preflight run: ``batch_commands`` in each
    host's batch, ``start`` per host after it, ``wait`` once after the batches."""

    commands: Commands
    cache: Cache = field(default_factory=default_cache)
    timeout: float = TIMEOUT_S
    results: dict[str, list[CheckResult]] = field(default_factory=dict)
    threads: dict[str, threading.Thread] = field(default_factory=dict)

    @classmethod
    def of(cls, inv: Inventory, wanted: bool, cache: Cache | None = None) -> ArgsProbes:
        cmds = commands_of(inv)[0] if wanted else {}
        return cls(cmds, cache or default_cache())

    def batch_commands(self, host: str) -> list[Command]:
        """The inspects ``host``'s batch runs for this check (none: not an engine host, or
        the check not wanted)."""
        return [inspect_command(image) for image in sorted(self.commands.get(host, {}))]

    def start(
        self, host: str, conn: Connection, output: str, close: Callable[[], None] | None
    ) -> None:
        """After the host's batch (``output``): the check on ``conn`` for every image found
        there, on its own thread; ``close``, if given, runs once it is done."""
        images = self.commands.get(host)
        if not images:
            if close is not None:
                close()
            return
        cmds = self.batch_commands(host)
        ids = found_ids(images, by_key(cmds, parse_sections(output)))
        run = _runner(conn)

        def work() -> None:
            try:
                self.results[host] = host_check(run, images, ids, self.cache, self.timeout)
            except RemoteError as e:
                self.results[host] = [not_run(f"{e.kind}: {e.message}")]
            except Exception as e:  # a bug must not take down the other checks
                self.results[host] = [not_run(f"internal error: {type(e).__name__}: {e}")]
            finally:
                if close is not None:
                    close()

        if not any(iid for iid, _ in ids.values()):  # nothing to judge: no thread, no exec
            work()
            return
        t = threading.Thread(target=work, daemon=True, name=f"pdboot-args-{host}")
        self.threads[host] = t
        t.start()

    def wait(self) -> dict[str, list[CheckResult]]:
        """Every started host's results; one still running past its time fails."""
        end = time.monotonic() + self.timeout + JOIN_GRACE_S
        for host, t in self.threads.items():
            t.join(max(0.0, end - time.monotonic()))
            if t.is_alive():
                why = f"the image's parser did not answer within {self.timeout:.0f} s"
                self.results[host] = [not_run(why)]
        return dict(self.results)


__all__ = [
    "ArgsProbes",
    "absent_note",
    "commands_of",
    "found_ids",
    "host_check",
    "inspect_command",
]
