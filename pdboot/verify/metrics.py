"""P/D facts from one vLLM engine's ``/metrics`` text, and the verdicts drawn from them.

``EngineFacts`` is pdboot's one record of what an engine's metrics say: the KV proof of `up`,
the KV speed per pair, `status` and its flags all read it. Pure: text in, values out (parsed
by ``exposition``). Metric names are vLLM 0.33.0's, as prometheus_client exposes them
(the shared fixture ``vllm-0.33.0/metrics.json``): counters end in ``_total``, histograms
come as ``_bucket{le=...}`` / ``_count`` / ``_sum``; every sample carries ``model_name`` and
``engine`` labels (one scrape may hold several engines: data-parallel ranks).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from pdboot.verify.exposition import Histogram, Sample, histogram, histogram_sum, parse_exposition

XFER_TIME = "vllm:nixl_xfer_time_seconds"
XFER_BYTES = "vllm:nixl_bytes_transferred"
FAILED_XFERS = "vllm:nixl_num_failed_transfers_total"
EXPIRED_LEASES = "vllm:nixl_num_kv_expired_reqs_total"
REQUEST_SUCCESS = "vllm:request_success_total"
PROMPT_BY_SOURCE = "vllm:prompt_tokens_by_source_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
TTFT = "vllm:time_to_first_token_seconds"
ITL = "vllm:inter_token_latency_seconds"
QUANTILES = (0.5, 0.9, 0.99)
# An engine that exports none of these cannot confirm or refute a KV pull.
KV_EVIDENCE = (f"{XFER_TIME}_count", f"{XFER_BYTES}_sum", FAILED_XFERS, PROMPT_BY_SOURCE)


@dataclass(frozen=True)
class EngineFacts:
    """What one engine (one ``engine`` label value) says about its P/D work."""

    engine: str = "0"
    model_name: str = ""
    kv_transfers: float = 0.0
    kv_bytes: float = 0.0
    kv_seconds: float = 0.0
    failed_transfers: float = 0.0
    expired_leases: float = 0.0
    requests: float = 0.0
    generation_tokens: float = 0.0
    prompt_tokens_by_source: dict[str, float] = field(default_factory=dict)
    ttft: Histogram = field(default_factory=Histogram)
    itl: Histogram = field(default_factory=Histogram)
    known: bool = False  # it exports the KV evidence (KV_EVIDENCE) at all

    def __sub__(self, before: EngineFacts) -> EngineFacts:
        """What happened between two scrapes (``after - before``)."""
        src = {
            k: v - before.prompt_tokens_by_source.get(k, 0.0)
            for k, v in self.prompt_tokens_by_source.items()
        }
        return EngineFacts(
            self.engine,
            self.model_name,
            self.kv_transfers - before.kv_transfers,
            self.kv_bytes - before.kv_bytes,
            self.kv_seconds - before.kv_seconds,
            self.failed_transfers - before.failed_transfers,
            self.expired_leases - before.expired_leases,
            self.requests - before.requests,
            self.generation_tokens - before.generation_tokens,
            src,
            self.ttft - before.ttft,
            self.itl - before.itl,
            self.known and before.known,
        )

    @property
    def local_compute_tokens(self) -> float:
        return self.prompt_tokens_by_source.get("local_compute", 0.0)

    @property
    def external_tokens(self) -> float:
        return self.prompt_tokens_by_source.get("external_kv_transfer", 0.0)

    @property
    def cached_tokens(self) -> float:
        return self.prompt_tokens_by_source.get("local_cache_hit", 0.0)

    def percentiles(self, which: str) -> dict[str, float | None]:
        """``{"p50": s, "p90": s, "p99": s}`` of "ttft" or "itl" (None: no observation)."""
        h = self.ttft if which == "ttft" else self.itl
        return {f"p{round(q * 100)}": h.quantile(q) for q in QUANTILES}


def _facts(engine: str, samples: list[Sample]) -> EngineFacts:
    def total(name: str) -> float:
        return sum(s.value for s in samples if s.name == name)

    by_source: dict[str, float] = {}
    for s in samples:
        if s.name == PROMPT_BY_SOURCE and "source" in s.labels:
            by_source[s.labels["source"]] = by_source.get(s.labels["source"], 0.0) + s.value
    model = next((s.labels["model_name"] for s in samples if "model_name" in s.labels), "")
    return EngineFacts(
        engine,
        model,
        total(f"{XFER_TIME}_count"),
        total(f"{XFER_BYTES}_sum"),
        total(f"{XFER_TIME}_sum"),
        total(FAILED_XFERS),
        total(EXPIRED_LEASES),
        total(REQUEST_SUCCESS),
        total(GENERATION_TOKENS),
        by_source,
        histogram(samples, TTFT),
        histogram(samples, ITL),
        any(s.name in KV_EVIDENCE for s in samples),
    )


def engine_facts(text: str) -> dict[str, EngineFacts]:
    """``/metrics`` text -> facts per ``engine`` label (samples without one count as "0")."""
    groups: dict[str, list[Sample]] = {}
    for s in parse_exposition(text):
        if s.name.startswith("vllm:"):
            groups.setdefault(s.labels.get("engine", "0"), []).append(s)
    return {eng: _facts(eng, samples) for eng, samples in sorted(groups.items())}


def merged(facts: Mapping[str, EngineFacts]) -> EngineFacts:
    """All engines of one server summed, as one (what a status line per container shows)."""
    return total(facts.values())


def total(facts: Iterable[EngineFacts]) -> EngineFacts:
    """Engines summed (a tier's decode engines, one server's ranks); ``known`` if any is."""
    out = EngineFacts()
    for f in facts:
        out = _add(out, f)
    return out


def server_facts(text: str) -> EngineFacts:
    """One server's ``/metrics`` text, every engine (data-parallel rank) in it summed."""
    return merged(engine_facts(text))


def _add(a: EngineFacts, b: EngineFacts) -> EngineFacts:
    src = dict(a.prompt_tokens_by_source)
    for k, v in b.prompt_tokens_by_source.items():
        src[k] = src.get(k, 0.0) + v
    return EngineFacts(
        b.engine if not a.model_name else a.engine,
        a.model_name or b.model_name,
        a.kv_transfers + b.kv_transfers,
        a.kv_bytes + b.kv_bytes,
        a.kv_seconds + b.kv_seconds,
        a.failed_transfers + b.failed_transfers,
        a.expired_leases + b.expired_leases,
        a.requests + b.requests,
        a.generation_tokens + b.generation_tokens,
        src,
        histogram_sum(a.ttft, b.ttft),
        histogram_sum(a.itl, b.itl),
        a.known or b.known,
    )


# ---------------------------------------------------------------- verdicts
# A decode prefilling locally computes its whole prompt; one fed by NIXL computes only the tail
# the prefill did not hand over (vLLM recomputes at most the last partial block). More than half
# of the prompt tokens computed locally, over at least one request, is therefore a recompute.
RECOMPUTE_SHARE = 0.5
# Below this many bytes a transfer time is dominated by setup (handshake, descriptor posting):
# a throughput from it says nothing about the link.
MIN_BYTES_TO_JUDGE = 10e6
# Under this share of the link rate the transfer is not using RDMA: UCX over TCP typically
# gets 1-10 % of an RDMA port's rate, RDMA 50-90 %.
TCP_FALLBACK_SHARE = 0.25

TCP_CAUSES = (
    "UCX_TLS without an RDMA transport (rc/ud/dc) or without cuda_copy/cuda_ipc",
    "no /dev/infiniband in the container (devices: [/dev/infiniband], cap_add: [IPC_LOCK])",
    "the memlock limit (Docker's default 8 MB; set ulimits memlock: -1) makes registration fail",
    "UCX_NET_DEVICES names a device/port that is not the RDMA NIC (or one that is DOWN)",
    "no GPUDirect RDMA (nvidia-peermem / dmabuf missing): KV is staged through host memory",
)


@dataclass(frozen=True)
class Flag:
    """One status flag: ``level`` is "fail" or "warn"; ``code`` stable for --json."""

    code: str
    level: str
    message: str


def decode_recomputes(name: str, delta: EngineFacts) -> Flag | None:
    """A decode whose prompt tokens were mostly computed locally between two scrapes."""
    local, ext = delta.local_compute_tokens, delta.external_tokens
    if delta.requests <= 0 or local <= 0 or local < RECOMPUTE_SHARE * (local + ext):
        return None
    return Flag(
        "decode_recomputes",
        "fail",
        f"decode {name} computed {local:.0f} of {local + ext:.0f} prompt tokens "
        "locally: it is recomputing prefills instead of pulling KV (requests sent "
        "straight to it, or failed pulls with kv_load_failure_policy=recompute)",
    )


def idle_prefill_pool(
    prefills: Mapping[str, EngineFacts], decodes: Mapping[str, EngineFacts]
) -> Flag | None:
    """Deltas per engine name: decode served requests while no prefill received any."""
    served = sum(d.requests for d in decodes.values())
    if not prefills or served <= 0 or any(p.requests > 0 for p in prefills.values()):
        return None
    return Flag(
        "prefill_idle",
        "fail",
        f"decode engines served {served:.0f} requests while the prefill pool "
        f"({', '.join(sorted(prefills))}) received none: traffic bypasses P/D "
        "(clients hit decode directly, or the router runs without --pd-disaggregation)",
    )


def failing_transfers(name: str, delta: EngineFacts) -> Flag | None:
    if delta.failed_transfers <= 0:
        return None
    return Flag(
        "kv_transfer_failed",
        "fail",
        f"decode {name}: {delta.failed_transfers:.0f} failed NIXL transfers "
        f"(of {delta.failed_transfers + delta.kv_transfers:.0f}); `pdboot logs` shows "
        "the handshake/transfer errors",
    )


def expired_leases(name: str, delta: EngineFacts) -> Flag | None:
    if delta.expired_leases <= 0:
        return None
    return Flag(
        "kv_lease_expired",
        "warn",
        f"prefill {name}: {delta.expired_leases:.0f} requests' KV expired before any "
        "decode pulled it (decode unreachable, crashed, or slower than "
        "kv_lease_duration)",
    )


@dataclass(frozen=True)
class PairSpeed:
    """KV throughput measured on the decode of one prefill->decode pair."""

    prefill: str
    decode: str
    nbytes: float
    seconds: float

    @property
    def gbps(self) -> float | None:
        if self.seconds <= 0 or self.nbytes <= 0:
            return None
        return self.nbytes * 8 / self.seconds / 1e9


def pair_speed(prefill: str, decode: str, delta: EngineFacts) -> PairSpeed:
    """From the decode's delta over a window in which it pulled only from ``prefill``
    (the metrics carry no peer label: pdboot drives one pair at a time)."""
    return PairSpeed(prefill, decode, delta.kv_bytes, delta.kv_seconds)


@dataclass(frozen=True)
class SpeedVerdict:
    """``flag`` None when the path looks right; ``line`` the measured-vs-link sentence."""

    line: str
    flag: Flag | None
    judged: bool = True  # False: too few bytes moved to say anything about the path


def speed_verdict(
    speed: PairSpeed,
    link_gbps: float | None,
    *,
    same_host: bool = False,
    rdma: bool = True,
    connector: str = "NixlConnector",
    device: str = "cuda",
) -> SpeedVerdict:
    """Measured KV throughput of a pair next to what its link should give.

    ``link_gbps``: the RDMA port's rate from preflight, else the inventory's ``link_gbps``.
    ``device`` cpu without RDMA: KV moves over UCX/TCP by design, so a low share is judged
    as a slow TCP path (cpu_tcp_flag), never as a fallback from RDMA.
    """
    pair = f"{speed.prefill} -> {speed.decode}"
    gbps = speed.gbps
    if gbps is None or speed.nbytes < MIN_BYTES_TO_JUDGE:
        return SpeedVerdict(
            f"{pair}: {speed.nbytes / 1e6:.1f} MB moved: too little to judge "
            f"the KV path (send a longer prompt, >= "
            f"{MIN_BYTES_TO_JUDGE / 1e6:.0f} MB of KV)",
            None,
            judged=False,
        )
    line = f"{pair}: {speed.nbytes / 1e6:.1f} MB in {speed.seconds:.3f} s = {gbps:.2f} Gbit/s"
    if same_host and not rdma:
        return SpeedVerdict(line + " (same host, no RDMA)", _same_host_flag(pair, connector))
    if link_gbps is None:
        return SpeedVerdict(line + " (no link rate known: set link_gbps to compare)", None)
    line += f" of a {link_gbps:g} Gbit/s link ({gbps / link_gbps:.0%})"
    if device == "cpu" and not rdma:
        line += " over UCX/TCP"
        return SpeedVerdict(
            line,
            None if gbps >= CPU_TCP_SHARE * link_gbps else _cpu_tcp_flag(pair, gbps / link_gbps),
        )
    if gbps >= TCP_FALLBACK_SHARE * link_gbps:
        return SpeedVerdict(line, None)
    return SpeedVerdict(
        line,
        Flag(
            "kv_tcp_fallback",
            "warn",
            f"{pair}: KV moves at {gbps / link_gbps:.0%} of the link: this looks like UCX falling "
            "back to TCP. Usual causes: " + "; ".join(TCP_CAUSES),
        ),
    )


# device: cpu: under this share of the link, UCX over TCP is slower than a TCP link allows
# (vLLM copies KV blocks on the CPU; a single TCP stream fills a few Gbit/s at most).
CPU_TCP_SHARE = 0.05
CPU_TCP_CAUSES = (
    "NIXL's progress thread busy-polling the engines' cores (nixl-cu12 1.5.1 sets its delay "
    "to 0: ../shared/docs/real-vllm-cpu.md problem 2)",
    "the engines' threads and NIXL's pinned core shared with other engines on the host",
    "UCX_NET_DEVICES not the interface link_gbps describes",
)


def _cpu_tcp_flag(pair: str, share: float) -> Flag:
    return Flag(
        "kv_cpu_tcp_slow",
        "warn",
        f"{pair}: KV moves at {share:.0%} of the link over UCX/TCP (device: cpu). Usual "
        "causes: " + "; ".join(CPU_TCP_CAUSES),
    )


def _same_host_flag(pair: str, connector: str) -> Flag | None:
    if connector == "NixlPushConnector":
        return None
    return Flag(
        "kv_pull_same_host",
        "warn",
        f"{pair}: prefill and decode share a host without RDMA and use {connector} (pull): "
        "users report pull mode far slower than NixlPushConnector on such hosts "
        "(vllm-project/vllm#52607); consider kv_connector: NixlPushConnector on both tiers",
    )


# A tier whose busiest engine took this share of at least 2 requests per engine is "pinned".
PINNED_SHARE = 0.9


@dataclass(frozen=True)
class Spread:
    tier: str
    requests: dict[str, float]

    @property
    def total(self) -> float:
        return sum(self.requests.values())

    def line(self) -> str:
        parts = ", ".join(f"{name} {n:.0f}" for name, n in self.requests.items())
        return f"{self.tier} requests: {parts}"

    def flag(self) -> Flag | None:
        """Most requests on one engine of several (cache_aware's tie-break and affinity,
        docs/routing.md)."""
        n = len(self.requests)
        if n < 2 or self.total < 2 * n:
            return None
        name, top = max(self.requests.items(), key=lambda kv: kv[1])
        if top < PINNED_SHARE * self.total:
            return None
        return Flag(
            "tier_pinned",
            "warn",
            f"{self.tier}: {name} took {top:.0f} of {self.total:.0f} requests; the "
            f"router's {self.tier}_policy sends everything to one engine (cache_aware "
            "at low concurrency or with a shared prompt prefix: see docs/routing.md)",
        )


def spread(tier: str, deltas: Mapping[str, EngineFacts]) -> Spread:
    """Requests per engine of one tier between two scrapes, in the given order."""
    return Spread(tier, {name: f.requests for name, f in deltas.items()})
