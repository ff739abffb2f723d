"""Preflight checks every secret reference where pdboot runs, with a fix to paste; values
are never printed. Real files in a temporary directory, a plain dict as the environment."""

from __future__ import annotations

import os
from pathlib import Path

from pdboot.inventory.load import load_inventory
from pdboot.plan.proxy import MAX_API_KEY_CHARS
from pdboot.preflight import run as pf
from pdboot.preflight.checks import prepull, secret_refs
from pdboot.preflight.checks.secret_refs import check
from tests.unit.paths import INVENTORIES

INVENTORY = INVENTORIES / "1p1d.yaml"
TOKEN = "hf_" + "a" * 30


def test_a_missing_variable_says_which_and_how_to_export_it() -> None:
    r = check("secrets.hf_token", "secrets.hf_token", "env:HF_TOKEN", {})
    assert r.status == "fail" and "HF_TOKEN is not set" in r.message
    assert r.fix.startswith("export HF_TOKEN=hf_...")
    r = check("secrets.api_key", "secrets.api_key", "env:PD_KEY", {"PD_KEY": "  "})
    assert r.status == "fail" and r.fix.startswith("export PD_KEY=...")
    r = check("secrets.hf_token", "secrets.hf_token", "env:HF_TOKEN", {"HF_TOKEN": TOKEN})
    assert r.status == "pass" and TOKEN not in r.message


def test_a_world_readable_file_gets_chmod_600(tmp_path: Path) -> None:
    f = tmp_path / "token"
    f.write_text(TOKEN + "\n")
    f.chmod(0o644)
    r = check("secrets.hf_token", "secrets.hf_token", f"file:{f}", {})
    assert r.status == "fail" and "world-readable (mode 644)" in r.message
    assert r.fix == f"chmod 600 {f}"
    f.chmod(0o600)
    r = check("secrets.hf_token", "secrets.hf_token", f"file:{f}", {})
    assert r.status == "pass" and TOKEN not in r.message + r.fix


def test_a_missing_file_names_the_path(tmp_path: Path) -> None:
    f = tmp_path / "nope"
    r = check("secrets.env", "secrets.env.WANDB_API_KEY", f"file:{f}", {})
    assert r.status == "fail" and f"{f} does not exist" in r.message
    assert str(f) in r.fix and "chmod 600" in r.fix


def test_a_value_that_is_not_a_token_is_refused_without_echoing_it(tmp_path: Path) -> None:
    bad = "two words$"
    r = check("secrets.api_key", "secrets.api_key", "env:K", {"K": bad})
    assert r.status == "fail" and bad not in r.message + r.fix
    assert r.fix.startswith("export K=<the token alone>")


def test_every_reference_of_the_inventory_is_checked_once_on_the_first_host(
    tmp_path: Path,
) -> None:
    inv = load_inventory(INVENTORY)
    key = tmp_path / "key"
    key.write_text("k" * 20)
    key.chmod(0o600)
    inv = inv.model_copy(
        update={
            "secrets": inv.secrets.model_copy(
                update={"api_key": f"file:{key}", "env": {"WANDB_API_KEY": "env:WANDB_KEY"}}
            )
        }
    )
    got = [(r.id, r.status) for r in secret_refs.evaluate(inv, {"HF_TOKEN": TOKEN})]
    assert got == [
        ("secrets.hf_token", "pass"),
        ("secrets.api_key", "pass"),
        ("secrets.env", "fail"),
    ]
    ctxs = pf.contexts(inv)
    assert prepull.first_host(inv) == "gpu-a"  # first in the inventory
    old = os.environ.pop("HF_TOKEN", None)
    try:
        on = {n: [r.id for r in prepull.evaluate(c, inv, {})] for n, c in ctxs.items()}
    finally:
        if old is not None:
            os.environ["HF_TOKEN"] = old
    assert on["gpu-a"].count("secrets.hf_token") == 1
    assert not [i for i in on["gpu-b"] if i.startswith("secrets.")]


def test_an_api_key_longer_than_the_proxy_serves_is_refused_naming_the_limit() -> None:
    longest = "k" * MAX_API_KEY_CHARS
    r = check("secrets.api_key", "secrets.api_key", "env:K", {"K": longest})
    assert r.status == "pass" and longest not in r.message
    r = check("secrets.api_key", "secrets.api_key", "env:K", {"K": longest + "k"})
    assert r.status == "fail" and f"at most {MAX_API_KEY_CHARS}" in r.message
    assert longest not in r.message + r.fix and f"{MAX_API_KEY_CHARS} characters" in r.fix
    # the limit is the proxy's: another secret of that length is no key
    r = check("secrets.env", "secrets.env.W", "env:K", {"K": longest + "k"})
    assert r.status == "pass"
