"""Preflight's pre-pull verdicts: image existence from registry lookups, tier agreement
from the inventory (what vLLM 0.33's NIXL compatibility hash covers)."""

from __future__ import annotations

import pytest

from pdboot.inventory.load import load_inventory, parse_inventory
from pdboot.inventory.schema import Requirements
from pdboot.preflight.checks import HostContext, agreement, images, prepull
from pdboot.preflight.registry import ImageConfig, Lookup
from tests.unit.paths import INVENTORIES

INV = INVENTORIES / "1p1d.yaml"
ENGINE, ROUTER = "vllm/vllm-openai:v0.33.0", "vllm/vllm-router:v0.1.17"
CFG = ImageConfig(ENGINE, "sha256:" + "a" * 64, "amd64", "linux", 9_000_000_000)


def ctx(*roles: str) -> HostContext:
    return HostContext("h", roles, Requirements(), image=ENGINE)


def test_a_missing_tag_fails_an_unreachable_registry_warns_a_found_image_passes() -> None:
    missing = Lookup(ENGINE, error="manifest v0.33.0 not found in x/y (no such tag)", missing=True)
    r = images.verdict(images.ENGINE_ID, ENGINE, "image", missing)
    assert r.status == "fail" and "no such tag" in r.message and "`image`" in r.fix
    offline = Lookup(ENGINE, error="cannot reach https://r/v2/x: [Errno 101] unreachable")
    r = images.verdict(images.ENGINE_ID, ENGINE, "image", offline)
    assert r.status == "warn" and "Errno 101" in r.message
    r = images.verdict(images.ENGINE_ID, ENGINE, "image", Lookup(ENGINE, CFG))
    assert r.status == "pass" and "8.4 GiB" in r.message  # 9e9 bytes


def test_each_host_reports_the_images_it_pulls() -> None:
    looked = {ENGINE: Lookup(ENGINE, CFG), ROUTER: Lookup(ROUTER, error="x", missing=True)}
    ids = [r.id for r in images.evaluate(ctx("prefill", "router"), looked, ROUTER)]
    assert ids == ["docker.image_exists", "docker.router_image"]
    assert [r.id for r in images.evaluate(ctx("decode"), looked, ROUTER)] == [images.ENGINE_ID]
    assert images.evaluate(ctx("decode"), {}, ROUTER) == []  # not looked up: not reported
    # the proxy's image (router.proxy_image), on the router host only
    proxy = "nginx:1.27.3"
    looked[proxy] = Lookup(proxy, error="manifest 1.27.3 not found (no such tag)", missing=True)
    got = images.evaluate(ctx("router"), looked, ROUTER, proxy)
    assert [(r.id, r.status) for r in got] == [
        ("docker.router_image", "fail"),
        ("docker.proxy_image", "fail"),
    ]
    assert "router.proxy_image" in got[1].fix
    assert [r.id for r in images.evaluate(ctx("decode"), looked, ROUTER, proxy)] == [
        images.ENGINE_ID
    ]


def test_agreement_is_reported_on_decode_hosts_only() -> None:
    inv = load_inventory(INV)
    assert [r.id for r in prepull.evaluate(ctx("decode"), inv, {})] == [agreement.CHECK_ID]
    assert prepull.evaluate(ctx("prefill"), inv, {}) == []


def _inv(prefill_args: str, decode_args: str, extra: str = "", tp: tuple[int, int] = (1, 1)) -> str:
    # vLLM 0.33: block sizes need only divide (0.34 wants them equal: test_vllm_target.py)
    return (
        "image: vllm/vllm-openai:v0.33.0\n"
        + INV.read_text()
        .replace(
            "prefill:\n  hosts: [gpu-a]\n",
            f"prefill:\n  hosts: [gpu-a]\n  tensor_parallel_size: {tp[0]}\n"
            f"  extra_args: {prefill_args}\n",
        )
        .replace(
            "decode:\n  hosts: [gpu-b]\n",
            f"decode:\n  hosts: [gpu-b]\n  tensor_parallel_size: {tp[1]}\n"
            f"  extra_args: {decode_args}\n",
        )
        + extra
    )


def test_same_settings_agree() -> None:
    inv = parse_inventory(_inv('["--kv-cache-dtype", "fp8"]', '["--kv_cache_dtype=fp8"]'))
    r = agreement.evaluate(inv)
    assert r.status == "pass" and "KV cache dtype fp8" in r.message


@pytest.mark.parametrize(
    ("p", "d", "needle"),
    [
        ('["--kv-cache-dtype", "fp8"]', "[]", "--kv-cache-dtype: prefill 'fp8', decode 'auto'"),
        ('["--dtype=half"]', '["--dtype", "bfloat16"]', "--dtype: prefill 'half'"),
        (
            '["--attention-backend", "FLASHINFER"]',
            '["-ac", "{\\"backend\\": \\"FLASH_ATTN\\"}"]',
            "--attention-backend: prefill 'FLASHINFER', decode 'FLASH_ATTN'",
        ),
        ('["--disable-hybrid-kv-cache-manager"]', "[]", "--disable-hybrid-kv-cache-manager"),
        ('["--block-size", "16"]', '["--block-size", "24"]', "neither divides the other"),
    ],
)
def test_a_hashed_difference_fails_naming_both_values(p: str, d: str, needle: str) -> None:
    r = agreement.evaluate(parse_inventory(_inv(p, d)))
    assert r.status == "fail", r
    assert needle in r.message and "NIXL compatibility hash mismatch" in r.message
    assert "prefill.extra_args" in r.fix or "divides" in r.fix


def test_block_and_tp_sizes_need_only_divide() -> None:
    ok = parse_inventory(_inv('["--block-size", "16"]', '["--block-size", "64"]', tp=(1, 2)))
    assert agreement.evaluate(ok).status == "pass"
    bad = agreement.verdict(agreement.TierFacts({}, None, 2), agreement.TierFacts({}, None, 3))
    assert bad.status == "fail" and "prefill 2, decode 3" in bad.message
