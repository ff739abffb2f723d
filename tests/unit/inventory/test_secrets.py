"""Secrets beyond the HF token, and the project dir marker `down --purge` relies on."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest

from pdboot.inventory.schema import Inventory
from pdboot.plan.build import build_plan
from pdboot.plan.model import PRIVATE_FILES
from pdboot.plan.proxy import MAX_API_KEY_CHARS
from pdboot.plan.render import render_all, render_summary
from pdboot.transport.connection import LocalConnection
from pdboot.transport.docker_host import PROJECT_MARKER, Engine
from pdboot.transport.docker_parse import EngineError
from pdboot.transport.hosts import (
    SecretError,
    api_key_headers,
    read_secrets,
    register_inventory_secrets,
    router_secrets_env,
    secrets_env,
)
from pdboot.transport.masking import mask
from tests.unit.builders import inventory


def render(plan: Any, inv: Any) -> tuple[dict[str, str], str]:
    """render_all/render_summary take (plan, inv) before w8-plan's pure render lands and
    (plan) after it: these tests run on both sides of that merge."""
    if len(inspect.signature(render_all).parameters) == 2:
        return render_all(plan, inv), render_summary(plan, inv)  # type: ignore[call-arg]
    return render_all(plan), render_summary(plan)  # type: ignore[call-arg]


HOSTS = {"gpu-a": "192.0.2.10", "gpu-b": "192.0.2.11", "gpu-c": "192.0.2.12"}

KEY = "pdk-Zq7-not-a-real-key-but-long-enough"
TOKEN = "hf_NotARealTokenButLooksLikeOne0123"


def inv(**secrets: Any) -> Inventory:
    """Three hosts (the router on its own), with this secrets: section when given."""
    return inventory(
        HOSTS,
        ["gpu-a"],
        ["gpu-b"],
        "gpu-c",
        model="meta-llama/Llama-3.1-8B-Instruct",
        overrides={"secrets": secrets} if secrets else {},
    )


def test_read_secrets_maps_each_reference_to_its_variables(tmp_path: Path) -> None:
    f = tmp_path / "wandb"
    f.write_text("wandb-value-123\n")
    i = inv(hf_token="env:T", api_key="env:K", env={"WANDB_API_KEY": f"file:{f}"})
    values = read_secrets(i, {"T": TOKEN, "K": KEY})
    assert values == {
        "HF_TOKEN": TOKEN,
        "HUGGING_FACE_HUB_TOKEN": TOKEN,
        "VLLM_API_KEY": KEY,
        "OPENAI_API_KEY": KEY,
        "WANDB_API_KEY": "wandb-value-123",
    }
    text = secrets_env(values)
    assert f"VLLM_API_KEY={KEY}\n" in text and f"OPENAI_API_KEY={KEY}\n" in text
    assert api_key_headers(values) == {"Authorization": f"Bearer {KEY}"}


def test_up_refuses_an_api_key_longer_than_the_proxy_serves() -> None:
    i = inv(api_key="env:K")
    longest = "K" * MAX_API_KEY_CHARS
    assert read_secrets(i, {"K": longest})["VLLM_API_KEY"] == longest
    with pytest.raises(SecretError, match=f"at most {MAX_API_KEY_CHARS}") as e:
        read_secrets(i, {"K": longest + "K"})
    assert longest not in str(e.value)


def test_no_secrets_reads_nothing() -> None:
    i = inv()
    assert read_secrets(i, {}) == {} and api_key_headers({}) == {}


@pytest.mark.parametrize(
    ("environ", "words"),
    [({}, "secrets.api_key is env:K but the environment variable K is not set"),
     ({"K": "a b"}, "does not look like a token"),
     ({"K": "x$y"}, "does not look like a token")],
)  # fmt: skip
def test_unresolvable_api_key_names_the_reference(environ: dict[str, str], words: str) -> None:
    i = inv(api_key="env:K")
    with pytest.raises(SecretError, match=words.replace("$", r"\$")):
        read_secrets(i, environ)


def test_secrets_are_masked_after_registration() -> None:
    i = inv(api_key="env:K", hf_token="env:MISSING")
    register_inventory_secrets(i, {"K": KEY})  # the missing one is skipped, not fatal
    assert mask(f"engine said Bearer {KEY}") == "engine said Bearer ***"


def test_api_key_reaches_engines_and_router_only_through_the_env_file() -> None:
    i = inv(api_key="env:K")
    plan = build_plan(i)
    texts, _ = render(plan, i)
    for host in ("gpu-a", "gpu-b", "gpu-c"):  # prefill, decode, router
        assert "env_file" in texts[host] and "secrets.env" in texts[host]
        assert "api-key" not in texts[host] and "env:K" not in texts[host]
    # the engines read secrets.env; the router a file of its own with the key alone; the
    # proxy holds no secret in its environment: its key check is a 0600 file (proxy.py)
    assert all(s.uses_secrets for s in plan.engines)
    assert plan.router.env_file == "router-secrets.env" and not plan.router.uses_secrets
    assert "router-secrets.env" in PRIVATE_FILES
    assert plan.proxy is not None and plan.proxy.env_file is None


def test_the_router_gets_the_api_key_alone_never_the_hf_token() -> None:
    values = read_secrets(inv(hf_token="env:T", api_key="env:K"), {"T": TOKEN, "K": KEY})
    assert router_secrets_env(values) == f"OPENAI_API_KEY={KEY}\n"
    assert TOKEN not in (router_secrets_env(values) or "")
    assert router_secrets_env(read_secrets(inv(hf_token="env:T"), {"T": TOKEN})) is None


def test_router_gets_no_env_file_without_an_api_key() -> None:
    i = inv(hf_token="env:T")
    plan = build_plan(i)
    assert not plan.router.uses_secrets
    assert all(s.uses_secrets for s in plan.engines)


# --------------------------------------------------------------------------- marker


def engine() -> Engine:
    # ship and remove_project_dir use only the connection: bash on this machine
    return Engine(LocalConnection("box"), api=None)


def test_up_marks_the_dir_it_creates_and_purge_removes_it(tmp_path: Path) -> None:
    d = tmp_path / "demo"
    e = engine()
    e.ship(str(d), "services: {}\n", None)
    assert (d / PROJECT_MARKER).read_text() == "demo\n"
    assert (d.stat().st_mode & 0o777) == 0o700
    e.ship(str(d), "services: {}\n", None)  # its own dir: accepted again
    e.remove_project_dir(str(d))
    assert not d.exists()
    e.remove_project_dir(str(d))  # already gone: fine


def test_purge_refuses_a_dir_without_a_matching_marker(tmp_path: Path) -> None:
    d = tmp_path / "ssh"
    d.mkdir()
    (d / "sshd_config").write_text("keep me\n")
    with pytest.raises(EngineError, match=r"refusing to remove .*pdboot did not create it"):
        engine().remove_project_dir(str(d))
    (d / PROJECT_MARKER).write_text("other\n")
    with pytest.raises(EngineError, match="refusing to remove"):
        engine().remove_project_dir(str(d))
    assert (d / "sshd_config").exists()


def test_up_refuses_to_write_into_a_foreign_dir(tmp_path: Path) -> None:
    d = tmp_path / "ssh"
    d.mkdir()
    (d / "sshd_config").write_text("keep me\n")
    with pytest.raises(EngineError, match="pdboot did not create it"):
        engine().ship(str(d), "services: {}\n", None)
    assert sorted(p.name for p in d.iterdir()) == ["sshd_config"]


def test_up_never_adopts_an_existing_dir(tmp_path: Path) -> None:
    """Issue 18 item 5: an empty directory, or one whose compose.yaml merely mentions
    io.pdboot.deployment, is not pdboot's: refused, left as it was, and purge refuses it."""
    empty = tmp_path / "demo"
    empty.mkdir(mode=0o755)
    with pytest.raises(EngineError, match="pdboot did not create it"):
        engine().ship(str(empty), "services: {}\n", None)
    assert list(empty.iterdir()) == [] and (empty.stat().st_mode & 0o777) == 0o755
    look = tmp_path / "look"
    look.mkdir()
    (look / "compose.yaml").write_text("labels: {io.pdboot.deployment: look}\n")
    with pytest.raises(EngineError, match="pdboot did not create it"):
        engine().ship(str(look), "services: {}\n", None)
    assert sorted(p.name for p in look.iterdir()) == ["compose.yaml"]
    with pytest.raises(EngineError, match="refusing to remove"):
        engine().remove_project_dir(str(look))
    assert (look / "compose.yaml").exists()
    # a symlink at the project path is refused too (its target is not pdboot's)
    (tmp_path / "link").symlink_to(look)
    with pytest.raises(EngineError, match="pdboot did not create it"):
        engine().ship(str(tmp_path / "link"), "services: {}\n", None)
