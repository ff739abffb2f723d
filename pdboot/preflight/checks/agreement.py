"""Prefill and decode agree where NIXL requires it -- judged from the inventory alone.

vLLM 0.33 refuses a NIXL handshake whose peer has another compatibility hash
(``compute_nixl_compatibility_hash`` in vllm/distributed/kv_transfer/kv_connector/v1/nixl/
metadata.py; the raise is "NIXL compatibility hash mismatch" in nixl/base_worker.py). Its
factors: the vLLM and connector versions, ``model_config.model`` (the literal --model
string), ``model_config.dtype``, the model's KV heads / head size / layers, the attention
backend name, ``cache_config.cache_dtype``, whether the hybrid KV cache manager is on, the
speculative config and the transfer mode (push or pull connector). The docstring there
says tensor_parallel_size and block_size are NOT hashed: they are validated at the
handshake and may differ as long as one divides the other.

pdboot gives both tiers one image, one ``model`` and one ``kv_transfer.kv_connector``, so
version, model and transfer mode always agree; what can differ is what each tier's
``extra_args`` sets. Option names (and their short aliases) are those of
shared/fixtures/vllm-0.33.0/serve-args.json. Pure: inventory in, verdict out.
"""

from __future__ import annotations

from dataclasses import dataclass

from pdboot.inventory.cpu_layout import CPU_DTYPE
from pdboot.inventory.schema import Inventory, Tier
from pdboot.plan.nixl_compat import attention_backend, options
from pdboot.preflight.checks import CheckResult

CHECK_ID = "model.tier_agreement"

# (fact, the options that set it in vLLM 0.33's `vllm serve`, default when unset)
HASHED: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("dtype", ("--dtype",), "auto"),
    ("kv_cache_dtype", ("--kv-cache-dtype",), "auto"),
    ("attention_backend", ("--attention-backend",), "auto"),
    ("speculative_config", ("--speculative-config", "-sc"), "none"),
)
HYBRID = ("--disable-hybrid-kv-cache-manager", "--enable-hybrid-kv-cache-manager")


@dataclass(frozen=True)
class TierFacts:
    """What one tier's engines put into the compatibility hash, plus the divisible sizes."""

    values: dict[str, str]  # fact -> value as written ("auto"/"none"/"default" when unset)
    block_size: int | None  # None: vLLM's default for the platform
    tensor_parallel_size: int


def tier_facts(tier: Tier, dtype_default: str = "auto") -> TierFacts:
    """``dtype_default``: what an unset --dtype runs as (device: cpu: pdboot's float32)."""
    opts = options(tier.extra_args)  # plan/nixl_compat.py: `up` reads the same hash inputs
    values: dict[str, str] = {}
    for fact, names, default in HASHED:
        unset = dtype_default if fact == "dtype" else default
        values[fact] = next((opts[n] for n in names if n in opts), unset)
    values["attention_backend"] = attention_backend(opts, {})
    hybrid = "default"
    if HYBRID[0] in opts:
        hybrid = "disabled"
    elif HYBRID[1] in opts:
        hybrid = "enabled"
    values["hybrid_kv_cache_manager"] = hybrid
    try:
        block = int(opts["--block-size"]) if "--block-size" in opts else None
    except ValueError:
        block = None
    return TierFacts(values, block, tier.tensor_parallel_size)


OPTION_OF = {
    "dtype": "--dtype",
    "kv_cache_dtype": "--kv-cache-dtype",
    "attention_backend": "--attention-backend",
    "speculative_config": "--speculative-config",
    "hybrid_kv_cache_manager": "--disable-hybrid-kv-cache-manager",
}


def _divides(a: int, b: int) -> bool:
    return a > 0 and b > 0 and (a % b == 0 or b % a == 0)


def verdict(p: TierFacts, d: TierFacts, enforced: bool = True) -> CheckResult:
    """Hashed facts must be equal; block and TP sizes must divide one another."""
    problems: list[str] = []
    fixes: list[str] = []
    for fact, pv in p.values.items():
        dv = d.values[fact]
        if pv != dv:
            opt = OPTION_OF[fact]
            problems.append(f"{opt}: prefill {pv!r}, decode {dv!r}")
            fixes.append(f"give {opt} the same value in prefill.extra_args and decode.extra_args")
    pb, db = p.block_size, d.block_size
    if pb is not None and db is not None and not _divides(pb, db):
        problems.append(f"--block-size: prefill {pb}, decode {db} (neither divides the other)")
        fixes.append("use block sizes where one divides the other (e.g. 16 and 32)")
    pt, dt = p.tensor_parallel_size, d.tensor_parallel_size
    if not _divides(pt, dt):
        problems.append(f"tensor_parallel_size: prefill {pt}, decode {dt} (neither divides)")
        fixes.append("use tensor_parallel_size values where one divides the other")
    if not problems:
        return CheckResult(
            CHECK_ID,
            "pass",
            "prefill and decode agree on what vLLM's NIXL compatibility hash covers "
            f"(dtype {p.values['dtype']}, KV cache dtype {p.values['kv_cache_dtype']}, "
            f"attention backend {p.values['attention_backend']}; one image, model and "
            f"connector); TP {pt}/{dt}",
        )
    why = (
        "the decode would refuse the handshake at the first request "
        "('NIXL compatibility hash mismatch') or the transfer would fail"
    )
    if not enforced:
        why = "enforce_handshake_compat is off, so vLLM would transfer KV it cannot read"
    return CheckResult(
        CHECK_ID, "fail", f"the tiers disagree: {'; '.join(problems)}: {why}", "; ".join(fixes)
    )


def evaluate(inv: Inventory) -> CheckResult:
    extra = inv.kv_transfer.kv_connector_extra_config
    enforced = extra.get("enforce_handshake_compat", True) is not False
    dtype = CPU_DTYPE if inv.device == "cpu" else "auto"  # pdboot adds it on CPU engines
    return verdict(tier_facts(inv.prefill, dtype), tier_facts(inv.decode, dtype), enforced)
