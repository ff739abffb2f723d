"""status rows, uptime parsing, logs selectors and the HF token reference (pure parts)."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from pdboot.deploy.status import (
    SelectorError,
    select_service,
    service_status,
    uptime,
)
from pdboot.inventory.schema import Inventory
from pdboot.plan.build import build_plan
from pdboot.plan.converge import Observed
from pdboot.plan.model import LABEL_CONFIG_HASH, LABEL_DEPLOYMENT, LABEL_ROLE
from pdboot.transport.hosts import SecretError, read_hf_token, secrets_env
from pdboot.views.status import human_seconds
from tests.unit.builders import inventory


def one_by_two() -> Inventory:
    """One prefill on a, decodes on b and c, the router on a."""
    hosts = {"a": "192.0.2.10", "b": "192.0.2.11", "c": "192.0.2.12"}
    return inventory(hosts, ["a"], ["b", "c"], "a")


NOW = datetime(2026, 11, 30, 1, 0, 0, tzinfo=timezone.utc)


def test_uptime_from_docker_nanoseconds() -> None:
    assert uptime("2026-11-30T00:58:59.123456789Z", NOW) == pytest.approx(60.876543, abs=1e-3)
    assert uptime("0001-01-01T00:00:00Z", NOW) is None
    assert human_seconds(3725) == "1h02m" and human_seconds(59) == "59s"


def test_service_status_rows() -> None:
    inv = one_by_two()
    svc = build_plan(inv).decode_engines[0]
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
    inv = one_by_two()
    assert select_service(inv, "router").key == "router@a"
    assert select_service(inv, "decode@c").key == "decode@c"
    with pytest.raises(SelectorError, match="pick one"):
        select_service(inv, "decode")
    with pytest.raises(SelectorError, match="unknown role"):
        select_service(inv, "gateway")


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


def _row(service: str, state: str, health: str, image: str, endpoint: str, **kw: object) -> Any:
    from pdboot.events import ServiceStatus

    role, _, host = service.partition("@")
    args: dict[str, Any] = {"uptime_seconds": 6.0, "matches_inventory": True, "planned": True}
    args.update(kw)
    return ServiceStatus(service, role, host, state, health, image=image, endpoint=endpoint, **args)


REG = "10.77.2.1:5000/vllm/"
DEMO = [
    ("decode@decode", "running", "ok", REG + "vllm-openai:v0.33.0", "http://10.77.2.10:8201"),
    ("prefill@prefill", "running", "ok", REG + "vllm-openai:v0.33.0", "http://10.77.2.11:8200"),
    ("router@ingress", "running", "ok", REG + "vllm-router:v0.1.17", "http://10.77.2.12:8000"),
]


def _render(rows: list[Any], width: int) -> list[str]:
    from rich.console import Console

    from pdboot.views.status import status_table

    console = Console(record=True, width=width, color_system=None)
    console.print(status_table(rows, "pdtest", width))
    return console.export_text().splitlines()


def test_short_image_and_endpoint() -> None:
    from pdboot.views.status import short_endpoint, short_image

    assert short_image(REG + "vllm-openai:v0.33.0") == "vllm-openai:v0.33.0"
    assert short_image("vllm/vllm-openai@sha256:" + "ab" * 32) == "vllm-openai@sha256:" + "ab" * 6
    assert short_image("busybox") == "busybox"
    assert short_endpoint("http://10.77.2.10:8201") == "10.77.2.10:8201"
    assert short_endpoint("http://[fd00::1]:8000/") == "[fd00::1]:8000"


@pytest.mark.parametrize("width", [80, 160])
def test_status_table_never_breaks_a_token(width: int) -> None:
    bad = _row(
        "prefill@prefill",
        "exited",
        "connection refused",
        REG + "vllm-openai:v0.33.0",
        "http://10.77.2.11:8200",
        matches_inventory=False,
        uptime_seconds=None,
    )
    rows = [_row(*r) for r in DEMO] + [bad]
    lines = _render(rows, width)
    text = "\n".join(lines)
    assert all(len(ln) <= width for ln in lines)
    for token in (
        "decode@decode",
        "prefill@prefill",
        "router@ingress",
        "vllm-openai:v0.33.0",
        "vllm-router:v0.1.17",
        "10.77.2.10:8201",
        "10.77.2.12:8000",
        "running",
        "exited",
    ):
        assert token in text, (token, text)
    assert "10.77.2.1:5000" not in text and "http://" not in text  # short forms only
    one_line = width == 160
    decode = next(ln for ln in lines if ln.startswith("decode@decode"))
    # wide: a line per service; at 80 columns: two (uptime and config under state and image)
    assert ("6s" in decode) == one_line
    assert ("changed" in text) and ("connection" in text)
    assert len(lines) == (3 + 4 if one_line else 3 + 2 * 4)  # title, header, rule; rows


def test_status_json_keeps_the_full_image_reference() -> None:
    from dataclasses import asdict

    assert asdict(_row(*DEMO[0]))["image"] == REG + "vllm-openai:v0.33.0"


def test_unreachable_rows_carry_the_reason_in_json_and_table() -> None:
    """Issue 32, item 6: `status` says why a host's state is unknown (also in --json)."""
    import json

    from pdboot.events import StatusReport
    from pdboot.views.status import reason_lines, status_json

    svc = build_plan(one_by_two()).decode_engines[0]
    why = "cannot reach Docker: the Docker daemon is not running (...) (fix: start dockerd)"
    row = service_status(svc, None, reachable=False, now=NOW, health="-", reason=why)
    assert row.state == "unreachable" and row.reason == why
    assert reason_lines([row, row]) == [f"{svc.host} unreachable: {why}"]
    doc = json.loads(status_json(StatusReport("d", "http://x/v1", False, (row,), None)))
    assert doc["services"][0]["reason"] == why
    ok = service_status(svc, None, reachable=True, now=NOW, health="-", reason=why)
    assert ok.reason == "" and reason_lines([ok]) == []


def test_status_names_foreign_and_missing_router_workers() -> None:
    """Issue 28: the router's list against the plan, read on the router's loopback URL (the
    one router_admin.py sends through the router host), shown by `status` and in --json."""
    import json as _json

    from pdboot.deploy.router_api import WorkerDiff, worker_diff
    from pdboot.events import StatusReport
    from pdboot.transport.http import HttpAnswer
    from pdboot.views.status import status_json

    plan = build_plan(one_by_two())
    asked: list[str] = []
    listed = [
        {"url": "http://192.0.2.10:8200", "worker_type": "prefill"},
        {"url": "http://192.0.2.11:8201", "worker_type": "decode"},
        {"url": "http://203.0.113.9:9", "worker_type": "decode"},  # an outsider's server
    ]

    def fetch(url: str, **_: Any) -> HttpAnswer:
        asked.append(url)
        return HttpAnswer(200, _json.dumps({"workers": listed}))

    diff = worker_diff(plan, fetch)
    assert asked == ["http://127.0.0.1:8081/workers"]
    assert diff == WorkerDiff(("http://203.0.113.9:9",), ("http://192.0.2.12:8201",))
    doc = _json.loads(status_json(StatusReport("demo", "e", False, (), workers=diff)))
    assert doc["router_workers"]["foreign"] == ["http://203.0.113.9:9"]
    assert worker_diff(plan, lambda *_a, **_k: HttpAnswer(0, "", "refused")).error


def test_status_shows_a_plain_entry_of_degraded_mode_as_pdboots_not_foreign() -> None:
    """Degraded mode registers a decode again under its plain URL (with "/.") as a
    regular worker (plan/degraded.py): the router's answer keeps both entries apart."""
    import json as _json

    from rich.console import Console

    from pdboot.deploy.router_api import WorkerDiff, parse_workers, worker_diff
    from pdboot.events import StatusReport
    from pdboot.transport.http import HttpAnswer
    from pdboot.views.status import print_status

    plan = build_plan(one_by_two())
    listed = [
        {"url": "http://192.0.2.11:8201", "worker_type": "decode"},
        {"url": "http://192.0.2.11:8201/.", "worker_type": "regular"},
        {"url": "http://192.0.2.12:8201", "worker_type": "decode"},
        {"url": "http://203.0.113.9:9/", "worker_type": "regular"},  # an outsider's
    ]
    body = _json.dumps({"workers": listed})
    assert [(w.url, w.worker_type) for w in parse_workers(body)] == [
        ("http://192.0.2.11:8201", "decode"),
        ("http://192.0.2.11:8201/.", "regular"),
        ("http://192.0.2.12:8201", "decode"),
        ("http://203.0.113.9:9", "regular"),  # a bare trailing slash marks no plain entry
    ]
    diff = worker_diff(plan, lambda *_a, **_k: HttpAnswer(200, body))
    assert diff == WorkerDiff(
        ("http://203.0.113.9:9",), ("http://192.0.2.10:8200",), plain=("http://192.0.2.11:8201",)
    )
    out = Console(record=True, width=200)
    print_status(out, StatusReport("demo", "e", False, (), workers=diff))
    assert (
        "router: degraded, serving plain (no P/D) from http://192.0.2.11:8201" in out.export_text()
    )
