"""`up`'s correctness gate and KV speed check, driven with the fake world: a corrupted KV
path fails `up` with both outputs, a late divergence warns, the speed line carries a number
next to the link rate, and a slow path is called a TCP fallback."""

from __future__ import annotations

from dataclasses import replace

from pdboot import events as ev
from pdboot.deploy.up_options import UpOptions
from pdboot.exitcodes import EXIT_FAILED, EXIT_OK
from pdboot.plan.build import build_plan
from pdboot.preflight.findings import from_preflight
from pdboot.verify.pdcheck import link_rate, speed_pairs, speed_prompt
from tests.unit.orchestrator_fakes import Recorder, World, inventory, run_up, up_in


def test_gate_passes_when_both_answers_match() -> None:
    world = World(inventory())
    code, rec = run_up(world)
    assert code == EXIT_OK
    (g,) = rec.of(ev.GateVerdict)
    assert (g.level, g.verdict) == ("ok", "identical")
    assert g.decode == "decode@d1"
    # the gate asked the router and the decode directly, greedy, without kv_transfer_params
    gate_urls = [u for u, b in world.requests if b.get("temperature") == 0 and "seed" in b]
    assert [u.split("/v1")[0] for u in gate_urls] == [
        build_plan(world.inv).endpoint,
        next(s.url for s in build_plan(world.inv).services() if s.role == "decode"),
    ]
    assert all("kv_transfer_params" not in b for _, b in world.requests if "seed" in b)


def test_corrupted_kv_fails_up_with_both_outputs() -> None:
    world = World(inventory(), corrupt_kv=True)
    code, rec = run_up(world)
    assert code == EXIT_FAILED
    (g,) = rec.of(ev.GateVerdict)
    assert (g.level, g.verdict) == ("fail", "broken")
    assert "the the the" in g.pd_output and "Venus" in g.direct_output
    assert "GPUDirect" in g.message and "Venus" in g.message and "the the" in g.message
    assert rec.of(ev.Diagnosis)[-1].context == "the correctness gate failed"
    assert rec.of(ev.Endpoint) == []  # no endpoint advertised for a deployment that lies
    assert rec.of(ev.KVSpeed) == []


def test_late_divergence_warns_and_up_goes_on() -> None:
    world = World(inventory(), late_divergence=True)
    code, rec = run_up(world)
    assert code == EXIT_OK
    (g,) = rec.of(ev.GateVerdict)
    assert (g.level, g.verdict) == ("warn", "late_divergence")
    assert "numerics" in g.message


def test_speed_line_against_declared_link_and_tcp_fallback() -> None:
    inv = inventory({"requirements.link_gbps": 100})
    world = World(inv, pull_bytes=50_000_000, pull_seconds=0.4)  # 1 Gbit/s of 100
    code, rec = run_up(world)
    assert code == EXIT_OK
    (speed,) = rec.of(ev.KVSpeed)
    (p,) = speed.pairs
    assert (p.prefill, p.decode) == ("prefill@p1", "decode@d1")
    assert p.gbps is not None and abs(p.gbps - 1.0) < 1e-6
    assert p.link_gbps == 100 and p.megabytes == 50.0
    assert p.flag == "kv_tcp_fallback" and "UCX_TLS" in p.advice
    # the pair was driven by hand: prefill with do_remote_decode, then decode with its params
    pre, dec = [b for u, b in world.requests if "kv_transfer_params" in b]
    assert pre["kv_transfer_params"]["do_remote_decode"] is True and pre["max_tokens"] == 1
    assert dec["kv_transfer_params"]["remote_engine_id"] == "e1"
    assert dec["prompt"] == pre["prompt"] and len(dec["prompt"].split()) == 900


def test_fast_path_has_no_flag_and_no_speed_skips_it() -> None:
    inv = inventory({"requirements.link_gbps": 100})
    world = World(inv, pull_bytes=50_000_000, pull_seconds=0.005)  # 80 Gbit/s
    code, rec = run_up(world)
    (p,) = rec.of(ev.KVSpeed)[0].pairs
    assert code == EXIT_OK and p.flag == "" and "80%" in p.line
    code, rec = run_up(World(inv), UpOptions(skip_preflight=True, speed=False))
    assert code == EXIT_OK and rec.of(ev.KVSpeed) == []


def test_too_little_kv_says_so_without_a_rate() -> None:
    world = World(inventory())  # 4 KB per pull
    (p,) = rec_pairs(world)
    assert p.gbps is None and "too little to judge" in p.line


def rec_pairs(world: World) -> tuple[ev.PairSpeedLine, ...]:
    rec = Recorder()

    up_in(world, UpOptions(skip_preflight=True), rec)
    return tuple(rec.of(ev.KVSpeed)[0].pairs)


def test_speed_pairs_cover_every_engine_once() -> None:
    inv = inventory({"prefill.hosts": ["p1", "r"]})
    pairs = [(p.key, d.key) for p, d in speed_pairs(build_plan(inv))]
    assert pairs == [("prefill@p1", "decode@d1"), ("prefill@r", "decode@d1")]


def test_speed_prompt_is_fresh_each_time() -> None:
    a, b = speed_prompt(), speed_prompt()
    assert a != b and len(a.split()) == len(b.split()) == 900


def test_prefill_change_restarts_decode_after_prefill_is_ready() -> None:
    world = World(inventory())
    assert run_up(world)[0] == EXIT_OK
    decode = world.of_role("decode")[0].id
    world.inv = inventory({"prefill.env": {"X": "1"}})
    world.calls.clear()
    code, rec = run_up(world, UpOptions(skip_preflight=True, yes=True))  # tiers of one
    assert code == EXIT_OK
    actions = {e.service: (e.action, e.reason) for e in rec.of(ev.ServiceAction)}
    assert actions["decode@d1"][0] == "recreate" and "NIXL" in actions["decode@d1"][1]
    assert actions["router@r"][0] == "unchanged"  # live workers: re-registered instead
    assert world.of_role("decode")[0].id != decode
    ups = [what for op, _, what in world.calls if op == "compose_up"]
    assert ups == ["prefill", "decode"]
    # the decode was restarted only once the prefill answered /health
    ready = [e.service for e in rec.of(ev.ServiceReady)]
    assert ready.index("prefill@p1") < ready.index("decode@d1", ready.index("prefill@p1"))
    assert rec.of(ev.GateVerdict)[0].level == "ok"


def test_link_rate_from_preflight_ports_else_declared() -> None:
    from tests.unit.plan.test_rdma_auto import preflight_result

    f = from_preflight(preflight_result())
    assert set(f.rdma_gbps) == {"gpu-a"} and f.rdma_gbps["gpu-a"] > 0  # the real sysfs rate
    plan = build_plan(inventory())
    pre, dec = speed_pairs(plan)[0]
    on = {"p1": 400.0, "d1": 200.0}
    # both ends on RDMA with a rate read: the slower port; otherwise the declared link_gbps
    assert link_rate(replace(pre, rdma=True), replace(dec, rdma=True), on, 25.0) == 200.0
    assert link_rate(replace(pre, rdma=True), dec, on, 25.0) == 25.0
    assert link_rate(replace(pre, rdma=True), replace(dec, rdma=True), {"p1": 400.0}, None) is None


def test_terminal_prints_both_outputs_and_the_speed_line() -> None:
    world = World(inventory(), corrupt_kv=True)
    code, rec = run_up(world)
    assert code == EXIT_FAILED
    text = terminal_text(rec)
    assert "error: correctness gate: the P/D answer differs" in text
    assert "through the router: ' the the the" in text and "decode alone:" in text
    world = World(
        inventory({"requirements.link_gbps": 100}),
        pull_bytes=50_000_000,
        pull_seconds=0.4,
    )
    code, rec = run_up(world)
    assert code == EXIT_OK
    text = terminal_text(rec)
    assert "KV speed: prefill@p1 -> decode@d1: 50.0 MB in 0.400 s = 1.00 Gbit/s" in text
    assert "warning: prefill@p1 -> decode@d1: KV moves at 1% of the link" in text


def terminal_text(rec: Recorder) -> str:
    """What the terminal view prints of the recorded events."""
    import io

    from rich.console import Console

    from pdboot.views.terminal import TerminalView

    out = Console(width=100, file=io.StringIO(), record=True)
    view = TerminalView(out)
    for e in rec.events:
        view(e)
    return out.export_text()
