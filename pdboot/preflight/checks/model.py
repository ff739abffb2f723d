"""Model checks, when the model's config.json is readable on the host (in the HF cache or
at a local path): do the weights fit the tier's GPUs, and how many bytes of KV cache
each prompt moves from prefill to decode (shown as information)."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pdboot.preflight.checks import (
    CheckResult,
    Command,
    GpuNeed,
    HostContext,
    ParseError,
    Section,
    gib,
    human_bytes,
    topo,
)
from pdboot.preflight.checks.gpu import Gpu

if TYPE_CHECKING:
    from pdboot.preflight.checks.facts import HostFacts

DTYPE_BYTES = {
    "float32": 4,
    "float": 4,
    "bfloat16": 2,
    "float16": 2,
    "half": 2,
    "fp8": 1,
    "float8_e4m3fn": 1,
    "int8": 1,
}
PROMPT_TOKENS = 10_000


def config_command(model: str, hf_cache: str) -> str:
    """Print the config.json path and content, then the weights' size in bytes."""
    hub = f"{hf_cache.rstrip('/')}/hub/models--{model.replace('/', '--')}"
    return (
        f"m={shlex.quote(model)}; hub={shlex.quote(hub)}; "
        'if [ -f "$m/config.json" ]; then f="$m/config.json"; '
        'else f=$(ls -1t "$hub"/snapshots/*/config.json 2>/dev/null | head -n1); fi; '
        '[ -n "$f" ] || { echo "no config.json"; exit 3; }; '
        'echo "config=$f"; cat "$f"; echo; d=$(dirname "$f"); '
        'echo "weights_bytes=$(cat "$d"/*.safetensors 2>/dev/null | wc -c)"'
    )


def commands(ctx: HostContext) -> list[Command]:
    if not ctx.gpu_host or not ctx.model:
        return []
    return [Command("config", config_command(ctx.model, ctx.hf_cache), "model")]


@dataclass(frozen=True)
class ModelFacts:
    path: str
    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int
    params: int  # estimated from the config
    weights_bytes: int  # measured on disk, or params x dtype bytes
    # MoE: routed experts per layer (0: dense; -1: MoE by its config's keys, count unknown)
    # and the share of the weights that are routed experts (what expert parallelism shards)
    experts: int = 0
    expert_fraction: float = 0.0

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes


def estimate_params(c: Mapping[str, Any]) -> int:
    """Dense decoder estimate: attention + gated MLP per layer, plus the embeddings."""
    h = int(c["hidden_size"])
    layers = int(c["num_hidden_layers"])
    heads = int(c["num_attention_heads"])
    kv = int(c.get("num_key_value_heads") or heads)
    hd = int(c.get("head_dim") or h // heads)
    inter = int(c.get("intermediate_size") or 4 * h)
    vocab = int(c.get("vocab_size") or 0)
    attn = h * heads * hd * 2 + h * kv * hd * 2
    mlp = 3 * h * inter
    emb = vocab * h * (1 if c.get("tie_word_embeddings") else 2)
    return int(layers * (attn + mlp) + emb)


# config.json keys naming the routed experts per layer (Qwen-MoE, DeepSeek, Mixtral, GPT-OSS)
EXPERT_KEYS = ("num_experts", "n_routed_experts", "num_local_experts")
MOE_HINTS = ("num_experts_per_tok", "moe_intermediate_size", "moe_topk", "router_aux_loss_coef")


def moe_estimate(c: Mapping[str, Any]) -> tuple[int, int, float]:
    """(experts per layer, params, routed experts' share of them) from a config; experts
    0 for a dense model, -1 when the config looks MoE but names no expert count."""
    experts = next((int(c[k]) for k in EXPERT_KEYS if isinstance(c.get(k), int) and c[k] > 1), 0)
    dense = estimate_params(c)
    if not experts:
        return (-1 if any(k in c for k in MOE_HINTS) else 0), dense, 0.0
    h, layers = int(c["hidden_size"]), int(c["num_hidden_layers"])
    inter = int(c.get("intermediate_size") or 4 * h)
    moe_inter = int(c.get("moe_intermediate_size") or inter)
    first_dense = min(int(c.get("first_k_dense_replace") or 0), layers)
    moe_layers = layers - first_dense
    shared = int(c.get("n_shared_experts") or 0) * 3 * h * moe_inter * moe_layers
    routed = moe_layers * experts * 3 * h * moe_inter
    # the dense estimate counts one gated MLP per layer: keep it only for the dense layers
    total = dense - moe_layers * 3 * h * inter + routed + shared
    return experts, total, routed / total if total > 0 else 0.0


def parse_config(text: str) -> ModelFacts:
    path = ""
    m = re.search(r"^config=(.*)$", text, re.M)
    if m:
        path = m.group(1).strip()
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        raise ParseError("no JSON object")
    try:
        c = json.loads(text[start : end + 1])
    except json.JSONDecodeError as e:
        raise ParseError(f"bad JSON: {e}") from None
    if not isinstance(c, dict):
        raise ParseError("config is not an object")
    c = c.get("text_config", c) if "num_hidden_layers" not in c else c
    try:
        heads = int(c["num_attention_heads"])
        h = int(c["hidden_size"])
        layers = int(c["num_hidden_layers"])
        kv = int(c.get("num_key_value_heads") or heads)
        hd = int(c.get("head_dim") or h // heads)
        experts, params, frac = moe_estimate(c)
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
        raise ParseError(f"missing or bad field {e}") from None
    dtype = str(c.get("torch_dtype") or c.get("dtype") or "bfloat16")
    db = DTYPE_BYTES.get(dtype, 2)
    wm = re.search(r"^weights_bytes=(\d+)\s*$", text, re.M)
    on_disk = int(wm.group(1)) if wm else 0
    return ModelFacts(path, layers, kv, hd, db, params, on_disk or params * db, experts, frac)


@dataclass(frozen=True)
class ModelAreaFacts:
    section: Section  # the config script's output, for the messages
    config: ModelFacts | None  # None: not on the host yet, or did not parse
    not_on_host: bool = False  # no config.json yet (the engine downloads it at start)
    error: str = ""  # why it did not parse


def parse(ctx: HostContext, s: Mapping[str, Section]) -> ModelAreaFacts | None:
    if not ctx.gpu_host or "config" not in s:
        return None
    sec = s["config"]
    if sec.rc == 3 or "no config.json" in sec.output:
        return ModelAreaFacts(sec, None, not_on_host=True)
    try:
        return ModelAreaFacts(sec, parse_config(sec.output))
    except ParseError as e:
        return ModelAreaFacts(sec, None, error=str(e))


def evaluate(ctx: HostContext, facts: HostFacts) -> list[CheckResult]:
    m = facts.model
    if m is None:
        return []
    if m.not_on_host:
        return [
            CheckResult(
                "model.config",
                "skip",
                f"config.json of {ctx.model} not on the host yet (downloaded by the engine at "
                "start); sizes not checked",
            )
        ]
    f = m.config
    if f is None:
        return [
            CheckResult(
                "model.config",
                "warn",
                f"could not parse config.json ({m.error}): {m.section.first_lines()}",
                "check the model files in the HF cache",
            )
        ]
    gpus = list(facts.gpu.gpus) if facts.gpu is not None else []
    rdma = facts.rdma
    link = rdma.link_gbps() if rdma is not None and rdma.checked and rdma.usable else None
    out = [CheckResult("model.config", "pass", f"config.json at {f.path or '?'}")]
    out += _weights(ctx, f, gpus)
    per_engine = _kv_per_engine(ctx, facts, f)
    out += per_engine or [kv_info(f, link or ctx.req.link_gbps)]
    return out


def _kv_per_engine(ctx: HostContext, facts: HostFacts, f: ModelFacts) -> list[CheckResult]:
    """With several engines on the host: each engine's estimate at its nearest NIC's rate,
    saying which engines share it (they share its bandwidth too)."""
    choices = [(e, c) for e, c in topo.engine_choices(ctx, facts) if c.ports]
    if not any(e.count > 1 for e, _ in choices):
        return []
    rates = {f"{p.device}:{p.port}": p.gbps for p in (facts.rdma.ports if facts.rdma else [])}
    sharing: dict[tuple[str, ...], int] = {}
    for _, c in choices:
        sharing[c.ports] = sharing.get(c.ports, 0) + 1
    out = []
    for e, c in choices:
        rate = max((r for p in c.ports if (r := rates.get(p))), default=None)
        via = ",".join(c.ports) + (
            f", shared by {sharing[c.ports]} engines" if sharing[c.ports] > 1 else ""
        )
        out.append(kv_info(f, rate or ctx.req.link_gbps, f"{e.key} via {via}: "))
    return out


def _weights(ctx: HostContext, f: ModelFacts, gpus: list[Gpu]) -> list[CheckResult]:
    if not gpus:
        return []
    out = []
    for need in ctx.gpu_needs:
        # the engine's own GPUs (the smallest of them bounds it); all when not listed
        mine = [g for g in gpus if need.gpus == "all" or g.index in need.gpus] or gpus
        per_gpu = min(g.mem_total_mib for g in mine) * (1 << 20)
        tp = need.tensor_parallel_size
        cap = per_gpu * tp
        rank_bytes, layout = _rank_weights(f, need)
        share = rank_bytes / cap
        msg = (
            f"{need.engine or need.tier}: weights {human_bytes(rank_bytes)}{layout} on {tp} x "
            f"{human_bytes(per_gpu)} GPU ({share:.0%} of GPU memory)"
        )
        if share > 0.9:
            out.append(
                CheckResult(
                    "model.weights",
                    "fail",
                    msg + ": does not fit, no room left for the KV cache",
                    f"raise {need.tier}.tensor_parallel_size or use a quantized model",
                )
            )
        elif share > 0.75:
            out.append(
                CheckResult(
                    "model.weights",
                    "warn",
                    msg + ": little room left for the KV cache",
                    f"consider a larger {need.tier}.tensor_parallel_size",
                )
            )
        else:
            out.append(CheckResult("model.weights", "pass", msg))
    return out


def _rank_weights(f: ModelFacts, need: GpuNeed) -> tuple[float, str]:
    """What one engine (one DP rank) holds: with expert parallelism the routed experts are
    sharded over EP = TP x DP ranks (vLLM), the rest split over TP as usual."""
    w = f.weights_bytes
    if not need.expert_parallel or need.dp_size <= 1:
        return w, ""
    ep = need.tensor_parallel_size * need.dp_size
    if f.experts <= 0:
        why = "no expert count in config.json" if f.experts < 0 else "a dense model"
        return w, f" (expert parallel, but {why}: every rank holds all weights)"
    experts = w * f.expert_fraction
    per_rank = w - experts + experts * need.tensor_parallel_size / ep
    return per_rank, (
        f" per rank of {human_bytes(w)} (expert parallel: {f.experts} experts, "
        f"~{f.expert_fraction:.0%} of the weights, sharded over EP {ep} = TP x DP)"
    )


def kv_info(f: ModelFacts, link_gbps: float | None, who: str = "") -> CheckResult:
    per_tok = f.kv_bytes_per_token
    total = per_tok * PROMPT_TOKENS
    rates = [link_gbps] if link_gbps else [100.0, 10.0]
    times = "; ".join(f"~{total * 8 / (r * 1e9):.2g} s at {r:g} Gb/s" for r in rates)
    return CheckResult(
        "model.kv_transfer",
        "pass",
        f"{who}KV cache {per_tok:,} bytes/token: ~{gib(total)} per 10k-token prompt; " + times,
    )
