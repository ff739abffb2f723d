"""Preflight on a live deployment (issue 22): ports and GPU memory held by this deployment's
own containers pass with a note naming them; anything else still fails. From real captures
of the testbed (fixtures/owners/, README there) with the expected facts beside them."""

from __future__ import annotations

import dataclasses
import json

import pytest

from pdboot.inventory.load import load_inventory
from pdboot.inventory.schema import Inventory
from pdboot.plan.build import build_plan
from pdboot.plan.converge import Observed
from pdboot.preflight import run as pf
from pdboot.preflight.checks import CheckResult, HostContext, Section, gpu, owners, parse_sections
from pdboot.preflight.checks import host as hostc
from pdboot.preflight.contexts import contexts
from pdboot.transport.fanout import Outcome
from tests.unit.paths import FIXTURES

FIX = FIXTURES / "owners"
EXPECTED = json.loads((FIX / "expected.json").read_text())
HOSTS = ("decode", "prefill", "ingress")


def inventory(name: str = "inventory.yaml") -> Inventory:
    return load_inventory(FIX / name)


def capture(name: str) -> str:
    return (FIX / f"{name}.txt").read_text()


def section(name: str, prefix: str) -> Section:
    return next(v for k, v in parse_sections(capture(name)).items() if k.startswith(prefix))


def preflight_offline(inv: Inventory, prefix: str) -> pf.PreflightResult:
    """run_preflight's two halves over the captured batch outputs instead of SSH."""
    ctxs = contexts(inv)
    outcomes = {h: Outcome(value=(capture(f"{prefix}-{h}"), 0.0, 0.5, 0.5)) for h in HOSTS}
    reports, read = pf.read_reports(outcomes, ctxs, {})
    pf.judge_reports(inv, reports, read, {})
    return pf.PreflightResult(reports)


def check(result: pf.PreflightResult, host: str, cid: str) -> CheckResult:
    return next(c for c in result.hosts[host].checks if c.id == cid)


# --------------------------------------------------------------------------- facts


@pytest.mark.parametrize("name", [k for k in EXPECTED if k not in ("_about", "fates")])
def test_captures_give_the_expected_facts(name: str) -> None:
    want = EXPECTED[name]
    inv = inventory(
        "inventory-regrouped.yaml" if name.startswith("regrouped") else "inventory.yaml"
    )
    host = name.split("-", 1)[1]
    facts, parsed = pf.read_host(contexts(inv)[host], capture(name))
    assert parsed == []
    own = facts.owners
    assert own is not None and own.listed
    got = [[c.key, c.id[:12], c.state, c.config_hash] for c in own.containers]
    assert got == want["containers"]
    assert facts.host is not None and facts.host.listeners is not None
    assert {str(ln.port): list(ln.pids) for ln in facts.host.listeners} == want["listeners"]
    for pid, key in want["pid_owner"].items():
        c = own.container_of(int(pid))
        assert (c.key if c else None) == key, pid
    if want["gpu_pids"] is None:
        assert facts.gpu is None  # the router's host runs no engine: no GPU checks
    else:
        assert facts.gpu is not None and facts.gpu.apps is not None
        assert [a.pid for a in facts.gpu.apps] == want["gpu_pids"]


@pytest.mark.parametrize("inv_name", ["inventory.yaml", "inventory-regrouped.yaml"])
def test_fates_follow_the_converge_plan(inv_name: str) -> None:
    result = preflight_offline(
        inventory(inv_name), "live" if "regrouped" not in inv_name else "regrouped"
    )
    fates = pf.deployment_fates(inventory(inv_name), result.hosts)
    assert {f.key: f.action for f in fates.values()} == EXPECTED["fates"][inv_name]


# --------------------------------------------------------------------------- verdicts


def test_live_deployment_passes_with_notes_naming_its_containers() -> None:
    result = preflight_offline(inventory(), "live")
    for host, key, ports in (
        ("decode", "decode@decode", "8201 (decode HTTP), 5601 (decode NIXL side channel)"),
        ("prefill", "prefill@prefill", "8200 (prefill HTTP), 5600 (prefill NIXL side channel)"),
    ):
        ports_check = check(result, host, "host.ports")
        assert ports_check.status == "pass", ports_check
        assert ports_check.message == f"{ports} held by this deployment: {key} (up keeps it)"
        here = check(result, host, "host.deployment")
        assert here.message.endswith(f"(1 of 1 running): {key} (up keeps it)")
    # captured before the proxy: its router holds the public port, and `up` moves it to its
    # loopback port behind the proxy (configuration changed), so 8000 is free for the proxy
    ingress = check(result, "ingress", "host.ports")
    assert ingress.status == "pass", ingress
    assert ingress.message == (
        "ports 8081, 8082, 29001 free; 29000 (router metrics), 8000 (proxy HTTP) held by this "
        "deployment: "
        "router@ingress (up replaces it: configuration changed)"
    )
    for host, key in (("decode", "decode@decode"), ("prefill", "prefill@prefill")):
        mem = check(result, host, "gpu.memory_free")
        assert mem.status == "pass", mem
        assert mem.message == (
            "GPU 0: 9286/97887 MiB free, GPU 1: 9286/97887 MiB free; held by this deployment: "
            f"{key} (up keeps it) (GPU 0: 88098 MiB, GPU 1: 88098 MiB)"
        )
    fails = [(h, c.id) for h, r in result.hosts.items() for c in r.checks if c.status == "fail"]
    assert fails == []


def test_a_foreign_listener_still_fails_beside_the_deployments_own() -> None:
    result = preflight_offline(inventory("inventory-regrouped.yaml"), "regrouped")
    ports = check(result, "decode", "host.ports")
    assert ports.status == "fail"
    assert ports.message == (
        "8200 (prefill HTTP) is taken by python3 (pid 13627); 8201 (decode HTTP), 5601 "
        "(decode NIXL side channel) held by this deployment: decode@decode (up replaces it: "
        "configuration changed)"
    )
    # GPU 1 moves from decode to the new prefill engine: decode is replaced, so it frees it
    mem = check(result, "decode", "gpu.memory_free")
    assert mem.status == "pass" and "decode@decode (up replaces it" in mem.message
    # the changed prefill and the router it registers: replaced, their ports pass
    for host in ("prefill", "ingress"):
        c = check(result, host, "host.ports")
        assert c.status == "pass" and "(up replaces it: configuration changed)" in c.message
    assert [h for h, r in result.hosts.items() if not r.ok] == ["decode"]


def _decode_ctx() -> HostContext:
    return contexts(inventory())["decode"]


def _with(name: str, prefix: str, output: str, rc: int | None = None) -> str:
    """A capture with one section's output (and exit code) replaced: derived, for what the
    testbed's root SSH user cannot show."""
    out: list[str] = []
    keep, mine = True, False
    for line in capture(name).splitlines():
        if line.startswith("### $ "):
            mine = line[6:].startswith(prefix)
            keep = not mine
            out.append(line)
            if mine:
                out.append(output.rstrip("\n"))
            continue
        if line.startswith("### exit="):
            keep = True
            if mine and rc is not None:
                line = f"### exit={rc}"
            mine = False
        if keep:
            out.append(line)
    return "\n".join(out) + "\n"


def test_a_socket_without_a_pid_is_not_passed_on_a_guess() -> None:
    # what a non-root SSH user sees: ss names no process for root's sockets
    text = section("live-decode", "ss -ltnpH").output
    hidden = "\n".join(ln.split(" users:")[0] for ln in text.splitlines())
    res, _ = pf.evaluate_host(_decode_ctx(), _with("live-decode", "ss -ltnpH", hidden))
    ports = next(r for r in res if r.id == "host.ports")
    assert ports.status == "fail"
    assert "8201 (decode HTTP) is taken by listening on 0.0.0.0:8201" in ports.message
    assert "run preflight as root" in ports.message


def test_a_socket_shared_with_a_foreign_process_fails() -> None:
    line = (
        "LISTEN 0      128       0.0.0.0:8201 0.0.0.0:* "
        'users:(("vllm",pid=8205,fd=3),("python3",pid=777,fd=3))'
    )
    text = section("live-decode", "ss -ltnpH").output.replace(
        next(
            ln for ln in section("live-decode", "ss -ltnpH").output.splitlines() if ":8201 " in ln
        ),
        line,
    )
    listeners = hostc.parse_ss(text)
    assert next(ln for ln in listeners if ln.port == 8201).pids == (8205, 777)
    res, _ = pf.evaluate_host(_decode_ctx(), _with("live-decode", "ss -ltnpH", text))
    ports = next(r for r in res if r.id == "host.ports")
    assert ports.status == "fail" and "8201 (decode HTTP) is taken by" in ports.message
    assert "5601 (decode NIXL side channel) held by this deployment: decode@decode" in (
        ports.message
    )


def test_without_the_container_list_the_old_verdict_stands() -> None:
    # docker unreachable for the SSH user: nothing is known to be ours, every holder fails
    denied = "permission denied while trying to connect to the Docker daemon socket"
    res, facts = pf.evaluate_host(_decode_ctx(), _with("live-decode", "docker ps", denied, 1))
    assert facts.owners is not None and not facts.owners.listed
    ports = next(r for r in res if r.id == "host.ports")
    assert ports.status == "fail" and "is taken by vllm (pid 8205)" in ports.message
    mem = next(r for r in res if r.id == "gpu.memory_free")
    assert mem.status == "warn" and "pid 8205 (vllm) uses 88098 MiB" in mem.message


def test_foreign_gpu_memory_still_warns_beside_the_deployments_own() -> None:
    apps = section("live-decode", "nvidia-smi --query-compute-apps").output
    uuid = apps.split(",")[0]
    extra = apps + f"{uuid}, 4242, python3, 2048\n"
    res, _ = pf.evaluate_host(
        _decode_ctx(),
        _with("live-decode", "nvidia-smi --query-compute-apps", extra),
    )
    mem = next(r for r in res if r.id == "gpu.memory_free")
    assert mem.status == "warn"
    assert mem.message == "another process holds GPU memory: pid 4242 (python3) uses 2048 MiB"
    assert len(gpu.parse_apps(extra)) == 3


# --------------------------------------------------------------------------- pure parts


def test_labels_keep_a_values_own_commas() -> None:
    got = owners.parse_labels(
        "com.docker.compose.project.config_files=/a/compose.yaml,/b/extra.yaml,"
        "io.pdboot.role=decode,com.docker.compose.depends_on="
    )
    assert got == {
        "com.docker.compose.project.config_files": "/a/compose.yaml,/b/extra.yaml",
        "io.pdboot.role": "decode",
        "com.docker.compose.depends_on": "",
    }


def test_ps_lines_that_are_not_json_are_skipped() -> None:
    text = section("live-decode", "docker ps").output
    got = owners.parse_ps("decode", "Error response from daemon: oops\n" + text + "{not json\n")
    assert [o.key for o in got] == ["decode@decode"]
    assert got[0].running and got[0].deployment == "pdtest"


def test_cgroup_lines_of_any_driver_name_the_container() -> None:
    cid = "7b3559a15dca0c05570cda3d40255fb9fc443a1c702f7e4d748a32ddfc36214f"
    got = owners.parse_cgroups(
        f"/proc/1/cgroup:{cid}\ngrep: /proc/9/cgroup: gone\n/proc/2/cgroup:x\n"
    )
    assert got == {1: cid}


def _observed(
    key_host: str,
    role: str,
    chash: str,
    state: str = "running",
    cid: str = "c1",
    engine: str | None = None,
) -> Observed:
    labels = {
        "io.pdboot.deployment": "pdtest",
        "io.pdboot.role": role,
        "io.pdboot.host": key_host,
        "io.pdboot.config-hash": chash,
    }
    if engine is not None:
        labels["io.pdboot.engine"] = engine
    return Observed(key_host, cid, f"n-{cid}", labels, state)


def test_fates_of_an_orphan_a_stopped_engine_and_another_deployment() -> None:
    plan = build_plan(inventory())
    want = {s.key: s.config_hash for s in plan.services()}
    observed = [
        _observed("decode", "decode", want["decode@decode"], "exited", "c1"),
        _observed("decode", "prefill", "0000", cid="c2"),  # no prefill on decode any more
        _observed("prefill", "prefill", want["prefill@prefill"], cid="c3"),
        dataclasses.replace(
            _observed("ingress", "router", want["router@ingress"], cid="c4"),
            labels={"io.pdboot.deployment": "other", "io.pdboot.role": "router"},
        ),
    ]
    got = {cid: (f.key, f.action, f.why) for cid, f in owners.fates(plan, observed).items()}
    assert got == {
        "c1": ("decode@decode", "replace", "container is exited"),
        "c2": ("prefill@decode", "remove", "no longer in the inventory"),
        # its decode is recreated: a kept prefill stays, the router re-registers them
        "c3": ("prefill@prefill", "keep", ""),
    }
