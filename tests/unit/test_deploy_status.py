"""status rows, uptime parsing, logs selectors and the HF token reference (pure parts)."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest

from pdboot.converge import Observed
from pdboot.hosts import SecretError, read_hf_token, secrets_env
from pdboot.inventory import parse_inventory
from pdboot.plan import LABEL_CONFIG_HASH, LABEL_DEPLOYMENT, LABEL_ROLE, build_plan
from pdboot.status import SelectorError, human_seconds, select_service, service_status, uptime

INV = """
name: demo
model: m
hosts:
  a: {address: 192.0.2.10}
  b: {address: 192.0.2.11}
  c: {address: 192.0.2.12}
prefill: {hosts: [a]}
decode: {hosts: [b, c]}
router: {host: a}
"""
NOW = datetime(2026, 11, 30, 1, 0, 0, tzinfo=timezone.utc)


def test_uptime_from_docker_nanoseconds() -> None:
    assert uptime("2026-11-30T00:58:59.123456789Z", NOW) == pytest.approx(60.876543, abs=1e-3)
    assert uptime("0001-01-01T00:00:00Z", NOW) is None
    assert human_seconds(3725) == "1h02m" and human_seconds(59) == "59s"


def test_service_status_rows() -> None:
    inv = parse_inventory(INV)
    svc = build_plan(inv).stages[0][0]
    obs = Observed(
        host="b",
        id="x",
        name="pdboot-demo-decode",
        labels={LABEL_DEPLOYMENT: "demo", LABEL_ROLE: "decode", LABEL_CONFIG_HASH: "old"},
        state="running",
        started_at="2026-11-30T00:59:00Z",
    )
    row = service_status(svc, obs, reachable=True, now=NOW, health="ok")
    assert row.healthy and row.matches_inventory is False and row.uptime_seconds == 60
    assert row.endpoint == "http://192.0.2.11:8201"
    gone = service_status(svc, None, reachable=False, now=NOW, health="-")
    assert gone.state == "unreachable" and not gone.healthy


def test_select_service() -> None:
    inv = parse_inventory(INV)
    assert select_service(inv, "router").key == "router@a"
    assert select_service(inv, "decode@c").key == "decode@c"
    with pytest.raises(SelectorError, match="pick one"):
        select_service(inv, "decode")
    with pytest.raises(SelectorError, match="unknown role"):
        select_service(inv, "proxy")


def test_hf_token_from_env_and_file(tmp_path: Path) -> None:
    assert read_hf_token(None) is None
    assert read_hf_token("env:TOK", {"TOK": "hf_abc123\n"}) == "hf_abc123"
    with pytest.raises(SecretError, match="TOK is not set"):
        read_hf_token("env:TOK", {})
    f = tmp_path / "token"
    f.write_text("hf_filetoken\n")
    assert read_hf_token(f"file:{f}") == "hf_filetoken"
    assert read_hf_token(str(f)) == "hf_filetoken"
    with pytest.raises(SecretError, match="cannot be read"):
        read_hf_token(f"file:{tmp_path}/missing")


def test_secret_error_never_contains_the_value() -> None:
    with pytest.raises(SecretError) as ei:
        read_hf_token("env:TOK", {"TOK": "hf with space"})
    assert "hf with space" not in str(ei.value)
    assert secrets_env("hf_x") == "HF_TOKEN=hf_x\nHUGGING_FACE_HUB_TOKEN=hf_x\n"
