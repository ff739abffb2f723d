"""Both images looked up in the testbed's REAL registry before anything is pulled: a tag the
registry lacks fails `pdboot preflight` and stops `pdboot up` with no pull on any host; the
router image is looked up too. Traffic goes only to the testbed's addresses."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.cli import Cli
from tests.testbed.harness import HostSpec, Testbed

pytestmark = [pytest.mark.testbed, pytest.mark.slow]


def _checks(doc: dict[str, Any], host: str, cid: str) -> list[dict[str, str]]:
    return [c for c in doc["hosts"][host]["checks"] if c["id"] == cid]


def _images(bed: Testbed) -> dict[str, list[str]]:
    return {n: h.docker("image", "ls", "-q").stdout.split() for n, h in bed.hosts.items()}


def test_a_missing_tag_fails_preflight_and_up_with_no_pull(
    cli: Cli, make_testbed: Callable[..., Testbed], tmp_path: Path
) -> None:
    bed = make_testbed([HostSpec("p"), HostSpec("d")])
    assert _images(bed) == {"p": [], "d": []}
    missing = f"{bed.registry}/vllm/vllm-openai:v0.33.0-no-such-tag"
    inv = bed.inventory(
        tmp_path / "inv.yaml",
        prefill=["p"],
        decode=["d"],
        router="d",
        overrides={"image": missing},
    )
    res = cli("preflight", str(inv), "--json")
    doc = json.loads(res.stdout)
    assert res.returncode == 1, res.stderr
    for host in ("p", "d"):
        (found,) = _checks(doc, host, "docker.image_exists")
        assert found["status"] == "fail" and "not found" in found["message"], found
        assert "`image`" in found["fix"]
    (router,) = _checks(doc, "d", "docker.router_image")  # the router image IS there
    assert router["status"] == "pass" and bed.router_image in router["message"]
    assert _checks(doc, "p", "docker.router_image") == []  # p runs no router
    (agree,) = _checks(doc, "d", "model.tier_agreement")
    assert agree["status"] == "pass"

    up = cli("up", str(inv))
    assert up.returncode != 0
    assert "docker.image_exists" in up.stdout + up.stderr
    assert _images(bed) == {"p": [], "d": []}  # stopped before any pull

    # the router image is looked up the same way
    inv = bed.inventory(
        tmp_path / "router.yaml",
        prefill=["p"],
        decode=["d"],
        router="d",
        overrides={"router_image": f"{bed.registry}/vllm/vllm-router:v0.0.0-missing"},
    )
    doc = json.loads(cli("preflight", str(inv), "--json", "--only", "docker").stdout)
    (router,) = _checks(doc, "d", "docker.router_image")
    assert router["status"] == "fail" and "v0.0.0-missing" in router["message"]
    (engine,) = _checks(doc, "p", "docker.image_exists")
    assert engine["status"] == "pass"


def test_gpudirect_rdma_follows_the_hosts_kernel_modules(
    cli: Cli, make_testbed: Callable[..., Testbed], tmp_path: Path
) -> None:
    bed = make_testbed(
        [HostSpec("open"), HostSpec("closed", overrides={"kernel_module": "proprietary"})]
    )
    inv = bed.inventory(
        tmp_path / "inv.yaml",
        prefill=["open"],
        decode=["closed"],
        router="open",
        overrides={"kv_transfer": {"rdma": "on"}},
    )
    doc = json.loads(cli("preflight", str(inv), "--json", "--only", "rdma.gpudirect").stdout)
    (ok,) = _checks(doc, "open", "rdma.gpudirect")
    assert ok["status"] == "pass" and "dma-buf" in ok["message"], ok
    (warn,) = _checks(doc, "closed", "rdma.gpudirect")
    assert warn["status"] == "warn" and "proprietary" in warn["message"], warn
    assert "nvidia_peermem" in warn["fix"]


# torch 2.11.0+cu126's real arch list (pytorch/pytorch#182250): no sm_120 kernels
CU126_ARCHS = ["sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90"]


def test_up_asks_the_pulled_image_and_stops_before_the_start(
    cli: Cli, make_testbed: Callable[..., Testbed], tmp_path: Path
) -> None:
    bed = make_testbed(
        [HostSpec("ok"), HostSpec("noarch", overrides={"image": {"arch_list": CU126_ARCHS}})]
    )
    inv = bed.inventory(tmp_path / "inv.yaml", prefill=["noarch"], decode=["ok"], router="ok")
    up = cli("up", str(inv))
    out = up.stdout + up.stderr
    assert up.returncode != 0, out
    assert "pulled" in out  # the check runs after the pull ...
    assert re.search(
        r"^ok: docker\.image_arch pass: kernels for compute capability 12\.0", out, re.M
    ), out
    assert re.search(r"^ok: docker\.image_nixl pass: NIXL UCX backend with CUDA", out, re.M), out
    m = re.search(r"^noarch: docker\.image_arch fail: (.*)\n  fix: (.*)$", out, re.M)
    assert m, out
    assert "no CUDA kernels for compute capability 12.0" in m.group(1)
    assert "sm_90" in m.group(1) and "sm_120" in m.group(2)
    assert "image check failed: nothing was started" in out
    for h in bed.hosts.values():  # ... and before anything starts
        assert h.docker("ps", "-aq").stdout.split() == []


def test_without_rdma_the_interface_reaching_the_peer_must_not_be_docker0(
    cli: Cli, make_testbed: Callable[..., Testbed], tmp_path: Path
) -> None:
    bed = make_testbed([HostSpec("a"), HostSpec("b")])
    a, b = bed.hosts["a"], bed.hosts["b"]
    inv = bed.inventory(
        tmp_path / "inv.yaml",
        prefill=["a"],
        decode=["b"],
        router="b",
        overrides={"kv_transfer": {"rdma": "off"}},
    )
    doc = json.loads(cli("preflight", str(inv), "--json", "--only", "network").stdout)
    for host in ("a", "b"):
        (ok,) = _checks(doc, host, "network.ucx_iface")
        assert ok["status"] == "pass" and ok["message"].startswith("UCX_NET_DEVICES=eth0"), ok

    # a's route to b now goes through a bridge named docker0 (as when the hosts' network
    # overlaps Docker's default bridge subnet)
    a.exec(
        "ip link add docker0 type bridge && ip link set docker0 up && "
        f"ip addr add 172.17.0.1/16 dev docker0 && ip route add {b.address}/32 dev docker0",
        check=True,
    )
    doc = json.loads(cli("preflight", str(inv), "--json", "--only", "network").stdout)
    (bad,) = _checks(doc, "a", "network.ucx_iface")
    assert bad["status"] == "fail" and f"{b.address} is reached through docker0" in bad["message"]
    (ok,) = _checks(doc, "b", "network.ucx_iface")
    assert ok["status"] == "pass"


def test_up_without_rdma_sets_ucx_net_devices_to_the_interface_found(
    cli: Cli, make_testbed: Callable[..., Testbed], tmp_path: Path
) -> None:
    bed = make_testbed([HostSpec("a"), HostSpec("b")])
    inv = bed.inventory(
        tmp_path / "inv.yaml",
        prefill=["a"],
        decode=["b"],
        router="b",
        name="ucxif",
        overrides={"kv_transfer": {"rdma": "off"}},
    )
    up = cli("up", str(inv))
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        for host in ("a", "b"):
            h = bed.hosts[host]
            ids = h.docker("ps", "-q", "--filter", "label=io.pdboot.deployment=ucxif").stdout
            envs = [
                json.loads(h.docker("inspect", "--format", "{{json .Config.Env}}", c).stdout)
                for c in ids.split()
            ]
            engine = [e for e in envs if any(v.startswith("VLLM_NIXL_SIDE_CHANNEL") for v in e)]
            assert engine and "UCX_NET_DEVICES=eth0" in engine[0], envs
        # status rebuilds the plan from the recorded finding: no change reported
        st = cli("status", str(inv), "--json")
        doc = json.loads(st.stdout)
        assert doc["healthy"] is True, doc
        assert all(s["matches_inventory"] is True for s in doc["services"]), doc
    finally:
        cli("down", str(inv))
