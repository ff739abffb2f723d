"""device: cpu after the start: the KV speed check judges UCX over TCP as TCP (against the
inventory's link_gbps, never an RDMA port rate), and status shows each engine's cores."""

from __future__ import annotations

from datetime import datetime, timezone

from pdboot.deploy.status import rows_for
from pdboot.plan.build import build_plan
from pdboot.plan.model import Plan
from pdboot.transport.http import HttpAnswer
from pdboot.verify import metrics as pm
from pdboot.verify.pdcheck import link_rate
from pdboot.views.status import core_lines, nic_lines
from tests.unit.builders import cpu_pair_doc, load, running_as_planned


def plan() -> Plan:
    """Two CPU hosts over TCP: one prefill on cpu-a, two decode engines on cpu-b."""
    overrides = {
        "cpu": {"kv_cache_gib": 1, "cores_per_engine": 1},
        "decode.engines_per_host": 2,
        "kv_transfer.rdma": "off",
        "requirements.link_gbps": 10,
    }
    inv = load(cpu_pair_doc(overrides=overrides), "inv.yaml")
    return build_plan(inv)


def test_cpu_tcp_speed_is_judged_against_the_tcp_link_not_as_a_fallback() -> None:
    fine = pm.speed_verdict(pm.PairSpeed("p", "d", 50e6, 0.2), 10.0, rdma=False, device="cpu")
    assert fine.flag is None and "over UCX/TCP" in fine.line and "(20%)" in fine.line
    slow = pm.speed_verdict(pm.PairSpeed("p", "d", 20e6, 8.0), 10.0, rdma=False, device="cpu")
    assert slow.flag is not None and slow.flag.code == "kv_cpu_tcp_slow"
    assert "progress thread" in slow.flag.message and "falling back" not in slow.flag.message
    # the same numbers on a GPU deployment read as the RDMA -> TCP fallback, as before
    gpu = pm.speed_verdict(pm.PairSpeed("p", "d", 50e6, 0.2), 10.0, rdma=False)
    assert gpu.flag is not None and gpu.flag.code == "kv_tcp_fallback"


def test_cpu_speed_compares_with_link_gbps_never_a_port_rate() -> None:
    p = plan()
    pre = next(s for s in p.services() if s.role == "prefill")
    dec = next(s for s in p.services() if s.role == "decode")
    assert not pre.rdma and not dec.rdma and pre.device == "cpu"
    assert link_rate(pre, dec, {"cpu-a": 400.0, "cpu-b": 400.0}, 10.0) == 10.0


def test_status_shows_each_cpu_engines_cores() -> None:
    p = plan()
    running = running_as_planned(p.services())
    rows = rows_for(p, running, set(), datetime.now(timezone.utc),
                    lambda *_a, **_k: HttpAnswer(200, ""))  # fmt: skip
    assert all(r.healthy and r.matches_inventory for r in rows)
    lines = core_lines(rows)
    assert lines[0] == "CPU cores per engine:"
    assert "  decode@cpu-b    cores 0" in lines and "  decode-1@cpu-b  cores 1" in lines
    assert "  prefill@cpu-a   cores 0" in lines
    assert not any("GPU" in ln for ln in nic_lines(rows) + lines)
    assert next(r for r in rows if r.role == "router").cores == ""


def test_a_broken_gate_on_cpu_names_cpu_causes_not_gpudirect() -> None:
    from dataclasses import replace

    from pdboot.verify.gate import classify

    broken = classify("alpha beta gamma", "delta epsilon")
    assert "GPUDirect" in broken.message()
    cpu = replace(broken, device="cpu").message()
    assert "GPUDirect" not in cpu and "CPU engines" in cpu and "--dtype" in cpu
