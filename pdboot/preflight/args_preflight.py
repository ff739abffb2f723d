"""`docker.image_args` in preflight: the image's own `vllm serve` parser on the engine commands,
when the image the plan names is already on the host (an earlier pull, a previous `up`).

The engine commands are rendered from the inventory alone (``build_plan(inv)``): what
preflight finds (RDMA, NICs, interfaces) goes into environment variables, not the argv the
parser judges, so the commands are known before any host answers. Each engine host's check
starts in its own thread on that host's connection as soon as it is open, beside the batch
of the other checks: `docker image inspect` of the reference (one short command, the only
cost when the image is absent), then preflight/image_args.py's ``judge``, which reads the
verdicts kept on pdboot's machine (preflight/args_cache.py) and runs the image's container
only for what they lack. An absent image is a skip note: `up` checks it after the pull.
The host's connection is closed when both the batch and this check are done.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from pdboot.inventory.schema import Inventory
from pdboot.plan.build import build_plan
from pdboot.preflight.args_cache import Cache
from pdboot.preflight.checks import CheckResult
from pdboot.preflight.image_args import (
    ARGS_ID,
    INSPECT_TIMEOUT_S,
    TIMEOUT_S,
    default_cache,
    engine_commands,
    image_id,
    judge,
    not_run,
)
from pdboot.transport.connection import Connection, RemoteError
from pdboot.transport.masking import mask

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


def host_check(
    run: Callable[[list[str], float], tuple[int, str]],
    images: Mapping[str, Mapping[str, list[str]]],
    cache: Cache,
    timeout: float = TIMEOUT_S,
) -> list[CheckResult]:
    """One engine host: per image, a skip note when it is not there, else the verdicts."""
    out: list[CheckResult] = []
    for image in sorted(images):
        iid, why = image_id(run, image)
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


class _Holders:
    """Closes the host's connection once its last user (the batch, this check) is done."""

    def __init__(self, n: int, close: Callable[[], None] | None) -> None:
        self.n, self.close, self.lock = n, close, threading.Lock()

    def release(self) -> None:
        with self.lock:
            self.n -= 1
            last = self.n == 0
        if last and self.close is not None:
            self.close()


@dataclass
class ArgsProbes:
    """The check on every engine host of one preflight run; ``start`` per host, ``wait``
    once after the batches."""

    commands: Commands
    cache: Cache = field(default_factory=default_cache)
    timeout: float = TIMEOUT_S
    results: dict[str, list[CheckResult]] = field(default_factory=dict)
    threads: dict[str, threading.Thread] = field(default_factory=dict)

    @classmethod
    def of(cls, inv: Inventory, wanted: bool, cache: Cache | None = None) -> ArgsProbes:
        cmds = commands_of(inv)[0] if wanted else {}
        return cls(cmds, cache or default_cache())

    def start(
        self, host: str, conn: Connection, close: Callable[[], None] | None
    ) -> Callable[[], None]:
        """Start the host's check on ``conn``; returns what the batch calls when it is done
        (``close``, if given, runs after both)."""
        images = self.commands.get(host)
        if not images:
            return close or (lambda: None)
        holders = _Holders(2, close)
        run = _runner(conn)

        def work() -> None:
            try:
                self.results[host] = host_check(run, images, self.cache, self.timeout)
            except RemoteError as e:
                self.results[host] = [not_run(f"{e.kind}: {e.message}")]
            except Exception as e:  # a bug must not take down the other checks
                self.results[host] = [not_run(f"internal error: {type(e).__name__}: {e}")]
            finally:
                holders.release()

        t = threading.Thread(target=work, daemon=True, name=f"pdboot-args-{host}")
        self.threads[host] = t
        t.start()
        return holders.release

    def wait(self) -> dict[str, list[CheckResult]]:
        """Every started host's results; one still running past its time fails."""
        end = time.monotonic() + self.timeout + 2 * INSPECT_TIMEOUT_S
        for host, t in self.threads.items():
            t.join(max(0.0, end - time.monotonic()))
            if t.is_alive():
                why = f"the image's parser did not answer within {self.timeout:.0f} s"
                self.results[host] = [not_run(why)]
        return dict(self.results)


__all__ = ["ArgsProbes", "absent_note", "commands_of", "host_check"]
