"""`kv_transfer.rdma: auto` on the testbed: preflight finds the ConnectX-7 port ACTIVE on one
host and no NIC on the other; the engines get /dev/infiniband + IPC_LOCK exactly there, and
a second `up` without preflight (and `status`) still see the same configuration.

Under CI=true a testbed that cannot start fails this test; elsewhere it skips.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.cli import Cli, output
from tests.testbed.harness import HostSpec

pytestmark = [pytest.mark.testbed, pytest.mark.slow]


def host_config(tb: Any, host: str, container: str) -> dict[str, Any]:
    res = tb.hosts[host].docker("inspect", container)
    assert res.returncode == 0, res.stderr
    doc: dict[str, Any] = json.loads(res.stdout)[0]
    return doc


def test_auto_rdma_follows_preflight_per_host(cli: Cli, make_testbed: Any, tmp_path: Path) -> None:
    tb = make_testbed(
        [HostSpec("ib", profile="rtx6000x2"), HostSpec("eth", profile="rtx6000x2-no-rdma")]
    )
    inv = tb.inventory(
        tmp_path / "inv.yaml",
        name="rdmaauto",
        decode=["ib"],
        prefill=["eth"],
        router="ib",
        overrides={
            "kv_transfer": {"rdma": "auto"},
            "decode": {"env": {"STANDIN_LOAD_SECONDS": "0.5"}},
            "prefill": {"env": {"STANDIN_LOAD_SECONDS": "0.5"}},
        },
    )
    doc = yaml_hosts(inv)
    assert all("rdma_devices" not in h for h in doc.values())  # nothing declared

    first = cli("up", str(inv))
    assert first.returncode == 0, output(first)
    assert "rdma (auto): on for ib (preflight found mlx5_0:1 ACTIVE)" in first.stdout
    assert "rdma (auto): off for eth (preflight found no RDMA device" in first.stdout

    ib = host_config(tb, "ib", "pdboot-rdmaauto-decode")
    assert [d["PathOnHost"] for d in ib["HostConfig"]["Devices"] or []] == ["/dev/infiniband"]
    assert "IPC_LOCK" in " ".join(ib["HostConfig"]["CapAdd"] or [])
    assert "UCX_NET_DEVICES=mlx5_0:1" in ib["Config"]["Env"]
    # the device nodes really reached the container
    code = "import os; print(' '.join(sorted(os.listdir('/dev/infiniband'))))"
    ls = tb.hosts["ib"].docker("exec", "pdboot-rdmaauto-decode", "python3", "-c", code)
    assert "uverbs0" in ls.stdout.split(), ls.stdout + ls.stderr

    eth = host_config(tb, "eth", "pdboot-rdmaauto-prefill")
    assert not eth["HostConfig"]["Devices"]
    assert "IPC_LOCK" not in " ".join(eth["HostConfig"]["CapAdd"] or [])
    # no RDMA there: UCX goes over TCP on the interface that reaches the peer (not an HCA)
    ucx = [e for e in eth["Config"]["Env"] if e.startswith("UCX_NET_DEVICES=")]
    assert ucx == ["UCX_NET_DEVICES=eth0"], ucx

    # no preflight now: the findings recorded on the hosts give the same config hashes
    status = cli.status_json(inv)
    assert all(s["matches_inventory"] for s in status["services"]), status
    again = cli("up", str(inv), "--skip-preflight")
    assert again.returncode == 0, output(again)
    assert "as the last preflight found, recorded on the host" in again.stdout
    for key in ("decode@ib", "prefill@eth", "router@ib"):
        line = next(ln for ln in again.stdout.splitlines() if ln.startswith(key))
        assert "unchanged" in line, again.stdout
    assert host_config(tb, "ib", "pdboot-rdmaauto-decode")["Id"] == ib["Id"]

    down = cli("down", str(inv))
    assert down.returncode == 0, output(down)
    for h in tb.hosts.values():
        assert h.docker("ps", "-aq").stdout.split() == [], h.name


def yaml_hosts(path: Path) -> dict[str, Any]:
    import yaml

    hosts: dict[str, Any] = yaml.safe_load(path.read_text())["hosts"]
    return hosts
