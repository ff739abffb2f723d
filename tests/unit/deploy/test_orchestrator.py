"""`up` and `down` driven through their injection points with fake hosts, a fake engine, a
fake HTTP function and a fake clock: stage order, parallel tiers, fail-fast, deadline,
rollback, Ctrl-C, converge decisions and the event stream, in milliseconds."""

from __future__ import annotations

from pdboot import events as ev
from pdboot.deploy.down import DownOptions
from pdboot.deploy.preflight_gate import PreflightOutcome
from pdboot.deploy.up_options import UpOptions
from tests.unit.orchestrator_fakes import CAPS, Recorder, World, inventory, run_down, run_up, up_in

OOM = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
UNCHANGED_1P1D = {
    "decode@d1": "unchanged",
    "prefill@p1": "unchanged",
    "router@r": "unchanged",
    "proxy@r": "unchanged",
}


def actions(rec: Recorder) -> dict[str, str]:
    """The converge table: service -> its action."""
    return {e.service: e.action for e in rec.of(ev.ServiceAction)}


def test_fresh_up_stage_order_and_event_stream() -> None:
    world = World(inventory())
    code, rec = run_up(world)
    assert code == 0
    stages = [e.stage for e in rec.of(ev.StageStarted)]
    assert stages == [
        "pull",
        "ship",
        "converge",
        *["start", "wait"] * 3,
        "prove",
    ]  # engines, router, then the proxy in front
    started = [e.service for e in rec.of(ev.ServiceStarted)]
    assert set(started[:2]) == {"decode@d1", "prefill@p1"} and started[2] == "router@r"
    ready = [e.service for e in rec.of(ev.ServiceReady)]
    assert ready[-2:] == ["router@r", "proxy@r"] and set(ready[:2]) == {"decode@d1", "prefill@p1"}
    assert [e.action for e in rec.of(ev.ServiceAction)] == ["create"] * 4
    pulls = rec.of(ev.PullDone)
    assert {(p.host, p.pulled) for p in pulls} == {("d1", True), ("p1", True), ("r", True)}
    assert all(p.bytes == 1024 and p.digest and p.digest.startswith("sha256:ab") for p in pulls)
    (kv,) = rec.of(ev.KVVerdict)
    assert kv.ok and kv.confirmed and kv.completion == "Hello!"
    (endpoint,) = rec.of(ev.Endpoint)
    assert endpoint.url == "http://192.0.2.12:8000/v1" and endpoint.curl.startswith("curl ")
    assert isinstance(rec.events[-1], ev.Done) and rec.events[-1].exit_code == 0
    # the router is started only once every engine answered
    ops = [(op, what) for op, _h, what in world.calls if op == "compose_up"]
    assert ops[-2:] == [("compose_up", "router"), ("compose_up", "proxy")] and len(ops) == 4


def test_time_to_ready_is_the_slowest_tier_not_the_sum() -> None:
    world = World(inventory(), load={"decode": 15.0, "prefill": 20.0})
    code, rec = run_up(world)
    assert code == 0
    engines, router, _proxy = rec.of(ev.TierReady)
    assert engines.tiers == ("decode", "prefill")
    assert 20.0 <= engines.seconds <= 20.5  # one poll interval at most; sequential was 35
    assert router.tiers == ("router",) and router.seconds <= 0.5


def test_crashed_tier_fails_fast_with_logs_and_diagnosis() -> None:
    world = World(inventory(), load={"decode": 30.0, "prefill": 30.0}, crash={"prefill": OOM})
    code, rec = run_up(world)
    assert code == 1
    (f,) = rec.of(ev.Failure)
    assert f.service == "prefill@p1" and f.exited and "exit code 1" in f.message
    assert f.log_lines[-1] == OOM and f.diagnosis and "GPU ran out of memory" in f.diagnosis[0]
    assert world.clock.now() < 1.0  # stopped on the exit, not at the decode's load time
    assert ("compose_up", "r", "router") not in world.calls
    assert len(world.of_role("decode")) == 1  # left in place for inspection
    assert "left in place" in rec.of(ev.Note)[-1].message
    done = rec.events[-1]
    assert done == ev.Done("up", 1, done.seconds, f"up failed after {done.seconds:.1f}s")  # type: ignore[attr-defined]


def test_deadline_names_the_service_and_keeps_the_rest() -> None:
    world = World(inventory(), never_healthy={"decode"})
    code, rec = run_up(world)
    assert code == 1
    (f,) = rec.of(ev.Failure)
    assert f.service == "decode@d1" and not f.exited
    assert f.message.startswith("decode@d1: no /health 200 within 60s")
    assert 60.0 <= world.clock.now() <= 60.5
    assert not world.of_role("router")


def test_rollback_removes_everything_started() -> None:
    world = World(inventory(), crash={"decode": OOM})
    code, rec = run_up(world, UpOptions(skip_preflight=True, rollback=True))
    assert code == 1
    assert len(rec.of(ev.Rollback)) == 1
    assert [s.role for s in rec.of(ev.Stopped)] == ["prefill", "decode"]
    assert world.containers == {}
    assert any(op == "run" and "secrets.env" in what for op, _h, what in world.calls)


def test_ctrl_c_while_waiting_reports_what_runs() -> None:
    world = World(inventory(), interrupt_on=":8201/health")
    code, rec = run_up(world)
    assert code == 130
    (i,) = rec.of(ev.Interrupted)
    assert i.started and {k for k, _ in i.running} == {"decode@d1", "prefill@p1"}
    assert rec.events[-1].exit_code == 130  # type: ignore[attr-defined]


def test_second_up_leaves_everything_unchanged() -> None:
    world = World(inventory())
    assert run_up(world)[0] == 0
    before = set(world.containers)
    code, rec = run_up(world)
    assert code == 0
    assert [e.action for e in rec.of(ev.ServiceAction)] == ["unchanged"] * 4
    assert set(world.containers) == before
    assert rec.of(ev.ServiceStarted) == []


def test_decode_change_recreates_decode_only() -> None:
    world = World(inventory())
    assert run_up(world)[0] == 0
    prefill, router = world.of_role("prefill")[0].id, world.of_role("router")[0].id
    world.inv = inventory({"decode.extra_args": ["--max-model-len", "4096"]})
    code, rec = run_up(world, UpOptions(skip_preflight=True, yes=True))  # a tier of one
    assert code == 0
    # live workers: the router stays; the decode is deregistered, drained, registered again
    assert actions(rec) == {**UNCHANGED_1P1D, "decode@d1": "recreate"}
    assert world.of_role("prefill")[0].id == prefill and world.of_role("router")[0].id == router
    assert not [n for n in rec.of(ev.Note) if "needing a restart" in n.message]


def test_decode_change_with_static_router_lists_recreates_the_router() -> None:
    static = {"router.live_workers": False}
    world = World(inventory(static))
    assert run_up(world)[0] == 0
    world.inv = inventory({**static, "decode.extra_args": ["--max-model-len", "4096"]})
    code, rec = run_up(world)
    assert code == 0
    assert actions(rec) == {**UNCHANGED_1P1D, "decode@d1": "recreate", "router@r": "recreate"}


def test_failed_preflight_opens_no_host() -> None:
    world = World(inventory())
    rec = Recorder()
    code = up_in(world, UpOptions(), rec, preflight=lambda _inv, _acc: PreflightOutcome(False))
    assert code == 1 and world.calls == []
    assert rec.of(ev.PreflightDone) == [ev.PreflightDone(ok=False)]
    assert world.locks == ["take up", "release up"]  # held around preflight too


def test_a_host_lost_while_waiting_fails_naming_it_not_at_the_deadline() -> None:
    world = World(inventory(), load={"decode": 1.0, "prefill": 30.0}, lost_at={"p1": 5.0})
    code, rec = run_up(world)
    assert code == 1
    (f,) = rec.of(ev.Failure)
    assert f.service == "prefill@p1" and "host p1 lost" in f.message
    assert 5.0 <= world.clock.now() < 6.0  # on the loss, not at the 60 s deadline
    assert f.log_lines[0].startswith("(cannot read logs: p1: host p1 lost")
    assert "prefill@p1 is out of reach (its host was lost)" in rec.of(ev.Note)[-1].message
    assert not world.of_role("router")
    assert world.locks == ["take up", "release up"]


def test_a_busy_lock_with_no_wait_exits_1_naming_the_holder_before_preflight() -> None:
    world = World(inventory(), lock_holder="lock on r held by ann@laptop (`pdboot up`)")
    ran: list[bool] = []
    rec = Recorder()
    code = up_in(
        world,
        UpOptions(no_wait=True),
        rec,
        preflight=lambda _inv, _acc: ran.append(True) or PreflightOutcome(True),
    )
    assert code == 1 and ran == [] and world.calls == []
    (note,) = rec.of(ev.Note)
    assert note.level == "error" and "held by ann@laptop" in note.message
    assert rec.events[-1].exit_code == 1  # type: ignore[attr-defined]
    assert run_down(world, rec, DownOptions(no_wait=True)) == 1
    assert world.calls == []


def _preflighted_up(world: World) -> tuple[int, Recorder]:
    rec = Recorder()
    code = up_in(world, UpOptions(), rec, preflight=lambda _inv, _acc: PreflightOutcome(True))
    return code, rec


def test_image_check_after_the_pull_before_the_ship() -> None:
    world = World(inventory())
    code, rec = _preflighted_up(world)
    assert code == 0
    stages = [e.stage for e in rec.of(ev.StageStarted)]
    assert stages[:4] == ["preflight", "pull", "image_check", "ship"]
    # one probe per engine host, none on the router's; then the image's own parser
    assert sorted(h for op, h, _ in world.calls if op == "run_once") == ["d1", "p1"]
    assert sorted(h for op, h, _ in world.calls if op == "run_once_args") == ["d1", "p1"]
    checks = rec.of(ev.ImageCheck)
    assert {(c.host, c.check, c.status) for c in checks} == {
        (h, c, "pass")
        for h in ("d1", "p1")
        for c in (
            "docker.image_arch",
            "docker.image_nixl",
            "docker.image_args",
            "docker.ucx_devices",
        )
    }  # the last: preflight/ucx_probe.py (tests/unit/preflight/test_ucx_probe.py)


def test_an_argument_the_image_refuses_stops_up_before_any_service_starts() -> None:
    answer = (
        'PDBOOT_ARGS {"engines": {"decode@d1": "vllm: error: unrecognized arguments: '
        '--max-num-inflight-kv-loads 4"}, "version": "0.33.0", "options": '
        '["--max-num-batched-tokens"]}'
    )
    world = World(inventory(), args_probe=(0, answer))
    code, rec = _preflighted_up(world)
    assert code == 1
    assert rec.of(ev.ServiceStarted) == [] and world.containers == {}
    assert not [c for c in world.calls if c[0] in ("ship", "compose_up")]
    (failed,) = [c for c in rec.of(ev.ImageCheck) if c.status == "fail"]
    assert failed.check == "docker.image_args" and failed.host == "d1"
    assert "decode@d1: the image's vLLM 0.33.0 refuses --max-num-inflight-kv-loads" in (
        failed.message
    )
    assert "nothing was started" in rec.of(ev.Note)[-1].message


def test_failing_image_check_stops_up_before_any_service_starts() -> None:
    # an image without torch or nixl (the REAL probe output where neither is installed)
    world = World(inventory(), probe=(0, (CAPS / "no-torch-no-nixl.txt").read_text()))
    code, rec = _preflighted_up(world)
    assert code == 1
    assert rec.of(ev.ServiceStarted) == [] and world.containers == {}
    assert not [c for c in world.calls if c[0] in ("ship", "compose_up")]
    failed = [c for c in rec.of(ev.ImageCheck) if c.status == "fail"]
    assert failed and all(c.fix for c in failed)
    assert "nothing was started" in rec.of(ev.Note)[-1].message
    assert isinstance(rec.events[-1], ev.Done) and rec.events[-1].exit_code == 1


def test_down_router_then_prefill_then_decode() -> None:
    world = World(inventory())
    assert run_up(world)[0] == 0
    rec = Recorder()
    assert run_down(world, rec) == 0
    assert [s.role for s in rec.of(ev.Stopped)] == ["proxy", "router", "prefill", "decode"]
    assert world.containers == {}
    assert rec.events[-1] == ev.Done("down", 0, rec.events[-1].seconds, "removed 4 container(s)")  # type: ignore[attr-defined]
    again = Recorder()
    assert run_down(world, again) == 0
    assert again.events[-1].summary == "nothing of this deployment is running"  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- engines per host


def test_a_hosts_engines_start_in_one_compose_up_and_converge_per_engine() -> None:
    world = World(inventory({"decode.engines_per_host": 3}))
    code, rec = run_up(world)
    assert code == 0
    ups = [(h, what) for op, h, what in world.calls if op == "compose_up"]
    assert ("d1", "decode,decode-1,decode-2") in ups and ups[-2:] == [
        ("r", "router"),
        ("r", "proxy"),
    ]
    assert len(ups) == 4
    started = {e.service for e in rec.of(ev.ServiceStarted)}
    assert {"decode@d1", "decode-1@d1", "decode-2@d1", "prefill@p1"} <= started
    assert len(world.of_role("decode")) == 3

    again = run_up(world)[1]
    assert {e.action for e in again.of(ev.ServiceAction)} == {"unchanged"}

    world.calls.clear()
    world.inv = inventory({"decode.gpus": [[0], [5], [2]]})  # engine 1 moves to GPU 5
    code, rec = run_up(world)
    assert code == 0
    changed = {e.service: e.action for e in rec.of(ev.ServiceAction) if e.action != "unchanged"}
    assert changed == {"decode-1@d1": "recreate"}  # rolled: the router stays
    ups = [(h, what) for op, h, what in world.calls if op == "compose_up"]
    assert ups == [("d1", "decode-1")]
    assert len(world.of_role("decode")) == 3


def test_engines_per_host_all_is_not_deployed_from_a_guess() -> None:
    world = World(inventory({"decode.engines_per_host": "all"}))
    code, rec = run_up(world)
    assert code == 1
    assert any("needs preflight's GPU count" in n.message for n in rec.of(ev.Note))
    assert not [c for c in world.calls if c[0] == "compose_up"]
