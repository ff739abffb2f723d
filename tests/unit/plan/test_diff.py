"""`up --plan` says what changed per engine (image, arguments, planned environment, GPUs)
instead of two config hashes (issue 33), from what docker inspect really reports."""

from __future__ import annotations

import dataclasses
import json

from pdboot.inventory.schema import Inventory
from pdboot.plan.build import build_plan
from pdboot.plan.converge import Observed, plan_up
from pdboot.plan.diff import argument_changes, config_changes, options
from pdboot.plan.model import LABEL_CONFIG_HASH, LABEL_DEPLOYMENT, LABEL_HOST, LABEL_ROLE, Service
from pdboot.transport.docker_parse import observed_from_inspect
from tests.unit.builders import inventory
from tests.unit.paths import FIXTURES

FIX = FIXTURES / "deploy"


def running(svc: Service) -> Observed:
    """The container `up` started for ``svc``, as inspect reports it."""
    return Observed(
        host=svc.host,
        id=f"id-{svc.key}",
        name=f"pdboot-demo-{svc.role}",
        labels={
            LABEL_DEPLOYMENT: "demo",
            LABEL_ROLE: svc.role,
            LABEL_HOST: svc.host,
            LABEL_CONFIG_HASH: svc.config_hash,
        },
        state="running",
        image=svc.image,
        command=svc.command,
        env=(*svc.environment, ("PATH", "/usr/bin"), ("HF_TOKEN", "hf_secretvalue0000000000")),
        gpus="all" if svc.gpus == "all" else ",".join(map(str, svc.gpus or ())),
    )


def reason_for(new_inventory: Inventory, role: str = "decode") -> str:
    old = build_plan(inventory())
    obs = [running(s) for s in old.services()]
    steps = [s for st in plan_up(build_plan(new_inventory), obs) for s in st]
    return next(s.reason for s in steps if s.service.role == role)


def test_inspect_capture_gives_command_environment_and_gpus() -> None:
    o = observed_from_inspect("d1", json.loads((FIX / "inspect-decode-running.json").read_text()))
    assert o.command[:3] == ("Qwen/Qwen3-0.6B", "--port", "8201")
    assert dict(o.env)["VLLM_NIXL_SIDE_CHANNEL_PORT"]
    assert o.gpus == "all"


def test_an_argument_change_is_named_with_both_values() -> None:
    new = inventory(overrides={"decode.extra_args": ["--max-num-seqs", "64"]})
    why = reason_for(new)
    assert why == "configuration changed: --max-num-seqs 64 added", why


def test_an_image_change_is_named() -> None:
    new = inventory(image="vllm/vllm-openai:v0.99.0")
    why = reason_for(new)
    assert "image vllm/vllm-openai:" in why and "-> vllm/vllm-openai:v0.99.0" in why, why
    assert "->" in why and "other settings" not in why  # no hashes when inspect shows the cause


def test_environment_and_gpus_name_the_planned_keys_only() -> None:
    svc = build_plan(inventory()).decode_engines[0]
    cur = running(svc)
    moved = dataclasses.replace(svc, environment=(*svc.environment, ("UCX_TLS", "tcp")), gpus=(1,))
    why = config_changes(moved, cur)
    assert "env UCX_TLS (none) -> tcp" in why and "GPUs all -> 1" in why, why
    assert "HF_TOKEN" not in why and "hf_secret" not in why and "PATH" not in why


def test_nothing_visible_falls_back_to_the_hashes() -> None:
    svc = build_plan(inventory()).decode_engines[0]
    cur = dataclasses.replace(running(svc), labels={LABEL_CONFIG_HASH: "0ld"})
    assert (
        config_changes(svc, cur)
        == f"other settings (mounts, limits, labels; 0ld -> {svc.config_hash})"
    )


def test_kv_transfer_config_names_the_keys_that_moved() -> None:
    old = ("m", "--kv-transfer-config", '{"kv_buffer_device":"cuda","kv_role":"kv_consumer"}')
    new = ("m", "--kv-transfer-config", '{"kv_buffer_device":"cpu","kv_role":"kv_consumer"}')
    assert argument_changes(old, new) == ['--kv-transfer-config {kv_buffer_device "cuda" -> "cpu"}']


def test_options_read_flags_pairs_and_equals() -> None:
    assert options(("m", "--a", "1", "--b", "--c=2", "--d", "-1")) == {
        "": "m",
        "--a": "1",
        "--b": "",
        "--c": "2",
        "--d": "-1",
    }
