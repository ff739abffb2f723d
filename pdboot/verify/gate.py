"""The correctness gate: the same greedy request through the router (P/D) and straight to one
decode engine (which then prefills locally) must give the same answer.

Pure: the request body, the parsing of the answer, the classification.

How a broken KV path is told from numerics (the documented rule):

- In P/D the prefill engine samples the first token; every later token is sampled by the decode
  engine attending to the KV it pulled. KV that arrived corrupted (a broken GPUDirect path
  writing wrong bytes, a layout mismatch) spoils the context of every later token: the answers
  part within the first few tokens and never agree again (dynamo#12463, vllm#52617).
- Greedy decoding on two paths is not bit-identical in vLLM: different batch shapes, kernels
  and KV layouts change rounding, and a near-tie between two top logits can flip after many
  tokens. The answers then agree on a long prefix and part late.
- So: identical -> pass. A common prefix of at least ``LATE_AFTER`` pieces (whitespace-led
  words, as the text API gives no token ids) -> "late divergence", a WARNING with both
  outputs (``up`` goes on). Less than that, or an empty answer -> "broken", a FAILURE.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

GATE_PROMPT = (
    "The following is a plain list of the planets of the solar system, in order from the sun, "
    "each with one fact about it. Mercury is the smallest planet and the closest to the sun."
)
GATE_MAX_TOKENS = 48
GATE_SEED = 1234
LATE_AFTER = 8

_PIECE = re.compile(r"\s*\S+|\s+$")

MEANING_BROKEN = (
    "the decode engine produced different tokens from the KV it pulled than from KV it "
    "computed itself: the KV path delivers wrong data while answering HTTP 200. Usual causes: "
    "a broken GPUDirect RDMA path (nvidia-peermem/dmabuf, IOMMU/ACS on the PCIe path; "
    "ai-dynamo/dynamo#12463), prefill and decode disagreeing on KV layout (tensor-parallel "
    "size, block size, kv-cache dtype, attention backend; vllm-project/vllm#52617). Do not "
    "serve traffic through this deployment."
)
# device: cpu: no GPUDirect path; KV moves through CPU memory over UCX/TCP.
MEANING_BROKEN_CPU = (
    "the decode engine produced different tokens from the KV it pulled than from KV it "
    "computed itself: the KV path delivers wrong data while answering HTTP 200. Usual causes "
    "on CPU engines: prefill and decode disagreeing on KV layout (tensor-parallel size, block "
    "size, --dtype, kv-cache dtype; vllm-project/vllm#52617). Do not serve traffic through "
    "this deployment."
)
MEANING_LATE = (
    "the answers agree on a long prefix and part late: usually numerics (different batch "
    "shapes and kernels on the two paths flip a near-tie between tokens), not a broken KV "
    "path. Re-run the gate; if the common prefix shrinks or varies, suspect the KV path."
)


def gate_request(model: str) -> dict[str, Any]:
    """The body of the greedy request sent both ways (``POST /v1/completions``)."""
    return {
        "model": model,
        "prompt": GATE_PROMPT,
        "max_tokens": GATE_MAX_TOKENS,
        "temperature": 0,
        "top_p": 1,
        "seed": GATE_SEED,
        "stream": False,
    }


def answer_text(body: str) -> str | None:
    """The generated text of an OpenAI completion (or chat) response; None if not one."""
    try:
        data = json.loads(body)
        choice = data["choices"][0]
    except (ValueError, KeyError, IndexError, TypeError):
        return None
    if not isinstance(choice, dict):
        return None
    text = choice.get("text")
    if text is None and isinstance(choice.get("message"), dict):
        text = choice["message"].get("content")
    return text if isinstance(text, str) else None


def pieces(text: str) -> list[str]:
    """Whitespace-led words: a stand-in for tokens that both answers split the same way."""
    return _PIECE.findall(text)


@dataclass(frozen=True)
class GateOutcome:
    verdict: str  # "identical" | "late_divergence" | "broken"
    level: str  # "ok" | "warn" | "fail"
    common: int  # pieces both answers share from the start
    pd_text: str
    direct_text: str
    device: str = "cuda"  # the deployment's: the causes named for a broken answer differ

    @property
    def ok(self) -> bool:
        return self.level != "fail"

    def message(self) -> str:
        if self.verdict == "identical":
            return (
                f"correctness gate: the P/D answer equals the single-engine answer "
                f"({len(pieces(self.pd_text))} words)"
            )
        if self.verdict == "late_divergence":
            what = "diverges late"
        elif not self.pd_text.strip() or not self.direct_text.strip():
            what = "cannot be compared: an answer is empty"
        else:
            what = f"differs within the first {LATE_AFTER} words"
        broken = MEANING_BROKEN_CPU if self.device == "cpu" else MEANING_BROKEN
        meaning = MEANING_LATE if self.verdict == "late_divergence" else broken
        return (
            f"correctness gate: the P/D answer {what} (common prefix {self.common} "
            f"words)\n  through the router: {self.pd_text!r}\n"
            f"  decode alone:      {self.direct_text!r}\n  {meaning}"
        )


def _common_prefix(a: list[str], b: list[str]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def classify(pd_text: str | None, direct_text: str | None) -> GateOutcome:
    """Compare the answer through the router with the one straight from a decode engine."""
    pd, direct = pd_text or "", direct_text or ""
    if not pd.strip() or not direct.strip():
        return GateOutcome("broken", "fail", 0, pd, direct)
    if pd == direct:
        return GateOutcome("identical", "ok", len(pieces(pd)), pd, direct)
    common = _common_prefix(pieces(pd), pieces(direct))
    if common >= LATE_AFTER:
        return GateOutcome("late_divergence", "warn", common, pd, direct)
    return GateOutcome("broken", "fail", common, pd, direct)


# (url, JSON body) -> (HTTP status, response text); the caller's HTTP client
Post = Callable[[str, dict[str, Any]], tuple[int, str]]


def run_gate(post: Post, router_url: str, decode_url: str, model: str) -> GateOutcome:
    """Send the gate request through the router and straight to one decode engine (no
    ``kv_transfer_params``: it prefills locally) and classify. An HTTP error on either path
    is a failure with the error text in place of the answer."""
    body = gate_request(model)
    texts: list[str] = []
    for base in (router_url, decode_url):
        status, raw = post(f"{base.rstrip('/')}/v1/completions", body)
        text = answer_text(raw) if status == 200 else None
        texts.append(text if text is not None else "")
        if text is None:
            return GateOutcome("broken", "fail", 0, *_error_texts(base == router_url, status, raw))
    return classify(texts[0], texts[1])


def _error_texts(through_router: bool, status: int, raw: str) -> tuple[str, str]:
    err = f"<HTTP {status}: {raw.strip()[:200]}>"
    return (err, "") if through_router else ("", err)
