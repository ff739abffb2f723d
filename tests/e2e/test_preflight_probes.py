"""A host's cross-host probes run as one command of its batch (issue 35), on real sshd hosts:
a peer that answers passes ("refused": reachable, nothing listens yet), a peer gone silent
(its link cut: no reset, no answer) fails with the reason, and one silent peer does not
change the verdicts of the others probed in the same command."""

from __future__ import annotations

from typing import Any

from tests.cli import Cli


def test_a_silent_peer_fails_its_probe_and_the_others_still_pass(
    cli: Cli, make_testbed: Any
) -> None:
    from tests.testbed.harness import HostSpec

    names = ("d", "p1", "p2", "r")
    tb = make_testbed(
        [HostSpec(n, profile="cpu-only", dockerd=False) for n in names], images_needed=False
    )
    inv = tb.inventory(tb.dir / "inv.yaml", decode=["d"], prefill=["p1", "p2"], router="r")
    tb.hosts["p2"].cut_link()
    p, doc = cli.run_json("preflight", str(inv), "--json", "--only", "network", timeout=180)
    assert p.returncode == 1 and not doc["hosts"]["p2"]["reachable"], p.stdout
    addr = {n: tb.hosts[n].address for n in names}

    def probes(host: str, cid: str) -> dict[str, dict[str, str]]:
        checks = [c for c in doc["hosts"][host]["checks"] if c["id"] == cid]
        return {a: c for a in addr.values() for c in checks if f" {a}:" in c["message"]}

    side = probes("d", "network.side_channel")
    assert side[addr["p1"]]["status"] == "pass" and "refused" in side[addr["p1"]]["message"]
    bad = side[addr["p2"]]
    assert bad["status"] == "fail", bad
    assert "no answer within" in bad["message"] or "no route" in bad["message"], bad
    ingress = probes("r", "network.ingress")
    assert {a: c["status"] for a, c in ingress.items()} == {
        addr["d"]: "pass",
        addr["p1"]: "pass",
        addr["p2"]: "fail",
    }
