"""`pdboot preflight --json` end to end: the real CLI (a subprocess) against testbed hosts
(real sshd and dockerd in network namespaces; emulated GPUs, HCAs and drivers per profile).

One testbed holds a host per profile; one run checks them all, as an operator would.
Under CI=true a testbed that cannot start fails these tests; elsewhere they skip.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.cli import Cli
from tests.conftest import module_testbed
from tests.testbed.harness import HostSpec

pytestmark = [pytest.mark.testbed, pytest.mark.slow]


# host name -> (profile, HostSpec knobs)
HOSTS: dict[str, tuple[str, dict[str, Any]]] = {
    "ok": ("rtx6000x2", {}),
    "h200": ("h200", {}),
    "olddrv": ("old-driver", {}),
    "nodrv": ("no-driver", {}),
    "noctk": ("no-container-runtime", {}),
    "ibdown": ("rtx6000x2-port-down", {}),
    "busy": ("rtx6000x2", {"busy_ports": (8201,)}),
    "lowdisk": ("rtx6000x2", {"overrides": {"disk_mb": 64}}),
    "nossh": ("rtx6000x2", {"sshd": False}),
    "ingress": ("cpu-only", {}),
}
PREFILL = ["h200", "olddrv", "ibdown"]
DECODE = ["ok", "nodrv", "noctk", "busy", "lowdisk", "nossh"]


# the images are in the registry: a healthy host passes docker.image_exists
tb = module_testbed(
    [HostSpec(n, profile=p, **kw) for n, (p, kw) in HOSTS.items()], images_needed=True
)


def preflight(
    cli: Cli, inv: Path, *args: str, env: dict[str, str | None] | None = None
) -> tuple[int, dict[str, Any], str]:
    p, doc = cli.run_json("preflight", str(inv), "--json", *args, timeout=180, env=env)
    return p.returncode, doc, p.stderr


def statuses(doc: dict[str, Any], host: str) -> dict[str, str]:
    """check id -> worst status on that host."""
    order = {"fail": 0, "warn": 1, "pass": 2, "skip": 3}
    out: dict[str, str] = {}
    for c in doc["hosts"][host]["checks"]:
        if c["id"] not in out or order[c["status"]] < order[out[c["id"]]]:
            out[c["id"]] = c["status"]
    return out


def inventory(tb: Any, tmp_path: Path, **overrides: Any) -> Path:
    return tb.inventory(
        tmp_path / "inv.yaml",
        prefill=PREFILL,
        decode=DECODE,
        router="ingress",
        overrides=overrides,
    )


@pytest.fixture(scope="module")
def full_inventory(tb: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return inventory(tb, tmp_path_factory.mktemp("full"))


@pytest.fixture(scope="module")
def full_run(cli: Cli, full_inventory: Path) -> tuple[int, dict[str, Any]]:
    rc, doc, _ = preflight(cli, full_inventory)
    return rc, doc


def test_the_json_has_the_documented_shape_and_exit_1(full_run: tuple[int, dict[str, Any]]) -> None:
    rc, doc = full_run
    assert rc == 1 and doc["ok"] is False
    assert set(doc["hosts"]) == set(HOSTS)
    for h in doc["hosts"].values():
        assert set(h) == {"reachable", "checks", "facts"}
        for c in h["checks"]:
            assert set(c) == {"id", "status", "message", "fix"}
            assert c["status"] in ("pass", "warn", "fail", "skip")
            if c["status"] == "fail":
                assert c["fix"], c


def test_the_json_says_version_time_counts_and_facts_in_inventory_order(
    full_run: tuple[int, dict[str, Any]], full_inventory: Path
) -> None:
    import datetime as dt

    import yaml

    from pdboot import __version__

    _, doc = full_run
    assert doc["version"] == __version__
    at = dt.datetime.strptime(doc["timestamp"], "%Y-%m-%dT%H:%M:%SZ")
    now = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    assert abs((now - at).total_seconds()) < 600
    every = [c["status"] for h in doc["hosts"].values() for c in h["checks"]]
    assert doc["counts"] == {s: every.count(s) for s in ("pass", "warn", "fail", "skip")}
    hosts = list(yaml.safe_load(full_inventory.read_text())["hosts"])
    assert list(doc["hosts"]) == [h for h in hosts if h in doc["hosts"]]
    assert len(doc["hosts"]) == len(HOSTS)
    gpus = doc["hosts"]["ok"]["facts"]["gpu"]["gpus"]
    assert [g["name"] for g in gpus] == ["NVIDIA RTX PRO 6000 Blackwell Server Edition"] * 2
    assert doc["hosts"]["nossh"]["facts"]["gpu"] is None


def test_no_driver_is_one_gpu_failure_and_what_needs_it_is_skipped(
    full_run: tuple[int, dict[str, Any]],
) -> None:
    _, doc = full_run
    checks = doc["hosts"]["nodrv"]["checks"]
    bad = [c["id"] for c in checks if c["status"] in ("fail", "warn")]
    gpu_bad = [
        i for i in bad if i.startswith("gpu.") or i in ("rdma.gpudirect", "rdma.nic_affinity")
    ]
    assert gpu_bad == ["gpu.nvidia_smi"], checks
    assert "docker.image_cuda" not in bad


@pytest.mark.parametrize(
    ("host", "expect"),
    [
        (
            "h200",
            {
                "gpu.model": "warn",
                "gpu.compute_cap": "warn",
                "gpu.driver": "pass",
                "docker.nvidia_runtime": "fail",
                "rdma.devices": "warn",
            },
        ),
        (
            "olddrv",
            {
                "gpu.driver": "fail",
                "gpu.cuda": "fail",
                "docker.image_cuda": "fail",
                "gpu.model": "pass",
            },
        ),
        (
            "nodrv",
            {"gpu.nvidia_smi": "fail", "docker.nvidia_runtime": "fail", "docker.engine": "pass"},
        ),
        ("noctk", {"docker.nvidia_runtime": "fail", "gpu.driver": "pass"}),
        ("ibdown", {"rdma.ports": "warn", "rdma.devices": "pass"}),
        ("busy", {"host.ports": "fail"}),
        ("lowdisk", {"host.disk_docker": "fail", "host.disk_hf_cache": "fail"}),
        ("ingress", {"network.ingress": "pass", "docker.engine": "pass"}),
    ],
)
def test_each_profile_gets_its_verdicts(
    full_run: tuple[int, dict[str, Any]], host: str, expect: dict[str, str]
) -> None:
    _, doc = full_run
    assert doc["hosts"][host]["reachable"] is True
    got = statuses(doc, host)
    assert {k: got.get(k) for k in expect} == expect, doc["hosts"][host]["checks"]


def test_the_healthy_host_has_no_failure(full_run: tuple[int, dict[str, Any]]) -> None:
    _, doc = full_run
    got = statuses(doc, "ok")
    assert "fail" not in got.values(), doc["hosts"]["ok"]["checks"]
    for cid in (
        "gpu.driver",
        "gpu.count",
        "docker.nvidia_runtime",
        "rdma.ports",
        "network.side_channel",
        "network.clock",
        "host.ports",
    ):
        assert got[cid] == "pass", cid
    # the test machine's dockerd cannot raise memlock: the lowered limit is reported
    assert got["host.ulimits"] == "warn"
    msgs = {c["id"]: c["message"] for c in doc["hosts"]["ok"]["checks"]}
    assert "RTX PRO 6000 Blackwell" in msgs["gpu.model"]
    assert "580.95.05" in msgs["gpu.driver"]


def test_messages_name_what_was_measured(full_run: tuple[int, dict[str, Any]]) -> None:
    _, doc = full_run
    msg = {h: {c["id"]: c["message"] for c in v["checks"]} for h, v in doc["hosts"].items()}
    assert "550.90.07" in msg["olddrv"]["gpu.driver"]
    assert "8201" in msg["busy"]["host.ports"]
    assert "PORT_DOWN" in msg["ibdown"]["rdma.ports"]


def test_an_unreachable_host_is_reported_and_the_others_checked(
    full_run: tuple[int, dict[str, Any]],
) -> None:
    _, doc = full_run
    h = doc["hosts"]["nossh"]
    assert h["reachable"] is False
    # what this machine judges, here the tiers' agreement (a decode host's), is reported anyway
    assert [c["id"] for c in h["checks"]] == ["ssh.connect", "model.tier_agreement"]
    assert h["checks"][0]["status"] == "fail"
    assert "unreachable" in h["checks"][0]["message"]
    assert doc["hosts"]["ok"]["reachable"] is True


def test_an_unset_secret_is_reported_while_its_host_is_unreachable(
    cli: Cli, tb: Any, tmp_path: Path
) -> None:
    """The secret references are this machine's: an unreachable first host (where they are
    reported) hides none of them, with --only secrets too."""
    unset = "PDBOOT_E2E_NEVER_SET_46"
    inv = tb.inventory(
        tmp_path / "inv.yaml",
        prefill=["nossh"],
        decode=["nossh"],
        router="ingress",
        overrides={
            "secrets": {"env": {"EXTRA": f"env:{unset}"}},
            "prefill": {"gpus": [0]},  # both tiers on nossh, the first deployment host
            "decode": {"gpus": [1]},
        },
    )
    for only in ((), ("--only", "secrets")):
        rc, doc, err = preflight(cli, inv, *only, env={unset: None})
        assert rc == 1, err
        assert doc["hosts"]["nossh"]["reachable"] is False
        found = statuses(doc, "nossh")
        assert found["ssh.connect"] == "fail" and found["secrets.env"] == "fail", found
        (said,) = [c for c in doc["hosts"]["nossh"]["checks"] if c["id"] == "secrets.env"]
        assert unset in said["message"] and said["fix"].startswith(f"export {unset}=")
        if only:
            assert set(found) == {"ssh.connect", "secrets.env"}


def test_decode_hosts_probe_every_prefill_side_channel(
    full_run: tuple[int, dict[str, Any]],
) -> None:
    _, doc = full_run
    probes = [c for c in doc["hosts"]["ok"]["checks"] if c["id"] == "network.side_channel"]
    assert len(probes) == len(PREFILL)
    assert all("refused" in c["message"] for c in probes)


def test_rdma_required_turns_a_down_port_into_a_failure(cli: Cli, tb: Any, tmp_path: Path) -> None:
    inv = inventory(tb, tmp_path, requirements={"rdma": "required", "min_free_disk_gb": 1})
    rc, doc, _ = preflight(cli, inv, "--only", "rdma")
    assert rc == 1
    assert statuses(doc, "ibdown")["rdma.ports"] == "fail"
    assert statuses(doc, "h200")["rdma.devices"] == "fail"
    assert statuses(doc, "ok")["rdma.ports"] == "pass"
    ids = {c["id"].split(".")[0] for h in doc["hosts"].values() for c in h["checks"]}
    assert ids <= {"rdma", "ssh"}


def test_only_healthy_hosts_exit_0(cli: Cli, tb: Any, tmp_path: Path) -> None:
    inv = tb.inventory(
        tmp_path / "ok.yaml",
        prefill=["ok"],
        decode=["busy"],
        router="ok",
        overrides={"prefill": {"gpus": [0]}, "decode": {"gpus": [1]}},
    )
    rc, doc, _ = preflight(cli, inv, "--skip", "host.ports")
    assert (rc, doc["ok"]) == (0, True), doc


def unknown_keys(tb: Any, tmp_path: Path) -> tuple[Path, Path]:
    """An inventory of two hosts whose ssh.known_hosts is empty, and that file."""
    kh = tmp_path / "known_hosts"
    kh.write_text("")
    inv = tb.inventory(
        tmp_path / "kh.yaml",
        prefill=["ok"],
        decode=["noctk"],
        router="ok",
        overrides={"ssh": {"known_hosts": str(kh)}},
    )
    return inv, kh


def test_unknown_host_key_is_refused_then_accepted_on_request(
    cli: Cli, tb: Any, tmp_path: Path
) -> None:
    inv, kh = unknown_keys(tb, tmp_path)
    rc, doc, _ = preflight(cli, inv, "--only", "ssh")
    assert rc == 1
    c = doc["hosts"]["ok"]["checks"][0]
    assert doc["hosts"]["ok"]["reachable"] is False
    assert c["message"].startswith("host_key:") and "SHA256:" in c["message"]
    assert "ssh-keyscan" in c["fix"] and "--accept-new-host-keys" in c["fix"]
    assert kh.read_text() == ""  # never silently trusted

    rc, doc, _ = preflight(cli, inv, "--only", "ssh", "--accept-new-host-keys")
    assert rc == 0 and doc["hosts"]["ok"]["reachable"] is True
    assert tb.hosts["ok"].address in kh.read_text()
    rc, _, _ = preflight(cli, inv, "--only", "ssh")  # now known: strict checking passes
    assert rc == 0


def test_a_changed_host_key_is_refused_even_with_accept_new(
    cli: Cli, tb: Any, tmp_path: Path
) -> None:
    kh = tmp_path / "known_hosts"
    good = tb.known_hosts.read_text().splitlines()
    other = tb.hosts["noctk"].address
    # claim that "ok" has the key of another host: a changed key
    key_of_other = next(ln for ln in good if ln.startswith(other + " ")).split(" ", 1)[1]
    kh.write_text(f"{tb.hosts['ok'].address} {key_of_other}\n")
    inv = tb.inventory(
        tmp_path / "kc.yaml",
        prefill=["ok"],
        decode=["ok"],
        router="ok",
        overrides={
            "ssh": {"known_hosts": str(kh)},
            "prefill": {"gpus": [0]},
            "decode": {"gpus": [1]},
        },
    )
    rc, doc, _ = preflight(cli, inv, "--only", "ssh", "--accept-new-host-keys")
    assert rc == 1
    assert doc["hosts"]["ok"]["checks"][0]["message"].startswith("host_key_changed:")


def test_usage_errors_exit_2(cli: Cli, tb: Any, tmp_path: Path) -> None:
    inv = inventory(tb, tmp_path)
    p = cli("preflight", str(inv), "--only", "gpux", timeout=60)
    assert p.returncode == 2 and "gpux" in p.stderr
