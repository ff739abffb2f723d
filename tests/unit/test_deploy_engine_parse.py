"""Pure parsing of what the Docker engine returns: inspect JSON, pull events, pull errors."""

from __future__ import annotations

import json
from pathlib import Path

from pdboot.engine import PullProgress, observed_from_inspect, pull_error_cause, split_image

FIXTURES = Path(__file__).parent / "fixtures" / "deploy"


def test_split_image_with_registry_port() -> None:
    assert split_image("10.77.0.1:5000/vllm/vllm-openai:v0.33.0") == (
        "10.77.0.1:5000/vllm/vllm-openai",
        "v0.33.0",
    )
    assert split_image("10.77.0.1:5000/vllm/vllm-router") == (
        "10.77.0.1:5000/vllm/vllm-router",
        "latest",
    )


def test_pull_error_causes() -> None:
    assert "no such image or tag" in pull_error_cause(
        "manifest for 10.77.0.1:5000/vllm/vllm-openai:v9.9.9 not found: "
        "manifest unknown: manifest unknown"
    )
    assert "registry unreachable" in pull_error_cause(
        'Get "http://10.77.0.1:5000/v2/": dial tcp 10.77.0.1:5000: connect: connection refused'
    )
    assert "disk full" in pull_error_cause(
        "failed to register layer: write /usr/lib/x.so: no space left on device"
    )


def test_pull_progress_folds_layer_events() -> None:
    p = PullProgress("img")
    events = [
        {"status": "Pulling from vllm/vllm-openai", "id": "v0.33.0"},
        {"status": "Pulling fs layer", "progressDetail": {}, "id": "aaa"},
        {"status": "Pulling fs layer", "progressDetail": {}, "id": "bbb"},
        {"status": "Downloading", "progressDetail": {"current": 100, "total": 1000}, "id": "aaa"},
        {"status": "Downloading", "progressDetail": {"current": 50, "total": 500}, "id": "bbb"},
    ]
    for e in events:
        p.feed(e)
    assert (p.done, p.total) == (150, 1500)
    p.feed({"status": "Download complete", "progressDetail": {}, "id": "aaa"})
    assert p.done == 1050
    p.feed({"status": "Digest: sha256:abc"})
    p.feed({"status": "Status: Downloaded newer image for img"})
    assert p.digest == "sha256:abc" and p.status.startswith("Downloaded newer")
    p.feed(
        {"errorDetail": {"message": "no space left on device"}, "error": "no space left on device"}
    )
    assert p.error == "no space left on device"


def test_observed_from_inspect_is_lenient() -> None:
    o = observed_from_inspect("gpu-b", {"Id": "abc", "State": {"Status": "exited", "ExitCode": 3}})
    assert o.state == "exited" and o.exit_code == 3 and o.labels == {} and o.role is None


def test_observed_from_captured_inspect() -> None:
    files = sorted(FIXTURES.glob("inspect-*.json"))
    for f in files:
        data = json.loads(f.read_text())
        o = observed_from_inspect("h", data[0] if isinstance(data, list) else data)
        assert o.id and o.role in ("decode", "prefill", "router")
