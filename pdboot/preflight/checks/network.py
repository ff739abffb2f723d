"""Network checks: run FROM a host, so they test the path traffic will really take.

- decode -> each prefill host's NIXL side channel (decode pulls KV from prefill);
- the router host -> each engine's HTTP port;
- each engine host -> the first one's weights seed port (weights.seed: first_host);
- each host's clock (compared across hosts by the orchestrator).

The clock is read first and last in the batch, alone. With our clock read before the batch
was sent and after it came back, that bounds the host's offset from ours the way NTP does:
the first reading was taken after we sent, the last before we heard back. A slow round
trip (a loaded host, a busy link) widens the window; it never passes for a skewed clock.

At preflight time nothing listens yet, so a TCP connect answered with "refused" proves
the address is reachable; only a timeout or "no route" means it is not.

A host's probes are ONE command (``probes_command``): every connect a forked subshell, all
at once under one ``timeout``, so a router probing 32 engines costs one process pair, not
32 (each probe used to be its own `timeout bash -c`, two execs inside the batch's own two).
Each probe's text is printed after a ``probe=N`` line in the layout the single probes had
(the connect error, then ``rc=N``; ``rc=124`` when it was still waiting at the timeout), so
one parser reads both; captures recorded with the single probes still parse through their
``probe{i}`` sections (kept as not-run commands).
"""

from __future__ import annotations

import contextlib
import re
import shlex
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pdboot.preflight.checks import (
    MISSING,
    CheckResult,
    Command,
    HostContext,
    ParseError,
    Probe,
    Section,
)

if TYPE_CHECKING:
    from pdboot.preflight.checks.facts import HostFacts

CLOCK = "date +%s.%N"
CLOCK_END = "date +%s.%N  # after the others"  # its own line: sections are keyed by line
PROBE_TIMEOUT_S = 3


def probe_command(p: Probe) -> str:
    # two shells deep: the path is quoted for the inner bash, that command for the outer one
    inner = f"exec 3<>{shlex.quote(f'/dev/tcp/{p.address}/{p.port}')}"
    return f'timeout {PROBE_TIMEOUT_S} bash -c {shlex.quote(inner)} 2>&1; echo "rc=$?"'


# $1: the folder for the answers; then the /dev/tcp paths. Each connect is one fork (the
# background group; its `exec` keeps the error in its file), and the report reads the
# files with builtins: no exec per probe. An rc file is written only once its connect
# returned, so a probe killed at the timeout has none.
_PROBE_ALL = (
    't=$1; shift; i=0; for a in "$@"; do '
    '{ exec 2>"$t/$i.out" 3<>"$a"; echo $? >"$t/$i.rc"; } & i=$((i + 1)); done; wait'
)
_REPORT = (
    'i=0; for a in "$@"; do echo "probe=$i"; [ -f "$t/$i.out" ] && '
    'while IFS= read -r l || [ -n "$l" ]; do printf \'%s\\n\' "$l"; done <"$t/$i.out"; '
    'rc=124; [ -s "$t/$i.rc" ] && read -r rc <"$t/$i.rc"; echo "rc=$rc"; i=$((i + 1)); done'
)


def probes_command(probes: Sequence[Probe]) -> str:
    """Every probe of a host at once (see the module doc). Addresses reach the shell only as
    quoted arguments, never as code."""
    paths = " ".join(shlex.quote(f"/dev/tcp/{p.address}/{p.port}") for p in probes)
    return (
        't=$(mktemp -d "${TMPDIR:-/tmp}/pdboot-probes.XXXXXX") || exit 1; '
        "trap 'rm -rf \"$t\"' EXIT; "
        f'timeout {PROBE_TIMEOUT_S} bash -c {shlex.quote(_PROBE_ALL)} probes "$t" {paths}; '
        f"set -- {paths}; {_REPORT}"
    )


def commands(ctx: HostContext) -> list[Command]:
    out = [
        Command("clock", CLOCK, "network", at="start"),
        Command("clock_end", CLOCK_END, "network", at="end"),
    ]
    if ctx.probes:
        out.append(Command(PROBES, probes_command(ctx.probes), "network"))
    # the single probes of older batches: not run, read from captures that have them
    for i, p in enumerate(ctx.probes):
        out.append(Command(f"probe{i}", probe_command(p), "network", recorded_only=True))
    return out


PROBES = "probes"


def split_probes(text: str, n: int) -> list[str | None]:
    """The combined probes' output -> each probe's text (None: not printed)."""
    blocks: dict[int, list[str]] = {}
    cur: list[str] | None = None
    for line in text.splitlines():
        m = re.fullmatch(r"probe=(\d+)", line)
        if m:
            cur = blocks[int(m.group(1))] = []
        elif cur is not None:
            cur.append(line)
    return ["\n".join(blocks[i]) + "\n" if i in blocks else None for i in range(n)]


def parse_probe(text: str) -> tuple[str, str]:
    """-> (verdict, detail): verdict is open | refused | timeout | unreachable."""
    m = re.search(r"^rc=(\d+)\s*$", text, re.M)
    if not m:
        raise ParseError("no rc= line")
    rc = int(m.group(1))
    low = text.lower()
    if rc == 0:
        return "open", "something already listens there"
    if rc == 124:
        return "timeout", f"no answer within {PROBE_TIMEOUT_S}s"
    if "refused" in low:
        return "refused", "connection refused (reachable, nothing listening yet)"
    for key in (
        "no route to host",
        "network is unreachable",
        "name or service not known",
        "invalid argument",
        "cannot assign requested address",
    ):
        if key in low:
            return "unreachable", key
    return "unreachable", text.strip().splitlines()[0] if text.strip() else f"exit {rc}"


def parse_clock(text: str) -> float:
    try:
        return float(text.strip().splitlines()[0])
    except (ValueError, IndexError):
        raise ParseError(f"not a timestamp: {text.strip()[:40]!r}") from None


@dataclass(frozen=True)
class ProbeFact:
    probe: Probe
    section: Section  # the probe's output, for the failure message
    verdict: str | None  # open | refused | timeout | unreachable; None: did not parse
    detail: str = ""


@dataclass(frozen=True)
class NetworkFacts:
    probes: tuple[ProbeFact, ...]
    clock: float | None  # the host's clock (epoch seconds) when the batch started
    clock_section: Section = MISSING
    clock_end: float | None = None  # ... and when it ended (None: older captures)


def parse(ctx: HostContext, s: Mapping[str, Section]) -> NetworkFacts:
    probes = []
    together = s.get(PROBES, MISSING)
    texts = split_probes(together.output, len(ctx.probes)) if together.rc is not None else []
    for i, p in enumerate(ctx.probes):
        text = texts[i] if i < len(texts) else None
        sec = Section(text, together.rc) if text is not None else s.get(f"probe{i}", MISSING)
        try:
            verdict, detail = parse_probe(sec.output)
        except ParseError:
            probes.append(ProbeFact(p, sec, None))
            continue
        probes.append(ProbeFact(p, sec, verdict, detail))
    clock_s = s.get("clock", MISSING)
    return NetworkFacts(
        tuple(probes), _clock(clock_s), clock_s, _clock(s.get("clock_end", MISSING))
    )


def _clock(sec: Section) -> float | None:
    if sec.rc != 0:
        return None
    with contextlib.suppress(ParseError):
        return parse_clock(sec.output)
    return None


Window = tuple[float, float]  # the host's clock minus ours lies between these (seconds)


def clock_window(f: NetworkFacts, sent: float, back: float) -> Window | None:
    """Where the host's offset from our clock lies, given when (our clock) the batch was sent
    and its output back: its first reading came after ``sent``, its last before ``back``."""
    if f.clock is None:
        return None
    last = f.clock_end if f.clock_end is not None and f.clock_end >= f.clock else f.clock
    return (last - back, f.clock - sent)


def evaluate(ctx: HostContext, facts: HostFacts) -> list[CheckResult]:
    f = facts.network
    if f is None:
        return []
    out = [_probe(ctx, pf) for pf in f.probes]
    if f.clock_section.rc == 0 and f.clock is None:
        out.append(
            CheckResult(
                "network.clock",
                "warn",
                f"could not read the clock: {f.clock_section.first_lines()}",
            )
        )
    return out


def _probe(ctx: HostContext, pf: ProbeFact) -> CheckResult:
    p = pf.probe
    if pf.verdict is None:
        return CheckResult(
            p.check_id,
            "fail",
            f"could not parse the probe of {p.address}:{p.port} ({p.what}): "
            f"{pf.section.first_lines()}",
            "check that bash and timeout exist on the host",
        )
    where = f"{ctx.name} -> {p.target} {p.address}:{p.port} ({p.what})"
    if pf.verdict in ("open", "refused"):
        return CheckResult(p.check_id, "pass", f"{where}: reachable, {pf.detail}")
    return CheckResult(
        p.check_id,
        "fail",
        f"{where}: {pf.detail}",
        f"open TCP {p.port} from {ctx.name} to {p.address} (firewall, routing); "
        + _NEEDS.get(p.check_id, "NIXL and the router need it"),
    )


_NEEDS = {
    "network.dp_rpc": "vLLM's data-parallel handshake needs it (and the head's other ports, "
    "chosen at start)",
    "network.seed": "the engine hosts fetch the weights from the first one over it "
    "(weights.seed: first_host); or set weights.seed: none to fetch each from the hub",
}


def evaluate_clocks(windows: Mapping[str, Window], max_skew: float) -> dict[str, CheckResult]:
    """Each host's clock against the median of all hosts (windows: clock_window's). Our own
    clock does not matter: only the hosts must agree. The median of the true offsets lies
    between the medians of the windows' ends, so a host fails only when its window is more
    than ``max_skew`` from there: however slow the round trips, in-sync hosts never fail."""
    if not windows:
        return {}
    ref = (
        statistics.median(lo for lo, _ in windows.values()),
        statistics.median(hi for _, hi in windows.values()),
    )
    return {name: _clock_verdict(w, ref, max_skew) for name, w in windows.items()}


def _clock_verdict(w: Window, ref: Window, max_skew: float) -> CheckResult:
    """The distance between the host's clock and the median lies in [nearest, farthest]."""
    nearest = max(0.0, w[0] - ref[1], ref[0] - w[1])
    farthest = max(abs(w[1] - ref[0]), abs(ref[1] - w[0]))
    about = (w[0] + w[1]) / 2 - (ref[0] + ref[1]) / 2
    side = "ahead of" if about > 0 else "behind"
    if nearest > max_skew:
        return CheckResult(
            "network.clock",
            "fail",
            f"clock at least {nearest:.1f} s {side} the other hosts (limit {max_skew:g} s)",
            "enable time sync (chrony or systemd-timesyncd) on every host",
        )
    if farthest <= max_skew:
        return CheckResult(
            "network.clock", "pass", f"clock within {farthest:.2f} s of the other hosts"
        )
    # the round trips were too slow to tell: judged by the best guess, never failed on it
    if abs(about) <= max_skew:
        return CheckResult(
            "network.clock",
            "pass",
            f"clock about {abs(about):.1f} s {side} the other hosts (somewhere between "
            f"{nearest:.1f} and {farthest:.1f} s: the batches' round trips were slow)",
        )
    return CheckResult(
        "network.clock",
        "warn",
        f"clock about {abs(about):.1f} s {side} the other hosts, limit {max_skew:g} s "
        f"(somewhere between {nearest:.1f} and {farthest:.1f} s: the batches' round trips "
        "were slow)",
        "run preflight again when the hosts are less busy; enable time sync on every host",
    )
