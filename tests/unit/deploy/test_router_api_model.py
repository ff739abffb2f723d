"""Issue 28: every registration names the served model. vllm-router 0.1.17 reads it from the
engine's GET /v1/models without a key otherwise; with secrets.api_key that answers 401, the
worker is filed under "unknown" and requests skip the P/D path (router_api's docstring)."""

from __future__ import annotations

import json

from pdboot.deploy.router_api import RouterWorkerApi, Worker, parse_workers, reconcile
from pdboot.transport.http import HttpAnswer

# GET /workers of the real 0.1.17 after a registration without model_id against an engine
# that checks a key (the router's own words, trimmed to the fields pdboot reads)
UNKNOWN = json.dumps(
    {
        "workers": [
            {"id": "ecc4", "url": "http://127.0.0.1:58791", "model_id": "unknown",
             "worker_type": "prefill", "is_healthy": True},
            {"id": "7215", "url": "http://127.0.0.1:48733", "model_id": "Qwen/Qwen3-0.6B",
             "worker_type": "decode", "is_healthy": True},
        ]
    }
)  # fmt: skip


def test_add_names_the_model() -> None:
    sent: list[object] = []

    def fetch(url: str, *, body: object = None, **_: object) -> HttpAnswer:
        sent.append(body)
        return HttpAnswer(200, "{}")

    RouterWorkerApi("http://r:1", fetch, model_id="Qwen/Qwen3-0.6B").add("http://e:2", "decode")
    RouterWorkerApi("http://r:1", fetch).add("http://e:2", "prefill")
    assert sent == [
        {"url": "http://e:2", "worker_type": "decode", "model_id": "Qwen/Qwen3-0.6B"},
        {"url": "http://e:2", "worker_type": "prefill"},
    ]


def test_a_worker_filed_under_another_model_is_registered_again() -> None:
    present = parse_workers(UNKNOWN)
    assert present[0] == Worker("http://127.0.0.1:58791", "prefill", True, "unknown")
    wanted = {"http://127.0.0.1:58791": "prefill", "http://127.0.0.1:48733": "decode"}
    assert [c.describe() for c in reconcile(wanted, present, "Qwen/Qwen3-0.6B")] == [
        "deregister prefill http://127.0.0.1:58791",
        "register prefill http://127.0.0.1:58791",
    ]
    assert reconcile(wanted, present) == []  # no model given: types alone


def test_sync_repairs_the_unknown_model() -> None:
    calls: list[tuple[str, object]] = []

    def fetch(url: str, *, body: object = None, method: object = None, **_: object) -> HttpAnswer:
        calls.append((str(method or ("POST" if body else "GET")), url))
        return HttpAnswer(200, UNKNOWN if body is None and method is None else "{}")

    api = RouterWorkerApi("http://r:1", fetch, model_id="Qwen/Qwen3-0.6B")
    api.sync({"http://127.0.0.1:58791": "prefill", "http://127.0.0.1:48733": "decode"})
    assert calls == [
        ("GET", "http://r:1/workers"),
        ("DELETE", "http://r:1/workers/http%3A%2F%2F127.0.0.1%3A58791"),
        ("POST", "http://r:1/workers"),
    ]
