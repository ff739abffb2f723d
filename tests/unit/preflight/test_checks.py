"""Preflight verdicts from captured and derived command output (no hosts involved).

The healthy RTX PRO 6000 host (derived/rtx6000x2-r580-healthy.txt) is the base; each
variant file replaces some command outputs; the batch text is rebuilt with the exact
command lines the checks would run, then evaluated like a real run's output.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pdboot.inventory.schema import Requirements
from pdboot.preflight.checks import (
    CheckResult,
    GpuNeed,
    HostContext,
    Probe,
    Section,
    batch_script,
    gpu,
    model,
    network,
    parse_sections,
    rdma,
)
from pdboot.preflight.checks import cuda as cu
from pdboot.preflight.checks import docker as dk
from pdboot.preflight.checks import host as hostc
from pdboot.preflight.checks.facts import HostFacts
from pdboot.preflight.findings import active_ports
from pdboot.preflight.run import DOMAINS, Selection, evaluate_host, rdma_usable
from pdboot.transport.connection import LocalConnection
from tests.unit.paths import FIXTURES, INVENTORIES

FIX = FIXTURES
DERIVED = FIX / "derived"
H200 = FIX / "h200-host"


def sections(path: Path) -> dict[str, Section]:
    return parse_sections(path.read_text(encoding="utf-8", errors="replace"))


def ctx(**kw: object) -> HostContext:
    base: dict[str, object] = dict(
        name="gpu-b",
        roles=("decode",),
        req=Requirements(),
        gpu_needs=(GpuNeed("decode", 2, "all"),),
        ports=((8201, "decode HTTP"), (5601, "decode NIXL side channel")),
        memlock=-1,
        nofile=1048576,
        image="vllm/vllm-openai:v0.33.0",
        model="meta-llama/Llama-3.1-70B-Instruct",
        rdma_devices=("mlx5_0",),
        probes=(Probe("network.side_channel", "gpu-a", "10.0.0.1", 5600, "prefill side channel"),),
    )
    base.update(kw)
    return HostContext(**base)  # type: ignore[arg-type]


PROBE_REFUSED = Section(
    "bash: connect: Connection refused\nbash: line 1: /dev/tcp/10.0.0.1/5600: Connection refused\n"
    "rc=1\n",
    0,
)


def batch(c: HostContext, *variants: str, extra: dict[str, Section] | None = None) -> str:
    """The text a host would print for context ``c``: healthy outputs, overlaid by variants."""
    merged = sections(DERIVED / "rtx6000x2-r580-healthy.txt")
    merged["@probe0"] = PROBE_REFUSED
    for v in variants:
        merged.update(sections(DERIVED / v))
    merged.update(extra or {})
    out = []
    for _, d in DOMAINS:
        for cmd in d.commands(c):
            s = merged.get(cmd.line) or merged.get("@" + cmd.key)
            if s is None:
                continue
            out.append(f"### $ {cmd.line}\n{s.output.rstrip(chr(10))}\n### exit={s.rc}")
    return "\n".join(out) + "\n"


def results(c: HostContext, *variants: str, **kw: object) -> dict[str, list[CheckResult]]:
    res, _ = evaluate_host(c, batch(c, *variants, **kw))  # type: ignore[arg-type]
    by: dict[str, list[CheckResult]] = {}
    for r in res:
        by.setdefault(r.id, []).append(r)
    return by


def status(by: dict[str, list[CheckResult]], cid: str) -> str:
    return by[cid][0].status


# --------------------------------------------------------------------------- whole hosts


def test_healthy_rtx6000_host_passes_everything() -> None:
    by = results(ctx())
    bad = {k: [r.message for r in v] for k, v in by.items() if any(r.status != "pass" for r in v)}
    assert bad == {}
    assert "2 GPU(s)" in by["gpu.count"][0].message
    assert "driver 580.95.05" in by["gpu.driver"][0].message
    assert "InfiniBand, 400 Gb/sec" in by["rdma.link"][0].message
    # 70B bf16 on 2 x 96 GB: the KV estimate of the facts sheet, at the measured rate
    kv = by["model.kv_transfer"][0].message
    assert "327,680 bytes/token" in kv and "~3.1 GiB per 10k-token prompt" in kv  # 3.28e9 bytes
    assert "at 400 Gb/s" in kv


@pytest.mark.parametrize(
    ("variants", "kw", "expect"),
    [
        (
            ["r550-old-driver.txt"],
            {},
            {"gpu.driver": "fail", "gpu.cuda": "fail", "docker.image_cuda": "fail"},
        ),
        (["r570-cuda13-compat.txt"], {}, {"gpu.driver": "fail", "gpu.cuda": "pass"}),
        (["mig-enabled.txt"], {}, {"gpu.mig": "fail"}),
        (["gpu-busy.txt"], {}, {"gpu.memory_free": "warn"}),
        (["ecc-errors.txt"], {}, {"gpu.ecc": "fail"}),
        (["workstation-na.txt"], {}, {"gpu.mig": "pass", "gpu.ecc": "pass", "gpu.count": "fail"}),
        (["no-driver.txt"], {}, {"gpu.nvidia_smi": "fail"}),
        (["driver-not-loaded.txt"], {}, {"gpu.nvidia_smi": "fail"}),
        (["ib-port-down.txt"], {}, {"rdma.ports": "warn"}),
        (["ib-port-down.txt"], {"req": Requirements(rdma="required")}, {"rdma.ports": "fail"}),
        (["no-rdma.txt"], {"rdma_devices": ()}, {"rdma.devices": "warn"}),
        (["no-rdma.txt"], {"rdma_mode": "on", "rdma_devices": ()}, {"rdma.devices": "fail"}),
        (
            ["roce.txt"],
            {"rdma_devices": (), "ucx_net_devices": "mlx5_1:1,ens1f0np0"},
            {"rdma.ports": "pass", "rdma.ucx_devices": "pass"},
        ),
        ([], {"ucx_net_devices": "mlx5_9:1"}, {"rdma.ucx_devices": "fail"}),
        (["bluefield.txt"], {"rdma_devices": ()}, {"rdma.devices": "pass", "rdma.ports": "pass"}),
        (
            ["bluefield.txt"],
            {"rdma_devices": (), "ucx_net_devices": "all"},
            {"rdma.ucx_devices": "warn"},
        ),
        (
            ["bluefield.txt"],
            {"rdma_devices": (), "ucx_net_devices": "mlx5_2:1"},
            {"rdma.ucx_devices": "fail"},
        ),
        (
            ["bluefield.txt"],
            {"rdma_devices": (), "ucx_net_devices": "mlx5_0:1"},
            {"rdma.ucx_devices": "pass"},
        ),
        (
            ["docker-text-no-nvidia.txt"],
            {},
            {"docker.nvidia_runtime": "fail", "docker.engine": "pass"},
        ),
        (["docker-permission-denied.txt"], {}, {"docker.engine": "fail"}),
        (["docker-compose-missing.txt"], {}, {"docker.compose": "fail"}),
        (["testbed-limits.txt"], {}, {"host.ulimits": "fail", "docker.nvidia_runtime": "pass"}),
        (["testbed-limits.txt"], {"memlock": 8388608, "nofile": 20000}, {"host.ulimits": "warn"}),
        (
            ["port-taken.txt"],
            {"roles": ("prefill",), "ports": ((8200, "prefill HTTP"),)},
            {"host.ports": "fail"},
        ),
        (
            ["low-disk.txt"],
            {},
            {"host.disk_docker": "fail", "host.disk_hf_cache": "fail", "host.shm": "warn"},
        ),
        ([], {"gpu_needs": (GpuNeed("decode", 1, "all"),)}, {"model.weights": "fail"}),
        ([], {"gpu_needs": (GpuNeed("decode", 4, (0, 1, 2, 3)),)}, {"gpu.count": "fail"}),
        (
            [],
            {"req": Requirements(gpu_name="H200", compute_capability="9.0")},
            {"gpu.model": "warn", "gpu.compute_cap": "warn"},
        ),
    ],
)
def test_variant_verdicts(
    variants: list[str], kw: dict[str, object], expect: dict[str, str]
) -> None:
    by = results(ctx(**kw), *variants)
    got = {k: status(by, k) for k in expect}
    assert got == expect, {k: by[k][0].message for k in expect}


def test_messages_carry_the_measured_values_and_a_fix() -> None:
    by = results(ctx(), "r570-cuda13-compat.txt")
    drv = by["gpu.driver"][0]
    assert "570.195.03" in drv.message and "580.65.06" in drv.message and drv.fix
    busy = results(ctx(), "gpu-busy.txt")["gpu.memory_free"][0]
    assert "pid 48213" in busy.message and "81920 MiB" in busy.message
    port = results(ctx(roles=("prefill",), ports=((8200, "prefill HTTP"),)), "port-taken.txt")[
        "host.ports"
    ][0]
    assert "8200" in port.message and "python3 (pid 5512)" in port.message
    lim = results(ctx(), "testbed-limits.txt")["host.ulimits"][0]
    assert "8388608" in lim.message and "RDMA" in lim.message


def test_malformed_output_never_crashes_and_says_could_not_parse() -> None:
    by = results(ctx(), "malformed.txt")
    assert status(by, "gpu.nvidia_smi") == "fail"
    assert "could not parse" in by["gpu.nvidia_smi"][0].message
    assert "NVIDIA RTX PRO 6000 Blac" in by["gpu.nvidia_smi"][0].message  # the first lines
    assert "could not parse" in by["docker.engine"][0].message
    assert "could not parse" in by["host.disk"][0].message
    assert "could not parse" in by["host.ports"][0].message
    assert by["network.side_channel"][0].status == "fail"


def test_empty_output_never_crashes() -> None:
    c = ctx()
    res, facts = evaluate_host(c, "")
    assert res and all(r.status in ("fail", "warn", "skip", "pass") for r in res)
    assert facts.network is not None and facts.network.clock is None


def test_unreachable_probe_fails_and_refused_passes() -> None:
    to = Section("rc=124\n", 0)
    unreach = Section("bash: connect: No route to host\nrc=1\n", 0)
    assert status(results(ctx(), extra={"@probe0": to}), "network.side_channel") == "fail"
    assert status(results(ctx(), extra={"@probe0": unreach}), "network.side_channel") == "fail"
    assert status(results(ctx()), "network.side_channel") == "pass"


def test_selection_filters_commands_and_results() -> None:
    c = ctx()
    sel = Selection.of(only=["gpu.driver", "host"])
    res, _ = evaluate_host(c, batch(c), sel)
    assert {r.area for r in res} == {"gpu", "host"}
    assert {r.id for r in res if r.area == "gpu"} == {"gpu.driver"}
    skip = Selection.of(skip=["rdma", "gpu.ecc"])
    res2, _ = evaluate_host(c, batch(c), skip)
    assert not any(r.area == "rdma" or r.id == "gpu.ecc" for r in res2)
    assert Selection.of(only=["gpux"]).unknown() == ["gpux"]


def test_a_bluefield_dpu_port_is_never_chosen_for_kv() -> None:
    c = ctx(rdma_devices=())
    res, facts = evaluate_host(c, batch(c, "bluefield.txt"))
    assert facts.rdma is not None
    assert facts.rdma.active_ports() == ["mlx5_0:1", "mlx5_1:1"]  # mlx5_2 (41692) left out
    assert facts.rdma.dpus == (("mlx5_2", "BlueField-3"),)
    dev = next(r for r in res if r.id == "rdma.devices")
    assert "mlx5_2 (BlueField-3 DPU) left out: never chosen for KV" in dev.message
    assert "mlx5_2" not in next(r for r in res if r.id == "rdma.ports").message


def test_the_management_nics_port_is_never_chosen_for_kv() -> None:
    c = ctx(rdma_devices=(), address="10.0.0.2")
    res, facts = evaluate_host(c, batch(c, "roce.txt", "mgmt-nic.txt"))
    assert facts.rdma is not None
    # ens1f0np0 (mlx5_0) carries the default route: only mlx5_1 is left for KV
    assert active_ports(facts) == ["mlx5_1:1"]
    assert facts.rdma.mgmt == (("mlx5_0", "ens1f0np0 carries the default route"),)
    dev = next(r for r in res if r.id == "rdma.devices")
    assert "mlx5_0 (ens1f0np0 carries the default route) left out" in dev.message
    assert "mlx5_0" not in next(r for r in res if r.id == "rdma.ports").message


def test_without_the_netdev_mapping_nothing_is_left_out() -> None:
    # the testbed's and most captures' case: no /sys/class/infiniband/*/device/net links
    c = ctx(rdma_devices=(), address="10.0.0.2")
    text = batch(c, "roce.txt", "mgmt-nic.txt").replace("ibnet=", "gone=")
    res, facts = evaluate_host(c, text)
    assert active_ports(facts) == ["mlx5_0:1", "mlx5_1:1"]
    assert {r.id: r.status for r in res if r.area == "rdma"}["rdma.devices"] == "pass"


def test_the_management_nic_by_the_inventory_address() -> None:
    net = rdma.NetMap((("mlx5_0", "eno1"), ("mlx5_1", "ens2")), ("eno2",), (("eno1", "10.1.0.5"),))
    assert net.management("10.1.0.5") == {"mlx5_0": "eno1 has the host's address 10.1.0.5"}
    assert net.management("gpu-b.example") == {}  # a name: unknown, nothing left out
    assert rdma.NetMap((), ("eno1",), ()).management("") == {}  # no mapping: unknown


def test_an_ipv6_default_route_counts_a_reject_route_does_not() -> None:
    zero = "0" * 32
    text = (
        "ibnet=/sys/class/infiniband/mlx5_3/device/net/eno3\n"
        f"{zero} 00 {zero} 00 fd00{'0' * 27}1 00000400 00000002 00000000 00000003     eno3\n"
        f"{zero} 00 {zero} 00 {zero} ffffffff 00000001 00000000 00200200       lo\n"
    )
    net = rdma.parse_mgmt(text)
    assert net.default_ifaces == ("eno3",)
    assert net.management("") == {"mlx5_3": "eno3 carries the default route"}


@pytest.mark.parametrize(
    "kw, key",
    [
        ({"ucx_net_devices": "mlx5_0:1"}, "kv_transfer.ucx.net_devices"),
        ({"ucx_net_devices": "mlx5_1:1,ens1f0np0"}, "kv_transfer.ucx.net_devices"),
        ({"rdma_devices": ("mlx5_0",)}, "hosts.<name>.rdma_devices"),
    ],
)
def test_naming_the_management_nic_fails_with_the_fix(kw: dict[str, object], key: str) -> None:
    c = ctx(**{"rdma_devices": (), "address": "10.0.0.2", **kw})
    res, _ = evaluate_host(c, batch(c, "roce.txt", "mgmt-nic.txt"))
    bad = [r for r in res if r.status == "fail"]
    assert len(bad) == 1 and "the management NIC" in bad[0].message
    assert bad[0].fix is not None and key in bad[0].fix


def test_rdma_present_follows_the_port_state() -> None:
    c = ctx()
    assert rdma_usable(c, evaluate_host(c, batch(c))[1]) is True
    assert rdma_usable(c, evaluate_host(c, batch(c, "ib-port-down.txt"))[1]) is False
    assert rdma_usable(c, evaluate_host(c, batch(c, "no-rdma.txt"))[1]) is False


# ------------------------------------------------------------------ parsers on the real capture


def test_gpu_query_on_the_real_h200_capture() -> None:
    s = sections(H200 / "smi.txt")
    full = next(v for k, v in s.items() if k.endswith("--format=csv") and "pcie" in k)
    g = gpu.parse_query(full.output)  # header line and units: names come from the header
    assert (g[0].name, g[0].mem_total_mib, g[0].compute_cap) == ("NVIDIA H200", 143771, "9.0")
    assert (g[0].mig, g[0].ecc_uncorrected, g[0].mem_free_mib) == ("Disabled", 0, 143156)
    short = s[
        "nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total,compute_cap "
        "--format=csv,noheader,nounits"
    ]
    g2 = gpu.parse_query(
        short.output, ("index", "name", "uuid", "driver_version", "memory.total", "compute_cap")
    )
    assert g2[0].driver == "580.159.04"
    assert gpu.parse_versions(s["nvidia-smi --version"].output) == ("580.159.04", "13.0")
    assert gpu.parse_versions(s["nvidia-smi"].output) == ("580.159.04", "13.0")  # the table
    apps = s["nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv"]
    assert apps.output.startswith("pid")


def test_kernel_module_version_from_the_real_capture() -> None:
    s = sections(H200 / "host.txt")
    assert gpu.parse_kmod(s["cat /proc/driver/nvidia/version"].output) == "580.159.04"


def test_rdma_on_the_real_h200_capture_has_no_uverbs() -> None:
    s = sections(H200 / "host.txt")
    listing = next(v for k, v in s.items() if k.startswith("ls -la /dev/infiniband"))
    assert "rdma_cm" in listing.output
    assert not [d for d in rdma.parse_devices("rdma_cm\n") if d.startswith("uverbs")]
    missing = s["ibv_devinfo -v"]
    assert missing.rc == 127
    with pytest.raises(Exception):  # "command not found" is not ibv_devinfo output
        rdma.parse_ibv_devinfo(missing.output)


def test_df_rows_from_the_real_capture() -> None:
    s = sections(H200 / "host.txt")
    text = next(v for k, v in s.items() if k.startswith("ulimit -a")).output
    # df -h (not -Pk) rows have sizes like 252G: not parsed as numbers, never a crash
    assert hostc.parse_df(text) == []


def test_variants_capture_errors_are_reported_not_raised() -> None:
    s = sections(H200 / "variants.txt")
    bad = s["nvidia-smi --query-gpu=index,not_a_field --format=csv"]
    assert bad.rc == 2
    c = ctx(gpu_needs=(GpuNeed("decode", 1, "all"),))
    only = {"query": bad, "kmod": Section("", 1), "apps": Section("", 0), "version": Section("", 0)}
    res = gpu.evaluate(c, HostFacts(gpu=gpu.parse(c, only)))
    assert res[0].id == "gpu.nvidia_smi" and res[0].status == "fail"
    assert "not a valid field" in res[0].message
    none = s["nvidia-smi -i 5 --query-gpu=index --format=csv,noheader"]
    assert none.rc == 6 and "No devices were found" in none.output


def test_r610_header_spelling() -> None:
    s = sections(DERIVED / "r610-header.txt")
    assert gpu.parse_versions(s["nvidia-smi"].output) == ("610.23.01", "13.2")
    assert gpu.parse_versions(s["nvidia-smi --version"].output) == ("610.23.01", "13.2")


def test_docker_info_json_and_text_agree() -> None:
    js = sections(DERIVED / "rtx6000x2-r580-healthy.txt")[dk.INFO].output
    txt = sections(DERIVED / "docker-text-no-nvidia.txt")[dk.INFO].output
    a, b = dk.parse_info(js), dk.parse_info(txt)
    assert (a.server_version, a.root_dir, "nvidia" in a.runtimes) == (
        "28.2.2",
        "/var/lib/docker",
        True,
    )
    assert (b.server_version, b.root_dir, b.runtimes) == (
        "27.5.1",
        "/srv/docker",
        ("io.containerd.runc.v2", "runc"),
    )


def test_dockerd_scan_picks_the_engine_behind_docker_host() -> None:
    scan = dk.parse_dockerd(sections(DERIVED / "testbed-limits.txt")["@dockerd"].output)
    proc = scan.serving()
    assert proc is not None and proc.pid == 40190 and proc.hooks
    assert proc.memlock_hard == 8388608 and proc.nofile_hard == 20000
    assert not proc.can_raise_limits


def test_image_cuda_from_env_or_tag() -> None:
    env = sections(DERIVED / "rtx6000x2-r580-healthy.txt")["@image"].output
    assert cu.parse_image_env(env) == "13.0"
    assert cu.cuda_from_tag("vllm/vllm-openai:cu128-nightly", "13.0")[0] == "12.8"
    assert cu.cuda_from_tag("10.77.0.1:5000/vllm/vllm-openai:v0.33.0", "13.0")[0] == "13.0"
    assert cu.driver_floor("12.4") == ("550.54.14", True)
    assert cu.driver_floor("13.0") == ("580.65.06", True)


def test_kv_estimate_matches_the_facts_sheet() -> None:
    cfg = sections(DERIVED / "rtx6000x2-r580-healthy.txt")["@config"].output
    f = model.parse_config(cfg)
    assert f.kv_bytes_per_token == 327_680
    assert 140e9 < f.weights_bytes < 142e9  # ~141 GB of bf16 weights
    msg = model.kv_info(f, 100.0).message
    assert "~3.1 GiB per 10k-token prompt; ~0.26 s at 100 Gb/s" in msg


def test_batch_script_round_trip_through_bash() -> None:
    from pdboot.preflight.checks import Command

    cmds = [
        Command("a", "echo hello; echo err >&2", "host"),
        Command("b", "exit 3", "host"),
        Command("c", "printf '%s\\n' \"it's\"", "host"),
        Command("d", "printf 'no newline'", "host"),
    ]
    out = LocalConnection("t").run(batch_script(cmds)).stdout
    s = parse_sections(out)
    assert s[cmds[0].line] == Section("hello\nerr\n", 0)
    assert s[cmds[1].line].rc == 3
    assert s[cmds[2].line].output == "it's\n"
    assert s[cmds[3].line] == Section("no newline\n", 0)


def test_json_shape_is_the_documented_one() -> None:
    from pdboot.preflight.run import HostReport, PreflightResult

    r = PreflightResult(
        {
            "a": HostReport("a", True, [CheckResult("gpu.driver", "pass", "ok")]),
            "b": HostReport("b", False, [CheckResult("ssh.connect", "fail", "timeout", "fix")]),
        }
    )
    d = json.loads(json.dumps(r.as_json()))
    assert d == {
        "ok": False,
        "hosts": {
            "a": {
                "reachable": True,
                "checks": [{"id": "gpu.driver", "status": "pass", "message": "ok", "fix": ""}],
            },
            "b": {
                "reachable": False,
                "checks": [
                    {"id": "ssh.connect", "status": "fail", "message": "timeout", "fix": "fix"}
                ],
            },
        },
    }


def test_report_puts_failures_first_with_the_fix_under_them() -> None:
    from rich.console import Console

    from pdboot.preflight.run import HostReport, PreflightResult
    from pdboot.views import preflight as report

    checks = [
        CheckResult("ssh.connect", "pass", "connected"),
        CheckResult("gpu.driver", "pass", "driver 580.95.05"),
        CheckResult("host.ports", "pass", "ports free"),
        CheckResult("host.disk_docker", "fail", "3.0 GiB free", "free space on /"),
        CheckResult("rdma.ports", "warn", "mlx5_0 port 1: PORT_DOWN", "check the cable"),
    ]
    ordered = [c.id for c in report.ordered(checks)]
    assert ordered == ["ssh.connect", "host.disk_docker", "host.ports", "rdma.ports", "gpu.driver"]
    res = PreflightResult({"gpu-a": HostReport("gpu-a", True, checks)})
    console = Console(record=True, width=200, color_system=None)
    report.print_report(res, console)
    text = console.export_text()
    lines = text.splitlines()
    fail_at = next(i for i, ln in enumerate(lines) if "host.disk_docker" in ln)
    assert "fix: free space on /" in lines[fail_at + 1]
    assert lines[-1].startswith("FAIL: 1 failure on gpu-a")
    ok = PreflightResult({"a": HostReport("a", True, checks[:3])})
    assert report.verdict(ok) == "PASS: 1 host(s) ready for `pdboot up`"
    down = PreflightResult({"b": HostReport("b", False, [CheckResult("ssh.connect", "fail", "x")])})
    assert report.verdict(down).startswith("FAIL: 1 failure on b (unreachable: b); fix them")


def test_contexts_follow_the_inventory() -> None:
    from pdboot.inventory.load import load_inventory
    from pdboot.preflight.contexts import contexts
    from pdboot.preflight.run import host_commands

    inv = load_inventory(INVENTORIES / "2p2d.yaml")
    c = contexts(inv)
    assert list(c) == ["d1", "d2", "p1", "p2", "edge"]
    d1, p1, edge = c["d1"], c["p1"], c["edge"]
    assert d1.roles == ("decode",) and d1.gpu_host and not edge.gpu_host
    assert d1.gpu_needs == (GpuNeed("decode", 4, "all"),)
    assert p1.gpu_needs == (GpuNeed("prefill", 2, (0, 1)),)
    assert (8201, "decode HTTP") in d1.ports and (5601, "decode NIXL side channel") in d1.ports
    # proxy, router (loopback), metrics, and the swap router's two (deploy/router_swap.py)
    assert {p for p, _ in edge.ports} == {80, 8081, 29000, 8082, 29001}
    # decode pulls KV from every prefill host; the router reaches every engine
    assert [(p.address, p.port) for p in d1.probes] == [("10.0.0.11", 5600), ("10.0.0.12", 5600)]
    assert {(p.address, p.port) for p in edge.probes} == {
        ("10.0.0.21", 8201),
        ("10.0.0.22", 8201),
        ("10.0.0.11", 8200),
        ("10.0.0.12", 8200),
    }
    assert d1.rdma_required and d1.shm_size_bytes == 32 << 30 and d1.hf_cache == "/data/hf"
    # the router host runs no GPU, RDMA or model commands
    areas = {cmd.area for cmd in host_commands(edge)}
    assert areas == {"docker", "host", "network"}
    # a value from the inventory reaching the remote shell is quoted
    odd = contexts(inv.model_copy(update={"model": "x'; rm -rf / #"}))["d1"]
    line = next(cmd.line for cmd in host_commands(odd) if cmd.key == "config")
    assert "m='x'\"'\"'; rm -rf / #'" in line


def test_probe_addresses_cannot_inject_shell() -> None:
    from pdboot.transport.connection import LocalConnection

    bad = Probe("network.ingress", "x", "127.0.0.1/1;touch /tmp/pdboot-pwned;#", 1, "x")
    out = LocalConnection("t").run(network.probe_command(bad)).stdout
    assert not Path("/tmp/pdboot-pwned").exists()
    assert network.parse_probe(out)[0] == "unreachable"
    ok = Probe("network.ingress", "x", "127.0.0.1", 9, "discard")
    verdict, _ = network.parse_probe(LocalConnection("t").run(network.probe_command(ok)).stdout)
    assert verdict in ("refused", "open")


def test_a_verdict_that_raises_is_reported_and_the_others_still_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(*_: object) -> list[CheckResult]:
        raise KeyError("surprise")

    monkeypatch.setattr(hostc, "evaluate", broken)
    c = ctx()
    res, _ = evaluate_host(c, batch(c))
    ids = {r.id: r for r in res}
    assert ids["host.evaluate"].status == "fail" and "surprise" in ids["host.evaluate"].message
    assert ids["gpu.driver"].status == "pass" and ids["network.side_channel"].status == "pass"


@pytest.mark.parametrize(
    ("output", "status"),
    [("2.40.3\n", "pass"), ("v2.24.0\n", "pass"), ("2.21.0\n", "fail"), ("1.29.2\n", "fail")],
)
def test_compose_needs_the_env_file_syntax_the_render_uses(output: str, status: str) -> None:
    # The rendered env_file entries (path + required) need Compose 2.24 or newer.
    assert dk._compose(dk.parse_compose(Section(output, 0))).status == status


def test_dockerd_limits_are_judged_even_when_the_docker_cli_is_refused() -> None:
    # The CLI's socket is refused, yet dockerd runs and /proc shows its limits: the old
    # wiring skipped host.ulimits saying "dockerd process not found", which was false.
    by = results(ctx(), "docker-permission-denied.txt")
    assert status(by, "docker.engine") == "fail"
    assert status(by, "host.ulimits") == "pass"
    assert "dockerd hard limits" in by["host.ulimits"][0].message


def test_facts_are_typed_and_kept() -> None:
    c = ctx()
    _, facts = evaluate_host(c, batch(c))
    assert facts.gpu is not None and facts.rdma is not None and facts.docker is not None
    g = facts.gpu.gpus[0]
    assert (g.index, g.compute_cap, g.mig, g.ecc_uncorrected) == (0, "12.0", "Disabled", 0)
    assert g.uuid.startswith("GPU-") and g.mem_total_mib > 90_000
    assert facts.gpu.driver == "580.95.05" and facts.gpu.cuda == "13.0"
    assert [(p.device, p.port, p.state, p.link_layer) for p in facts.rdma.ports] == [
        ("mlx5_0", 1, "ACTIVE", "InfiniBand")
    ]
    assert facts.rdma.active_ports() == ["mlx5_0:1"] and facts.rdma.link_gbps() == 400.0
    assert facts.docker.info is not None and "nvidia" in facts.docker.info.runtimes
    assert facts.docker.compose.version is not None and facts.docker.compose.version >= (2, 24)
    assert facts.host is not None and facts.host.listeners is not None
    assert facts.network is not None and facts.network.probes[0].verdict == "refused"
    assert facts.model is not None and facts.model.config is not None
    assert facts.model.config.kv_bytes_per_token > 0
    down = evaluate_host(c, batch(c, "ib-port-down.txt"))[1].rdma
    assert down is not None and down.active_ports() == [] and not down.usable
