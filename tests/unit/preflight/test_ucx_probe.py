"""The after-pull UCX check (issue 32, item 9): NIXL's UCX backend created with each
engine's own UCX environment and devices, so an unusable UCX_NET_DEVICES fails before any
engine starts, naming what the container sees; `rdma: auto` falls back to TCP there."""

from __future__ import annotations

from pdboot import events as ev
from pdboot.deploy.preflight_gate import PreflightOutcome
from pdboot.deploy.up import up
from pdboot.deploy.up_options import UpOptions
from pdboot.plan.build import build_plan
from pdboot.plan.facts import PlanFacts
from pdboot.preflight import ucx_probe as u
from tests.unit.orchestrator_fakes import Recorder, World, inventory

# the error a UCX backend gives for devices it lacks (the report: UCX's
# "network devices ... are not available", then NIXL's NIXL_ERR_BACKEND)
SEES_NO_IB = (
    0,
    "UCX  ERROR network devices 'mlx5_0:1' are not available\n"
    'PDBOOT_UCX {"backend": false, "error": "nixlBackendError: NIXL_ERR_BACKEND", '
    '"ib": [], "net": ["eth0", "lo"], "uverbs": false}\n',
)
FINDINGS = PlanFacts(
    rdma_present={"p1": True, "d1": True},
    rdma_ports={"p1": ["mlx5_0:1"], "d1": ["mlx5_0:1"]},
    source="preflight",
)


def test_the_probe_runs_the_engines_own_ucx_environment_and_devices() -> None:
    inv = inventory()
    plan = build_plan(inv, FINDINGS)
    svc = next(s for s in plan.engines if s.host == "p1")
    argv = u.argv(svc)
    assert "UCX_NET_DEVICES=mlx5_0:1" in argv
    assert argv[argv.index("--device") + 1] == "/dev/infiniband:/dev/infiniband"
    assert "--cap-add" in argv and "IPC_LOCK" in argv and "--gpus" in argv
    assert argv[argv.index("--network") + 1] == "host"


def test_a_refused_backend_names_what_the_container_sees() -> None:
    seen = u.parse(SEES_NO_IB[1])
    r = u.verdict(seen, ("prefill@p1",), {"UCX_NET_DEVICES": "mlx5_0:1"})
    assert r.status == "fail" and "UCX_NET_DEVICES=mlx5_0:1" in r.message
    assert "NIXL_ERR_BACKEND" in r.message and "network devices eth0, lo" in r.message
    assert "RDMA ports none" in r.message and "kv_transfer.ucx.net_devices" in r.fix
    assert u.parse("Traceback ...\nImportError: no nixl", 1).problem.startswith(
        "the UCX probe did not answer (exit 1)"
    )


def _up(world: World, findings: PlanFacts) -> tuple[int, Recorder]:
    rec = Recorder()
    code = up(world.inv, UpOptions(), rec,
              preflight=lambda _i, _a: PreflightOutcome(True, findings),
              clock=world.clock, hosts_factory=world.hosts, fetch=world.fetch,
              lock_factory=world.take_lock)  # fmt: skip
    return code, rec


def test_rdma_auto_falls_back_to_tcp_where_the_container_cannot_use_rdma() -> None:
    world = World(inventory(), ucx={"p1": ("mlx5_0", SEES_NO_IB)})
    code, rec = _up(world, FINDINGS)
    assert code == 0
    notes = [n.message for n in rec.of(ev.Note) if n.level == "warn"]
    assert any("rdma auto: p1" in n and "KV goes over TCP" in n for n in notes), notes
    # probed twice on p1 (RDMA, then TCP), once on d1; the engine on p1 runs without RDMA
    probes = [(h, w) for op, h, w in world.calls if op == "ucx_probe"]
    assert [h for h, _ in probes].count("p1") == 2 and "mlx5_0:1" not in probes[-1][1]
    # the record shipped says so, for the next `up` and `status` without preflight
    assert '"rdma": false' in world.shipped["p1"]["rdma.json"]
    assert '"rdma": true' in world.shipped["d1"]["rdma.json"]


def test_an_unusable_choice_fails_before_any_engine_starts() -> None:
    inv = inventory()
    kv = inv.kv_transfer.model_copy(update={"rdma": "on"})  # asked for: no fallback
    world = World(inv.model_copy(update={"kv_transfer": kv}), ucx={"p1": ("mlx5_0", SEES_NO_IB)})
    code, rec = _up(world, FINDINGS)
    assert code == 1
    assert rec.of(ev.ServiceStarted) == [] and world.containers == {}
    failed = [c for c in rec.of(ev.ImageCheck) if c.status == "fail"]
    assert [c.check for c in failed] == ["docker.ucx_devices"] and failed[0].host == "p1"
    assert "network devices eth0, lo" in failed[0].message
    assert "UCX check failed: nothing was started" in rec.of(ev.Note)[-1].message


def test_ucx_saying_a_device_is_not_available_fails_even_if_it_starts() -> None:
    """UCX may only warn of UCX_NET_DEVICES it cannot use and start without them."""
    text = (
        "[1764885000.1] ucp_context.c:1123 UCX  WARN  network device 'mlx5_0:1' is not "
        "available, please use one or more of: 'eth0'(tcp), 'lo'(tcp)\n"
        'PDBOOT_UCX {"backend": true, "ib": [], "net": ["eth0", "lo"], "uverbs": false}\n'
    )
    r = u.verdict(u.parse(text), ("decode@d1",), {"UCX_NET_DEVICES": "mlx5_0:1"})
    assert r.status == "fail" and "is not available, please use one or more of" in r.message
    quiet = u.parse('PDBOOT_UCX {"backend": true, "ib": [], "net": ["eth0"], "uverbs": false}')
    assert u.verdict(quiet, ("decode@d1",), {"UCX_NET_DEVICES": "eth0"}).status == "pass"
