"""`pdboot preflight` on an inventory whose only host is `local`: the same checks run on
this machine through bash, without SSH. (This machine has no GPU: GPU checks fail, which
is the point -- they ran and judged real output.)"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.cli import Cli

pytestmark = [pytest.mark.slow]


INVENTORY = """\
name: localcheck
model: Qwen/Qwen3-0.6B
hosts:
  me: {address: local}
prefill: {hosts: [me], gpus: [0], port: 18200, side_channel_port: 15600}
decode: {hosts: [me], gpus: [1], port: 18201, side_channel_port: 15601}
router: {host: me, port: 18000, metrics_port: 19000}
container: {hf_cache: HF}
requirements: {min_free_disk_gb: 0}
"""


def local_inventory(tmp_path: Path) -> Path:
    inv = tmp_path / "local.yaml"
    # hf_cache may not lie under /tmp (where tmp_path is): a path that need not exist
    inv.write_text(INVENTORY.replace("HF", "/var/lib/pdboot-localcheck/hf-cache"))
    return inv


def test_local_host_runs_the_checks_without_ssh(cli: Cli, tmp_path: Path) -> None:
    inv = local_inventory(tmp_path)
    p, doc = cli.run_json("preflight", str(inv), "--json", timeout=120)
    me = doc["hosts"]["me"]
    assert me["reachable"] is True
    ids = {c["id"]: c for c in me["checks"]}
    assert ids["ssh.connect"]["status"] == "pass"
    assert {"gpu.nvidia_smi", "docker.engine", "host.ports", "network.clock"} <= set(ids)
    probes = [c for c in me["checks"] if c["id"] in ("network.side_channel", "network.ingress")]
    assert len(probes) == 3 and all("127.0.0.1" in c["message"] for c in probes)
    assert p.returncode == (0 if doc["ok"] else 1)


def test_a_reader_gone_ends_it_with_1_and_no_traceback(cli: Cli, tmp_path: Path) -> None:
    inv = local_inventory(tmp_path)
    for extra in ([], ["--accept-new-host-keys"]):
        p = cli.popen(
            "preflight", str(inv), "--json", *extra,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert p.stdout is not None
        p.stdout.close()  # long before the report is written
        _, err = p.communicate(timeout=120)
        assert p.returncode == 1, (extra, err)
        assert "Traceback" not in err and "Exception ignored" not in err, (extra, err)
