"""Weights staged once per host at one pinned commit, end to end: the real CLI against two
rtx6000x8 testbed hosts, the testbed's HF-compatible hub (tests/testbed/hub.py, its access
log is the evidence), and the REAL huggingface_hub client inside the engine image doing
every download (the staging container) and every load (the stand-in reads the commit from
the HF cache, offline).

One prefill on gpu-a, eight decodes on gpu-b: each file crosses the network once per host.
A branch moved between two `up` runs changes nothing until `up --refresh-weights`; gated /
unknown / too big are preflight failures before any pull; a killed staging resumes.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cli import Cli, output
from tests.conftest import RTX_PAIR, module_testbed
from tests.testbed import hub
from tests.testbed.harness import Testbed
from tests.testbed.inventory import rtx_pair_dict

pytestmark = [pytest.mark.testbed, pytest.mark.slow]


@pytest.fixture(scope="module")
def cli(cli: Cli) -> Cli:
    return cli.with_(timeout=400)


FILES = sorted(hub.model_files(1))
DECODE_GPUS = [[g] for g in range(8)]


tb = module_testbed(RTX_PAIR)


def write(
    tb: Testbed,
    path: Path,
    *,
    name: str = "pdw",
    model: str = hub.PUBLIC_REPO,
    decode_gpus: list[list[int]] | None = None,
    **extra: Any,
) -> Path:
    prefill = {"hosts": ["gpu-a"], "gpus": [[0]]}
    decode = {"hosts": ["gpu-b"], "gpus": decode_gpus or [[0]]}
    inv = rtx_pair_dict(tb, name, prefill, decode)
    inv["model"] = model
    # the testbed hub is plain http (named); staging runs in pdboot's small staging image
    inv["weights"] = {
        "stage": True,
        "endpoint": tb.hub,
        "allow_plain_http": True,
        "image": tb.stage_image,
    }
    inv.update(extra)
    path.write_text(yaml.safe_dump(inv, sort_keys=False))
    return path


def events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def engines(tb: Testbed, deployment: str) -> list[dict[str, Any]]:
    docs = []
    for h in tb.hosts.values():
        ids = h.docker("ps", "-q", "--filter", f"label=io.pdboot.deployment={deployment}")
        for cid in ids.stdout.split():
            doc = json.loads(h.docker("inspect", cid).stdout)[0]
            if doc["Config"]["Labels"].get("io.pdboot.role") in ("prefill", "decode"):
                docs.append(doc)
    return docs


def addr(tb: Testbed, host: str) -> str:
    return tb.hosts[host].address


def head(tb: Testbed, repo: str = hub.PUBLIC_REPO, rev: str = "main") -> str:
    import urllib.request

    with urllib.request.urlopen(f"{tb.hub}/api/models/{repo}/revision/{rev}") as r:
        return str(json.loads(r.read())["sha"])


# ---------------------------------------------------------------------- preflight first


def test_gated_unknown_and_too_big_fail_preflight_before_any_pull(
    cli: Cli, tb: Testbed, tmp_path: Path
) -> None:
    cases = [
        (hub.GATED_REPO, {}, "HTTP 401", "secrets.hf_token"),
        (
            hub.GATED_REPO,
            {"secrets": {"hf_token": "env:PDT_WRONG_TOKEN"}},
            "HTTP 403",
            "request access",
        ),
        ("pdt/no-such-model", {}, "HTTP 404", "model_revision"),
        (hub.PUBLIC_REPO, {"model_revision": "no-such-branch"}, "HTTP 404", "model_revision"),
        (hub.HUGE_REPO, {}, "weights.disk", "container.hf_cache"),
    ]
    env = {"PDT_WRONG_TOKEN": "hf_not_the_one"}
    for model, extra, what, fix in cases:
        inv = write(tb, tmp_path / "inv.yaml", name="pdwpf", model=model, **extra)
        res = cli("preflight", str(inv), "--json", "--only", "weights,host", env=env)
        assert res.returncode == 1, output(res)
        failed = [
            c
            for h in json.loads(res.stdout)["hosts"].values()
            for c in h["checks"]
            if c["status"] == "fail"
        ]
        assert [c for c in failed if what in c["id"] + c["message"] and fix in c["fix"]], failed
        assert "hf_not_the_one" not in output(res)  # the token is never printed
        res = cli("up", str(inv), env=env)  # the same, as `up`'s first step
        assert res.returncode == 1, output(res)
        assert "preflight failed: nothing was pulled or started" in output(res), output(res)
        assert "hf_not_the_one" not in output(res)
    for h in tb.hosts.values():  # nothing was pulled anywhere
        assert h.docker("images", "-q").stdout.split() == []


def test_preflight_passes_and_names_the_commit(cli: Cli, tb: Testbed, tmp_path: Path) -> None:
    res = cli("preflight", str(write(tb, tmp_path / "inv.yaml")), "--only", "weights,host", "-v")
    text = output(res)
    assert res.returncode == 0, text
    assert f"is commit {head(tb)[:12]}" in text, text
    assert "reaches the hub" in text, text


# ---------------------------------------------------------------------- up


def test_up_stages_each_file_once_per_host_and_engines_load_one_commit_offline(
    cli: Cli, tb: Testbed, tmp_path: Path
) -> None:
    commit = head(tb)
    inv = write(tb, tmp_path / "inv.yaml", decode_gpus=DECODE_GPUS)
    ev_file = tmp_path / "events.jsonl"
    res = cli("up", str(inv), "--no-speed", "--events", str(ev_file), timeout=600)
    assert res.returncode == 0, output(res)[-6000:]
    got = hub.downloads(tb.hub_log)
    for h in ("gpu-a", "gpu-b"):  # nine engines, two hosts: each file once per host
        assert {f: got.get((addr(tb, h), f), 0) for f in FILES} == dict.fromkeys(FILES, 1)
    evs = events(ev_file)
    pinned = [e for e in evs if e["event"] == "weights_pinned"]
    assert [e["commit"] for e in pinned] == [commit]
    done = {e["host"]: e for e in evs if e["event"] == "weights_done"}
    assert set(done) == {"gpu-a", "gpu-b"} and not any(e["cached"] for e in done.values())
    assert {e["client"] for e in done.values()} == {"2.4.0"}  # the image's own client
    assert any(e["event"] == "weights_progress" for e in evs)
    for h in ("gpu-a", "gpu-b"):  # the staging image first, the engine image's pull after
        pulled = [e["image"] for e in evs if e["event"] == "pull_done" and e["host"] == h]
        mine = [i for i in pulled if i in (tb.stage_image, tb.image)]  # not router/proxy's
        assert mine == [tb.stage_image, tb.image], pulled
    docs = engines(tb, "pdw")
    assert len(docs) == 9
    for d in docs:
        args = d["Args"]
        assert args[args.index("--revision") + 1] == commit
        assert args[args.index("--tokenizer-revision") + 1] == commit
        assert "HF_HUB_OFFLINE=1" in d["Config"]["Env"]
        host = tb.hosts[d["Config"]["Labels"]["io.pdboot.host"]]
        logs = host.docker("logs", d["Id"]).stdout + host.docker("logs", d["Id"]).stderr
        assert f"at {commit} (offline=True)" in logs, logs[-2000:]
    st = cli("status", str(inv))
    assert f"engines load commit {commit}" in output(st), output(st)


def test_a_moved_branch_changes_nothing_until_asked(cli: Cli, tb: Testbed, tmp_path: Path) -> None:
    old = head(tb)
    inv = write(tb, tmp_path / "inv.yaml", decode_gpus=DECODE_GPUS)
    new = tb.hub_control("move", repo=hub.PUBLIC_REPO, branch="main", commit="new")["commit"]
    assert new != old
    before = hub.downloads(tb.hub_log)
    ev_file = tmp_path / "events.jsonl"
    plan = cli("up", str(inv), "--plan")  # from the recorded pin: no change, no hub request
    assert plan.returncode == 0, output(plan)[-4000:]
    assert f"at commit {old} (pinned by an earlier up)" in output(plan), output(plan)
    # with preflight, as operators re-run it: the engines' own ports are not "taken"
    res = cli("up", str(inv), "--no-speed", "--events", str(ev_file), timeout=600)
    text = output(res)
    assert res.returncode == 0, text[-6000:]
    assert f"now points at {new[:12]}" in text and f"stays on {old[:12]}" in text, text
    actions = {e["service"]: e["action"] for e in events(ev_file) if e["event"] == "service_action"}
    assert len(actions) == 11 and set(actions.values()) == {"unchanged"}, actions  # + proxy
    assert hub.downloads(tb.hub_log) == before  # not one file fetched
    for d in engines(tb, "pdw"):  # both tiers still on the old commit
        assert d["Args"][d["Args"].index("--revision") + 1] == old
    res = cli("up", str(inv), "--no-speed", "--refresh-weights", timeout=600)
    assert res.returncode == 0, output(res)[-6000:]
    docs = engines(tb, "pdw")
    assert {d["Args"][d["Args"].index("--revision") + 1] for d in docs} == {new}
    after = hub.downloads(tb.hub_log)
    changed = {f for f, b in hub.model_files(2).items() if hub.model_files(1).get(f) != b}
    assert changed == {"config.json", "model-00002-of-00002.safetensors"}
    for h in ("gpu-a", "gpu-b"):  # only what the new commit changed, once per host
        fetched = {
            f for (c, f), n in after.items() if c == addr(tb, h) and n > before.get((c, f), 0)
        }
        assert fetched == changed, fetched
    assert cli("down", str(inv)).returncode == 0


# ---------------------------------------------------------------------- resume


def test_an_interrupted_staging_resumes(cli: Cli, tb: Testbed, tmp_path: Path) -> None:
    cache = "/var/lib/pdboot/hf-cache-resume"
    inv = write(
        tb,
        tmp_path / "inv.yaml",
        name="pdwr",
        container={
            "hf_cache": cache,
            "ulimits": {"memlock": 8388608, "nofile": 20000},
            "shm_size": "1g",
        },
    )
    b = addr(tb, "gpu-b")
    base = hub.downloads(tb.hub_log)  # what the earlier tests fetched
    tb.hub_control("rate", bps="1000000")  # 1 MB/s a host: the shards take seconds
    try:
        proc = cli.popen(
            "stage", str(inv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        seen = hub.downloads(tb.hub_log).get((b, "config.json"), 0)
        deadline = time.monotonic() + 120
        while hub.downloads(tb.hub_log).get((b, "config.json"), 0) == seen:
            assert time.monotonic() < deadline and proc.poll() is None, proc.stdout
            time.sleep(0.2)
        time.sleep(1.5)  # into the shards
        tb.hosts["gpu-b"].docker("kill", "pdboot-stage-pdwr")  # gpu-b's staging dies
        first, _ = proc.communicate(timeout=120)
        assert proc.returncode == 1, first
        assert "staging failed on" in first and "gpu-b" in first, first
        part = hub.downloads(tb.hub_log)
        res = cli("stage", str(inv), timeout=300)
        assert res.returncode == 0, output(res)
    finally:
        tb.hub_control("rate", bps="0")
    whole = hub.downloads(tb.hub_log)
    first_try = {f: part.get((b, f), 0) - base.get((b, f), 0) for f in FILES}
    for f in FILES:
        # fetched again on gpu-b only when its first try had not finished it
        again = whole.get((b, f), 0) - part.get((b, f), 0)
        assert again == (0 if first_try[f] else 1), (f, first_try, again)
    assert 1 <= sum(first_try.values()) < len(FILES)  # killed midway: some files survived
    ran = cli("stage", str(inv), "--events", str(tmp_path / "ev.jsonl"))
    assert ran.returncode == 0, output(ran)
    done = [e for e in events(tmp_path / "ev.jsonl") if e["event"] == "weights_done"]
    assert len(done) == 2 and all(e["cached"] for e in done)  # nothing left to fetch


# ---------------------------------------------------------------------- seed


def test_seed_first_host_copies_over_the_hosts_network(
    cli: Cli, tb: Testbed, tmp_path: Path
) -> None:
    inv = write(
        tb,
        tmp_path / "inv.yaml",
        name="pdws",
        container={
            "hf_cache": "/var/lib/pdboot/hf-cache-seed",
            "ulimits": {"memlock": 8388608, "nofile": 20000},
            "shm_size": "1g",
        },
    )
    doc = yaml.safe_load(inv.read_text())
    doc["weights"]["seed"] = "first_host"
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    before = hub.downloads(tb.hub_log)
    ev_file = tmp_path / "ev.jsonl"
    res = cli("stage", str(inv), "--events", str(ev_file), timeout=300)
    assert res.returncode == 0, output(res)
    after = hub.downloads(tb.hub_log)
    new = {k: n - before.get(k, 0) for k, n in after.items() if n != before.get(k, 0)}
    # the first engine host (prefill's gpu-a) from the hub, once per file; gpu-b never
    assert new == {(addr(tb, "gpu-a"), f): 1 for f in FILES}, new
    done = {e["host"]: e for e in events(ev_file) if e["event"] == "weights_done"}
    assert set(done) == {"gpu-a", "gpu-b"} and not done["gpu-b"]["cached"]
    seed = tb.hosts["gpu-a"].docker("ps", "-aq", "--filter", "name=pdboot-seed-pdws")
    assert seed.stdout.split() == []  # the seed server is gone
    again = cli("stage", str(inv), "--events", str(tmp_path / "ev2.jsonl"))
    assert again.returncode == 0, output(again)
    done2 = [e for e in events(tmp_path / "ev2.jsonl") if e["event"] == "weights_done"]
    assert len(done2) == 2 and all(e["cached"] for e in done2)  # gpu-b's copy is complete


# ---------------------------------------------------------------------- guards


def oneshots(tb: Testbed) -> dict[str, list[str]]:
    """Host -> the one-shot (staging / seed) containers pdboot labelled, running or not."""
    return {
        n: h.docker("ps", "-aq", "--filter", "label=pdboot.oneshot").stdout.split()
        for n, h in tb.hosts.items()
    }


def seed_inventory(tb: Testbed, path: Path, name: str, cache: str) -> Path:
    inv = write(
        tb,
        path,
        name=name,
        secrets={"hf_token": "env:PDT_HF_TOKEN"},
        container={
            "hf_cache": cache,
            "ulimits": {"memlock": 8388608, "nofile": 20000},
            "shm_size": "1g",
        },
    )
    doc = yaml.safe_load(inv.read_text())
    doc["weights"]["seed"] = "first_host"
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    return inv


def test_a_tampered_cached_file_fails_that_hosts_staging_naming_it(
    cli: Cli, tb: Testbed, tmp_path: Path
) -> None:
    cache = "/var/lib/pdboot/hf-cache-tamper"
    inv = write(
        tb,
        tmp_path / "inv.yaml",
        name="pdwt",
        container={
            "hf_cache": cache,
            "ulimits": {"memlock": 8388608, "nofile": 20000},
            "shm_size": "1g",
        },
    )
    assert cli("stage", str(inv), timeout=300).returncode == 0
    shard = "model-00001-of-00002.safetensors"
    snap = f"{cache}/hub/models--pdt--tiny-model/snapshots/{head(tb)}/{shard}"
    b = tb.hosts["gpu-b"]
    size = b.exec(["stat", "-L", "-c", "%s", snap], check=True).stdout.strip()
    # one byte changed in place, the size kept: what a size check lets through
    b.exec(f"printf 'Z' | dd of=\"$(readlink -f {snap})\" bs=1 seek=100 conv=notrunc", check=True)
    assert b.exec(["stat", "-L", "-c", "%s", snap], check=True).stdout.strip() == size
    res = cli("stage", str(inv), timeout=300)
    text = output(res)
    assert res.returncode == 1, text
    assert "staging failed on" in text and "gpu-b" in text, text
    assert "hash mismatch in the cached copy" in text and shard in text, text
    assert "gpu-a" not in text.split("staging failed on", 1)[1].split("\n")[0], text


def test_no_token_in_any_container_and_ctrl_c_mid_seed_leaves_nothing(
    cli: Cli, tb: Testbed, tmp_path: Path
) -> None:
    cache = "/var/lib/pdboot/hf-cache-int"
    inv = seed_inventory(tb, tmp_path / "inv.yaml", "pdwi", cache)
    a = tb.hosts["gpu-a"]
    # a slow network out of the seed host: gpu-b's copy takes seconds, not milliseconds
    a.exec("tc qdisc add dev eth0 root tbf rate 4mbit burst 64kb latency 2s", check=True)
    try:
        proc = cli.popen(
            "stage", str(inv), env={"PDT_HF_TOKEN": hub.TOKEN},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        deadline = time.monotonic() + 240
        seen: dict[str, str] = {}
        while len(seen) < 2:  # the seed server on gpu-a, the fetcher on gpu-b
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
            for host, name in (("gpu-a", "pdboot-seed-pdwi"), ("gpu-b", "pdboot-stage-pdwi")):
                ids = tb.hosts[host].docker("ps", "-q", "--filter", f"name={name}").stdout
                if ids.split():
                    seen[host] = ids.split()[0]
            time.sleep(0.1)
        for host, cid in seen.items():  # neither the HF token nor a secret file in them
            doc = tb.hosts[host].docker("inspect", cid).stdout
            env = json.loads(doc)[0]["Config"]["Env"]
            assert hub.TOKEN not in doc and not [e for e in env if "TOKEN=" in e], env
        served = a.exec(["ss", "-Hltn", f"sport = :{8765}"]).stdout
        assert addr(tb, "gpu-a") in served, served  # bound to the advertised address only
        proc.send_signal(2)  # Ctrl-C
        text, _ = proc.communicate(timeout=120)
        assert proc.returncode == 130, text
    finally:
        a.exec("tc qdisc del dev eth0 root")
    assert oneshots(tb) == {"gpu-a": [], "gpu-b": []}
    assert a.exec(["ss", "-Hltn", "sport = :8765"]).stdout.strip() == ""
    for h in tb.hosts.values():  # no secret file, and the token in no file pdboot wrote
        found = h.exec(
            f"find / -xdev -name 'pdboot-secret*' 2>/dev/null; "
            f"grep -rl {hub.TOKEN} /var/lib/pdboot 2>/dev/null; true"
        ).stdout
        assert found.strip() == "", found


def test_down_removes_a_seed_server_an_earlier_run_left(
    cli: Cli, tb: Testbed, tmp_path: Path
) -> None:
    inv = seed_inventory(tb, tmp_path / "inv.yaml", "pdwd", "/var/lib/pdboot/hf-cache-down")
    a = tb.hosts["gpu-a"]
    image = yaml.safe_load(inv.read_text())["image"]
    a.docker("pull", image)
    # what an earlier run killed hard (SIGKILL: no cleanup) leaves: pdboot's labelled server
    sleep = ["--entrypoint", "python3", image, "-c", "import time; time.sleep(3600)"]
    a.docker(
        "run",
        "-d",
        "--name",
        "pdboot-seed-pdwd",
        "--label",
        "pdboot.oneshot=pdboot-seed-pdwd",
        *sleep,
    )
    # and a container pdboot did not label, under a lookalike name: never touched
    a.docker("run", "-d", "--name", "pdboot-seed-pdwd-mine", *sleep)
    try:
        res = cli("down", str(inv), env={"PDT_HF_TOKEN": hub.TOKEN})
        assert res.returncode == 0, output(res)
        left = a.docker("ps", "-a", "--format", "{{.Names}}").stdout.split()
        assert "pdboot-seed-pdwd" not in left and "pdboot-seed-pdwd-mine" in left, left
    finally:
        a.docker("rm", "-f", "pdboot-seed-pdwd-mine", check=False)
