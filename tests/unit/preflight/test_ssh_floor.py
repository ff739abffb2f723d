"""Preflight at the SSH floor (issue 35): a host's cross-host probes are one command of its
one batch, whatever the number of peers; the probes' verdicts are the single probes' (on
live output from this machine's loopback and on the recorded captures); and `preflight
--json` imports nothing it does not use (the docker SDK, requests, rich)."""

from __future__ import annotations

from pathlib import Path

from pdboot.inventory.load import load_inventory
from pdboot.inventory.schema import Requirements
from pdboot.preflight import run as pf
from pdboot.preflight.checks import MISSING, HostContext, Probe, Section, batch_script, network
from pdboot.preflight.checks import parse_sections as sections_of
from pdboot.preflight.contexts import contexts
from pdboot.transport.connection import LocalConnection
from pdboot.transport.fanout import Outcome
from tests.unit.paths import FIXTURES, python_in_root

OWNERS = FIXTURES / "owners"


def router(n: int) -> HostContext:
    probes = tuple(
        Probe("network.ingress", f"e{i}", "127.0.0.1", 9, f"e{i} HTTP") for i in range(n)
    )
    return HostContext(name="edge", roles=("router",), req=Requirements(), probes=probes)


def test_probes_are_one_command_whatever_the_number_of_peers() -> None:
    counts = {n: len(pf.host_commands(router(n))) for n in (1, 4, 32)}
    assert len(set(counts.values())) == 1, counts
    keys = [c.key for c in pf.host_commands(router(32))]
    assert keys.count("probes") == 1 and not [k for k in keys if k[5:].isdigit()]


def test_probes_run_together_and_read_like_the_single_probes() -> None:
    ctx = router(3)
    bad = Probe("network.ingress", "x", "127.0.0.1/1;touch /tmp/pdboot-pwned-35;#", 1, "x")
    ctx = HostContext(name="edge", roles=("router",), req=Requirements(), probes=(*ctx.probes, bad))
    out = LocalConnection("t").run(batch_script(pf.host_commands(ctx))).stdout
    assert not Path("/tmp/pdboot-pwned-35").exists()
    res, facts = pf.evaluate_host(ctx, out)
    assert facts.network is not None
    verdicts = [f.verdict for f in facts.network.probes]
    assert all(v in ("refused", "open") for v in verdicts[:3]), verdicts
    assert verdicts[3] == "unreachable"
    # the same probes run one by one, as older batches did, give the same verdicts
    single = [
        network.parse_probe(LocalConnection("t").run(network.probe_command(p)).stdout)[0]
        for p in ctx.probes
    ]
    assert single == verdicts
    ingress = [r.status for r in res if r.id == "network.ingress"]
    assert ingress == ["pass", "pass", "pass", "fail"]


def test_a_probe_still_waiting_at_the_timeout_reads_as_a_timeout() -> None:
    text = "probe=0\nbash: connect: Connection refused\nrc=1\nprobe=1\nrc=124\n"
    first, second, third = network.split_probes(text, 3)
    assert first is not None and network.parse_probe(first)[0] == "refused"
    assert second is not None and network.parse_probe(second)[0] == "timeout"
    assert third is None  # never printed: "could not parse", as a missing single probe was
    facts = network.parse(router(3), {"probes": Section(text, 0)})
    assert [f.verdict for f in facts.probes] == ["refused", "timeout", None]


def test_both_layouts_give_the_same_facts() -> None:
    ctx = router(2)
    refused = "bash: connect: Connection refused\nrc=1\n"
    together = {"probes": Section(f"probe=0\n{refused}probe=1\nrc=124\n", 0)}
    single = {"probes": MISSING, "probe0": Section(refused, 0), "probe1": Section("rc=124\n", 0)}
    a, b = network.parse(ctx, together), network.parse(ctx, single)
    assert [(f.verdict, f.detail) for f in a.probes] == [(f.verdict, f.detail) for f in b.probes]


def test_recorded_captures_with_single_probes_keep_their_verdicts() -> None:
    inv = load_inventory(OWNERS / "inventory.yaml")
    ctxs = contexts(inv)
    hosts = ("decode", "prefill", "ingress")
    outcomes = {
        h: Outcome(value=((OWNERS / f"live-{h}.txt").read_text(), 0.0, 0.5, 0.5)) for h in hosts
    }
    reports, read = pf.read_reports(outcomes, ctxs, {})
    pf.judge_reports(inv, reports, read, {})
    side = [c for c in reports["decode"].checks if c.id == "network.side_channel"]
    assert side and all(c.status == "pass" for c in side), side
    assert "reachable, something already listens there" in side[0].message  # live: open
    # read from the single probe's section: the capture has no combined one
    recorded = sections_of((OWNERS / "live-decode.txt").read_text())
    probes = [c for c in pf.host_commands(ctxs["decode"]) if c.key == "probes"]
    assert probes and probes[0].line not in recorded


def test_preflight_json_imports_no_docker_sdk_requests_or_rich() -> None:
    probe = (
        "import sys\n"
        "import pdboot.cli.main, pdboot.inventory.load, pdboot.preflight.run, pdboot.views.preflight\n"
        # paramiko (with fabric and invoke): loaded when run_preflight connects, not before
        "heavy = ('docker', 'requests', 'urllib3', 'rich', 'paramiko', 'fabric', 'invoke')\n"
        "found = {m.split('.')[0] for m in sys.modules if m.split('.')[0] in heavy}\n"
        "found |= {m for m in sys.modules if m == 'cryptography.x509'}\n"  # only with router.tls
        # `up`'s event records (~35 dataclasses): the report reads them only for `up`
        "found |= {m for m in sys.modules if m == 'pdboot.events'}\n"
        "print(sorted(found))\n"
    )
    proc = python_in_root(probe)
    assert proc.stdout.strip() == "[]", proc.stdout
