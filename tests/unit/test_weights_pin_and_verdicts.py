"""The pure parts of weights staging, with plain values: the hub's revision answer, the pin
kept across runs, the staging container's report lines, a local model path's verdicts,
what the engines are told, and the preflight verdicts."""

from __future__ import annotations

import json

from pdboot.deploy.weights.staging import pinned_inventory
from pdboot.inventory.load import parse_inventory
from pdboot.inventory.schema import Weights
from pdboot.plan.build import build_plan
from pdboot.plan.weights.engine_args import engine_hub_env, revision_args
from pdboot.plan.weights.hub import (
    HubProblem,
    Resolution,
    WeightsAsk,
    host_port,
    hub_endpoint,
    revision_url,
)
from pdboot.plan.weights.local import differing, missing, parse_listing
from pdboot.plan.weights.pin import Pin, choose, parse_pin
from pdboot.plan.weights.progress import StageLine, StageState, parse_line
from pdboot.preflight.checks import HostContext, Section
from pdboot.preflight.checks import weights as wchecks
from pdboot.preflight.checks.facts import HostFacts
from pdboot.preflight.checks.host import DiskFacts, HostSysFacts, Mount
from pdboot.transport.http import HttpAnswer
from pdboot.transport.hub import parse_revision

C1 = "a" * 40
C2 = "b" * 40
EP = "https://huggingface.co"

# the shape of the hub's `GET /api/models/{repo}/revision/{rev}?blobs=true` (model_info)
ANSWER = {
    "id": "org/m",
    "sha": C1,
    "gated": False,
    "siblings": [
        {"rfilename": "config.json", "size": 600, "blobId": "1" * 40},
        {
            "rfilename": "model.safetensors",
            "size": 4_000_000_000,
            "blobId": "2" * 40,
            "lfs": {"sha256": "3" * 64, "size": 4_000_000_000, "pointerSize": 134},
        },
    ],
}


def answer(status: int, body: object = "", error: str = "") -> HttpAnswer:
    return HttpAnswer(status, body if isinstance(body, str) else json.dumps(body), error)


# ---------------------------------------------------------------------- hub


def test_revision_url_quotes_the_revision() -> None:
    assert (
        revision_url(EP + "/", "org/m", "refs/pr/1")
        == f"{EP}/api/models/org/m/revision/refs%2Fpr%2F1?blobs=true"
    )


def test_a_200_gives_the_commit_and_sizes() -> None:
    r = parse_revision(answer(200, ANSWER), "org/m", "main", EP, False)
    assert isinstance(r, Resolution)
    assert r.commit == C1 and r.size == 4_000_000_600
    assert dict(r.files) == {"config.json": 600, "model.safetensors": 4_000_000_000}


def test_errors_become_problems_with_fixes() -> None:
    gated = parse_revision(answer(401), "org/m", "main", EP, has_token=False)
    denied = parse_revision(answer(403), "org/m", "main", EP, has_token=True)
    missing_ = parse_revision(answer(404), "org/m", "v9", EP, False)
    down = parse_revision(answer(0, error="connection refused"), "org/m", "main", EP, False)
    odd = parse_revision(answer(200, {"sha": "main"}), "org/m", "main", EP, False)
    assert isinstance(gated, HubProblem) and "no token" in gated.message
    assert "secrets.hf_token" in gated.fix
    assert isinstance(denied, HubProblem) and "no access" in denied.message
    assert isinstance(missing_, HubProblem) and missing_.kind == "not_found"
    assert "model_revision" in missing_.fix and "org/m@v9" in missing_.message
    assert isinstance(down, HubProblem) and down.kind == "unreachable"
    assert isinstance(odd, HubProblem) and odd.kind == "bad_answer"


def test_endpoint_from_inventory_then_env_then_default() -> None:
    assert hub_endpoint("http://mirror:8080/", {"HF_ENDPOINT": "http://x"}) == "http://mirror:8080"
    assert hub_endpoint(None, {"HF_ENDPOINT": "http://x/"}) == "http://x"
    assert hub_endpoint(None, {}) == EP
    assert host_port("http://10.77.1.1:5080") == ("10.77.1.1", 5080)
    assert host_port(EP) == ("huggingface.co", 443)


# ---------------------------------------------------------------------- pin


def pin(commit: str, model: str = "org/m", rev: str = "main") -> str:
    return Pin(model, rev, commit).text()


def test_first_run_takes_what_the_hub_says() -> None:
    c = choose({"a": None, "b": None}, "org/m", "main", C1)
    assert c.commit == C1 and not c.notes


def test_a_moved_branch_keeps_the_recorded_commit_and_says_so() -> None:
    c = choose({"a": pin(C1), "b": pin(C1)}, "org/m", "main", C2)
    assert c.commit == C1
    assert "now points at bbbbbbbbbbbb" in c.notes[0] and "--refresh-weights" in c.notes[0]


def test_refresh_moves_to_the_hub_commit() -> None:
    c = choose({"a": pin(C1)}, "org/m", "main", C2, refresh=True)
    assert c.commit == C2 and "moving" in c.notes[0]


def test_a_new_host_gets_the_recorded_commit() -> None:
    assert choose({"a": pin(C1), "new": None}, "org/m", "main", C2).commit == C1


def test_hosts_on_two_commits_is_an_error() -> None:
    c = choose({"a": pin(C1), "b": pin(C2)}, "org/m", "main", C2)
    assert c.commit is None and "a=aaaaaaaaaaaa" in c.error and "--refresh-weights" in c.error


def test_a_changed_model_or_revision_is_the_operator_asking() -> None:
    assert choose({"a": pin(C1, model="org/old")}, "org/m", "main", C2).commit == C2
    assert choose({"a": pin(C1, rev="v1")}, "org/m", "main", C2).commit == C2


def test_unresolved_without_a_pin_is_an_error() -> None:
    assert choose({}, "org/m", "main", None).commit is None
    assert choose({"a": pin(C1)}, "org/m", "main", None).commit == C1  # hub down: keep


def test_pins_that_do_not_parse_count_as_none() -> None:
    assert parse_pin("not json") is None
    assert parse_pin(json.dumps({"model": "m", "revision": "main", "commit": "main"})) is None
    assert parse_pin(pin(C1)) == Pin("org/m", "main", C1)


# ---------------------------------------------------------------------- progress


def test_report_lines_and_state() -> None:
    lines = [
        "Fetching 7 files:   0%|          | 0/7",
        'PDBOOT-STAGE {"kind": "plan", "total": 100, "files": 7, "done": 10, "client": "2.4.0"}',
        'PDBOOT-STAGE {"kind": "bytes", "done": 60, "total": 100}',
        "PDBOOT-STAGE {not json",
        'x PDBOOT-STAGE {"kind": "done", "commit": "' + C1 + '", "total": 100}',
    ]
    parsed = [parse_line(x) for x in lines]
    assert parsed[0] is None and parsed[3] is None
    st = StageState()
    for p in parsed:
        if p is not None:
            st.update(p)
    assert (st.done, st.total, st.files, st.client, st.finished) == (60, 100, 7, "2.4.0", True)
    cached = StageState()
    cached.update(one('PDBOOT-STAGE {"kind": "cached", "total": 5}'))
    assert cached.cached and cached.finished and cached.done == 5
    err = StageState()
    err.update(one('PDBOOT-STAGE {"kind": "error", "message": "GatedRepoError: no"}'))
    assert err.error == "GatedRepoError: no" and not err.finished


def one(line: str) -> StageLine:
    got = parse_line(line)
    assert got is not None
    return got


# ---------------------------------------------------------------------- local path

INDEX = json.dumps({"weight_map": {"a": "m-1.safetensors", "b": "m-2.safetensors"}})


def listing(*files: tuple[str, int], digest: str = "h1", index: str = INDEX) -> str:
    rows = "".join(f"file {n} {f}\n" for f, n in files)
    return f"{rows}hash {digest}\n---pdboot-index---\n{index}"


FULL = (
    ("config.json", 600),
    ("tokenizer.json", 9),
    ("model.safetensors.index.json", 80),
    ("m-1.safetensors", 1000),
    ("m-2.safetensors", 1000),
)


def test_a_complete_checkpoint_misses_nothing() -> None:
    assert missing(parse_listing(listing(*FULL))) == []


def test_missing_shard_config_and_tokenizer_are_named() -> None:
    lst = parse_listing(listing(("model.safetensors.index.json", 80), ("m-1.safetensors", 1000)))
    got = missing(lst)
    assert got[0] == "config.json" and "tokenizer" in got[1] and got[2:] == ["m-2.safetensors"]


def test_a_single_file_checkpoint_without_index() -> None:
    text = listing(("config.json", 1), ("tokenizer.json", 1), ("model.safetensors", 5), index="")
    assert missing(parse_listing(text)) == []


def test_the_host_that_differs_is_named() -> None:
    same = parse_listing(listing(*FULL))
    short = parse_listing(listing(*FULL[:4], ("m-2.safetensors", 999)))
    other = parse_listing(listing(*FULL, digest="h2"))
    got = differing({"a": same, "b": same, "c": short, "d": other})
    assert set(got) == {"c", "d"}
    assert "m-2.safetensors 999 vs 1000 bytes" in got["c"] and "differs from a" in got["c"]
    assert "hash differs" in got["d"]
    assert differing({"a": same, "b": same}) == {}


# ---------------------------------------------------------------------- engines

INV = """
name: demo
model: org/m
hosts:
  p1: {address: 192.0.2.10}
  d1: {address: 192.0.2.11}
prefill: {hosts: [p1]}
decode: {hosts: [d1]}
router: {host: p1}
"""


def test_a_pinned_inventory_gives_every_engine_the_commit_offline() -> None:
    inv = parse_inventory(INV)
    plan = build_plan(pinned_inventory(inv, C1))
    engines = [s for s in plan.services() if s.is_engine]
    assert len(engines) == 2
    for s in engines:
        args = list(s.command)
        assert args[args.index("--revision") + 1] == C1
        assert args[args.index("--tokenizer-revision") + 1] == C1
        env = dict(s.environment)
        assert env["HF_HUB_OFFLINE"] == "1" and env["HF_ENDPOINT"]
    assert plan.revision == C1
    assert build_plan(inv).revision == ""  # unpinned main: vLLM's own default, no flag


def test_a_tiers_own_revision_flag_is_not_reported_as_the_commit() -> None:
    # the api-key e2e passes a secret as the decode's --revision; status printed it as the commit
    inv = parse_inventory(INV)
    own = inv.model_copy(
        update={"decode": inv.decode.model_copy(update={"extra_args": ["--revision", "x"]})}
    )
    assert build_plan(own).revision == ""
    assert build_plan(pinned_inventory(own, C1)).revision == C1


def test_engine_args_for_paths_branches_and_no_staging() -> None:
    assert revision_args("/models/m", C1) == []
    assert revision_args("org/m", "main") == []
    assert revision_args("org/m", "v2") == ["--revision", "v2", "--tokenizer-revision", "v2"]
    assert engine_hub_env("org/m", C1, Weights(stage=False)) == {}
    assert engine_hub_env("org/m", "v2", Weights()) == {}  # not pinned: not offline


# ---------------------------------------------------------------------- preflight verdicts

RES = Resolution("org/m", "main", C1, (("model.safetensors", 40 * 10**9),))


def ctx(lookup: Resolution | HubProblem | None, report: bool = True) -> HostContext:
    from pdboot.inventory.schema import Requirements

    ask = WeightsAsk("org/m", "main", "http://10.0.0.1:5080", True, lookup, report)
    return HostContext(name="g", roles=("decode",), req=Requirements(), weights=ask)


def facts(free_gib: int, reach_rc: int = 0) -> HostFacts:
    m = Mount("/dev/x", 10**9, free_gib * 1024**2, "/var")
    host = HostSysFacts(Section("", 0), DiskFacts("/d", "/var", m, m, None), Section("", 0), ())
    out = "reachable\n" if reach_rc == 0 else ""
    return HostFacts(host=host, weights=wchecks.WeightsFacts(reach=Section(out, reach_rc)))


def by_id(results: list[wchecks.CheckResult]) -> dict[str, wchecks.CheckResult]:
    return {r.id: r for r in results}


def test_commands_ask_the_hub_port_with_bash() -> None:
    cmds = wchecks.commands(ctx(RES))
    assert [c.key for c in cmds] == ["hub_reach"]
    assert "/dev/tcp/10.0.0.1/5080" in cmds[0].line


def test_preflight_passes_with_room_and_reach() -> None:
    got = by_id(wchecks.evaluate(ctx(RES), facts(100)))
    assert {r.status for r in got.values()} == {"pass"}
    assert "commit aaaaaaaaaaaa" in got["weights.revision"].message


def test_preflight_fails_disk_reach_and_gated() -> None:
    got = by_id(wchecks.evaluate(ctx(RES), facts(20, reach_rc=124)))
    assert got["weights.disk"].status == "fail" and "container.hf_cache" in got["weights.disk"].fix
    assert got["weights.hub_reach"].status == "fail" and "mirror" in got["weights.hub_reach"].fix
    gated = HubProblem("auth", "org/m@main: HTTP 401", "set secrets.hf_token")
    got = by_id(wchecks.evaluate(ctx(gated), facts(100)))
    assert got["weights.revision"].status == "fail" and "weights.disk" not in got
    assert "weights.revision" not in by_id(wchecks.evaluate(ctx(gated, report=False), facts(100)))


def test_the_seed_port_is_checked_on_the_first_engine_host_only() -> None:
    from pdboot.preflight.contexts import seed_ports

    inv = parse_inventory(INV + "weights: {seed: first_host, seed_port: 9100}\n")
    assert seed_ports(inv, "p1") == [(9100, "weights seed server")]
    assert seed_ports(inv, "d1") == []
    assert seed_ports(parse_inventory(INV), "p1") == []


def test_every_other_engine_host_probes_the_seed_port() -> None:
    from pdboot.preflight.checks import MISSING
    from pdboot.preflight.checks.network import ProbeFact, _probe
    from pdboot.preflight.contexts import contexts

    inv = parse_inventory(INV + "weights: {seed: first_host, seed_port: 9100}\n")
    ctxs = contexts(inv)
    seeds = {h: [p for p in c.probes if p.check_id == "network.seed"] for h, c in ctxs.items()}
    assert seeds["p1"] == []  # the first engine host serves
    (probe,) = seeds["d1"]
    assert (probe.target, probe.port) == ("p1", 9100)
    assert probe.address == inv.hosts["p1"].address
    failed = _probe(ctxs["d1"], ProbeFact(probe, MISSING, "timeout", "no answer within 3s"))
    assert failed.status == "fail" and "weights.seed: none" in failed.fix
    no_seed = contexts(parse_inventory(INV))
    assert not [p for c in no_seed.values() for p in c.probes if p.check_id == "network.seed"]


def test_only_leaving_a_recorded_commit_counts_as_moved() -> None:
    assert choose({"a": pin(C1)}, "org/m", "main", C2, refresh=True).moved
    assert not choose({"a": pin(C2)}, "org/m", "main", C2, refresh=True).moved
    assert not choose({}, "org/m", "main", C1).moved  # a first stage moves nothing
