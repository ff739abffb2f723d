"""Preflight checks: commands, pure parsers over their text, pure verdicts.

Every check of a host runs in ONE shell script (``batch_script``) that prints, for each
command, ``### $ COMMAND``, the command's output (stdout and stderr together) and
``### exit=N`` -- the same layout as the real captures under tests/unit/fixtures/, so a
parser is tested on exactly the text it will see. ``parse_sections`` splits it again.

Each area module (gpu, docker, rdma, host, network, model) offers
``commands(ctx) -> list[Command]``, ``parse(ctx, sections) -> <Area>Facts | None`` (typed
facts, kept on the host's report; see facts.HostFacts) and
``evaluate(ctx, facts: HostFacts) -> list[CheckResult]``, which judges from facts only.
A parser never raises on odd text: the facts record what did not parse, and the check
says "could not parse" and shows the first lines.
"""

from __future__ import annotations

import re
import secrets
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from pdboot.inventory.schema import Requirements, Tier, TierName
from pdboot.plan.weights.hub import WeightsAsk
from pdboot.preflight.registry import Lookup

if TYPE_CHECKING:
    from pdboot.preflight.checks.owners import Fate

Status = Literal["pass", "warn", "fail", "skip"]
STATUS_ORDER: dict[str, int] = {"fail": 0, "warn": 1, "pass": 2, "skip": 3}
AREAS = ("ssh", "gpu", "cpu", "docker", "rdma", "host", "network", "model", "weights", "secrets")

# A hung nvidia-smi (a GPU fallen off the bus) must not hold the whole batch.
SECTION_TIMEOUT_S = 20


@dataclass(frozen=True)
class CheckResult:
    id: str  # "<area>.<name>", e.g. gpu.driver
    status: Status
    message: str
    fix: str = ""

    @property
    def area(self) -> str:
        return self.id.split(".", 1)[0]

    def as_dict(self) -> dict[str, str]:
        return {"id": self.id, "status": self.status, "message": self.message, "fix": self.fix}


@dataclass(frozen=True)
class Command:
    key: str  # stable name the evaluators look sections up by
    line: str  # shell text run on the host
    area: str
    also_for: tuple[str, ...] = ()  # other areas whose verdicts read this output
    # not run: a command older batches ran, kept so that recorded output still parses
    recorded_only: bool = False
    # start / end: alone, before / after all the others (a clock read there bounds the
    # batch's run on the host; read among thirty starting processes it could be seconds late).
    # Those run without a timeout: only commands that cannot hang (reading a clock).
    at: Literal["start", "together", "end"] = "together"


@dataclass(frozen=True)
class Section:
    output: str
    rc: int | None  # None: the script never reached the end of this command

    def first_lines(self, n: int = 3) -> str:
        lines = [ln.rstrip() for ln in self.output.strip().splitlines()][:n]
        return " | ".join(lines) if lines else "(no output)"


MISSING = Section("", None)


@dataclass(frozen=True)
class GpuNeed:
    tier: str  # prefill / decode
    tensor_parallel_size: int
    gpus: Literal["all"] | tuple[int, ...]
    engine: str = ""  # the engine's name (prefill-2) when the tier has several per host
    # a data-parallel tier: its total ranks, and whether experts are sharded over them
    dp_size: int = 1
    expert_parallel: bool = False


@dataclass(frozen=True)
class CpuNeed:
    """A device: cpu engine on this host: its cores (None: vLLM binds) and dtype."""

    engine: str  # prefill@cpu-a
    cores: tuple[int, ...] | None
    tensor_parallel_size: int = 1
    dtype: str = "float32"


@dataclass(frozen=True)
class Probe:
    """A TCP reachability test run from this host (the NIXL side channel, an engine port)."""

    check_id: str  # network.side_channel / network.ingress
    target: str  # inventory host name
    address: str
    port: int
    what: str


@dataclass(frozen=True)
class VrrpAsk:
    """An ingress host with router.virtual_ip (checks/vrrp.py)."""

    virtual_ip: str  # ADDRESS/PREFIX
    interface: str | None  # named in the inventory; None: the one carrying ``address``
    router_id: int
    address: str  # this host's
    peer: str  # the other ingress host's


@dataclass(frozen=True)
class HostContext:
    """Everything the checks of one host need to know from the inventory (plain values)."""

    name: str
    roles: tuple[str, ...]  # prefill / decode / router
    req: Requirements
    gpu_needs: tuple[GpuNeed, ...] = ()
    ports: tuple[tuple[int, str], ...] = ()  # every port pdboot binds here, with what
    shm_size_bytes: int = 16 << 30
    memlock: int = -1
    nofile: int = 1048576
    hf_cache: str = "/var/lib/pdboot/hf-cache"
    image: str = ""
    model: str = ""
    rdma_mode: str = "auto"  # auto / on / off
    rdma_devices: tuple[str, ...] = ()
    ucx_net_devices: str | None = None
    probes: tuple[Probe, ...] = ()
    # the tiers with engines here, for the per-engine checks (GPU groups, nearest NIC)
    tiers: tuple[tuple[TierName, Tier], ...] = ()
    image_size_bytes: int = 20 << 30  # a vLLM CUDA image unpacks to roughly 20 GB
    image_lookup: Lookup | None = None  # the image's config from its registry (preflight)
    peers: tuple[str, ...] = ()  # the other tier's engine hosts' addresses (network.ucx_iface)
    weights: WeightsAsk | None = None  # the model's files (checks/weights.py)
    device: str = "cuda"  # the inventory's: cuda, or cpu
    cpu_engines: tuple[CpuNeed, ...] = ()  # device: cpu: the engines here
    cpu_kv_gib: int = 0  # device: cpu: each engine's KV cache
    ucx_tls: str | None = None  # kv_transfer.ucx.tls
    # this deployment's name: its containers' ports and GPU memory are not "taken" (owners)
    deployment: str = ""
    # what `up` does with each of them, once every host answered (owners.fates)
    fates: tuple[Fate, ...] = ()
    vrrp: VrrpAsk | None = None  # an ingress host with router.virtual_ip
    address: str = ""  # the inventory's (advertise_address for `local`): the management NIC's

    @property
    def gpu_host(self) -> bool:
        """Runs engines (GPU ones, or CPU ones for device: cpu)."""
        return "prefill" in self.roles or "decode" in self.roles

    @property
    def gpus_here(self) -> bool:
        """Runs engines on GPUs: the GPU, topology and GPUDirect checks apply."""
        return self.gpu_host and self.device != "cpu"

    @property
    def cpu_host(self) -> bool:
        """Runs device: cpu engines: the cpu checks apply."""
        return self.gpu_host and self.device == "cpu"

    @property
    def rdma_required(self) -> bool:
        return self.req.rdma == "required" or self.rdma_mode == "on"


# --------------------------------------------------------------------------- the batch


# A command's output is not trusted to stay inside its section: a model's config.json may
# well contain a line "### $ nvidia-smi ...". So the script's markers carry a random token,
# fresh for every run and announced in a first line "### pdboot-sections TOKEN" printed
# before any command output; parse_sections then honours only markers with that token
# ("### TOKEN $ COMMAND", "### TOKEN exit=N"). Text without that first line (the captures
# under tests/unit/fixtures/) is read in the plain layout.
HEADER = "### pdboot-sections "


def new_token() -> str:
    return secrets.token_hex(12)


def batch_script(
    commands: Iterable[Command], timeout_s: int = SECTION_TIMEOUT_S, token: str | None = None
) -> str:
    """One script printing every command's output between markers (see module doc).

    The commands run concurrently (each into its own file), then are printed in order:
    a host costs its slowest command, not the sum -- which matters for reachability probes
    that wait for a timeout and for nvidia-smi on hosts without persistence mode. Commands
    ``at`` start / end run alone, before / after the others.
    ``token``: the markers' token; a fresh random one when None (tests pass their own).
    """
    cmds = list(commands)
    tok = token or new_token()
    if not re.fullmatch(r"[0-9A-Za-z]+", tok):
        raise ValueError("a section token is letters and digits only")
    parts = [
        "export LC_ALL=C LANG=C",
        'd=$(mktemp -d "${TMPDIR:-/tmp}/pdboot-preflight.XXXXXX") || exit 1',
        "trap 'rm -rf \"$d\"' EXIT",
    ]
    for at in ("start", "together", "end"):
        for i, c in enumerate(cmds):
            if c.at != at:
                continue
            files = f'</dev/null >"$d/{i}" 2>&1; echo $? >"$d/{i}.rc"'
            if at == "together":
                # Each in its own bash, under timeout: a hang or an `exit` stays local.
                line = f"timeout -k 2 {timeout_s} bash -c {shlex.quote(c.line)}"
                parts.append(f"{{ {line} {files}; }} &")
            else:  # a subshell, no exec: ~1 ms where timeout + bash cost ~3 on the clock path
                parts.append(f"( eval {shlex.quote(c.line)} ) {files}")
        if at == "together":
            parts.append("wait")
    # The report is written into one file, then sent with one cat: written piece by piece
    # (three writes a command), sshd sent it as ~50 small packets a host, each decrypted
    # and MAC-checked in Python by paramiko (at 32 hosts ~0.2 s of pdboot's CPU).
    parts.append("{")
    parts.append(f"printf '%s\\n' {shlex.quote(HEADER + tok)}")
    for i, c in enumerate(cmds):
        parts.append(
            f"printf '%s\\n' {shlex.quote(f'### {tok} $ ' + c.line)}; cat \"$d/{i}\"; "
            f'echo "### {tok} exit=$(cat "$d/{i}.rc")"'
        )
    parts.append('} >"$d/report"')
    parts.append('cat "$d/report"')
    return "\n".join(parts) + "\n"


def _markers(text: str) -> tuple[str, re.Pattern[str]]:
    """(start prefix, exit pattern) of this text: the token's if the text announces one."""
    first = next((ln for ln in text.splitlines() if ln.startswith("### ")), "")
    tok = first[len(HEADER) :].strip() if first.startswith(HEADER) else ""
    if tok and re.fullmatch(r"[0-9A-Za-z]+", tok):
        # At the end of a line: output without a final newline runs into the marker.
        return f"### {tok} $ ", re.compile(rf"^(.*)### {tok} exit=(\d+)\s*$")
    return "### $ ", re.compile(r"^(.*)### exit=(\d+)\s*$")


def parse_sections(text: str) -> dict[str, Section]:
    """``### $ CMD`` / output / ``### exit=N`` blocks -> {CMD: Section}. Lenient: a block
    cut off before its exit line gets rc None; text outside blocks is ignored. With a
    token header, only markers carrying the token count (see module doc)."""
    start, exit_re = _markers(text)
    out: dict[str, Section] = {}
    cmd: str | None = None
    buf: list[str] = []
    for line in text.splitlines():
        if line.startswith(start):
            if cmd is not None:
                out[cmd] = Section("\n".join(buf), None)
            cmd, buf = line[len(start) :].rstrip(), []
            continue
        m = exit_re.match(line)
        if m and cmd is not None:
            if m.group(1):
                buf.append(m.group(1))
            out[cmd] = Section("\n".join(buf) + ("\n" if buf else ""), int(m.group(2)))
            cmd, buf = None, []
            continue
        if cmd is not None:
            buf.append(line)
    if cmd is not None:
        out[cmd] = Section("\n".join(buf), None)
    return out


def by_key(commands: Iterable[Command], sections: Mapping[str, Section]) -> dict[str, Section]:
    return {c.key: sections.get(c.line, MISSING) for c in commands}


# --------------------------------------------------------------------------- helpers


class ParseError(ValueError):
    """Raised by parsers on text they do not understand; turned into a 'could not parse'."""


def unparsed(check_id: str, section: Section, what: str = "") -> CheckResult:
    return CheckResult(
        check_id,
        "fail",
        f"could not parse {what or 'the output'} (exit {section.rc}): {section.first_lines()}",
        "run the command on the host by hand and check the tool works",
    )


def version_tuple(v: str) -> tuple[int, ...]:
    """'580.65.06' -> (580, 65, 6). Raises ParseError on anything else."""
    parts = v.strip().split(".")
    if not parts or not all(p.isdigit() for p in parts):
        raise ParseError(f"not a version: {v!r}")
    return tuple(int(p) for p in parts)


def na(value: str) -> bool:
    """nvidia-smi's ways of saying 'no value'."""
    return value.strip().strip("[]").lower() in ("n/a", "not supported", "unknown error", "")


_SIZE_RE = re.compile(r"^(\d+(?:\.\d+)?)([bkmgt]?)$")


def size_bytes(text: str) -> int:
    """'16g' -> bytes, as docker reads shm_size (binary units)."""
    m = _SIZE_RE.match(text.strip().lower())
    if not m:
        raise ParseError(f"not a size: {text!r}")
    mult = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m.group(2)]
    return int(float(m.group(1)) * mult)


def human_bytes(n: float) -> str:
    """Binary units, like every size preflight prints (see ``gib``)."""
    for unit, div in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= div:
            return f"{n / div:.1f} {unit}"
    return f"{n:.0f} B"


def gib(n: float) -> str:
    """Preflight's one unit for sizes: GiB. What it compares is binary -- nvidia-smi's MiB,
    df's KiB, docker's shm_size ("16g"), cpu.kv_cache_gib -- so one unit and no rounding
    surprise; only requirements.min_free_disk_gb is decimal, and its message names it."""
    return f"{n / (1 << 30):.1f} GiB"
