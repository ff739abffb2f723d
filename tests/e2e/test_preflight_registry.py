"""The image's CUDA version read from the testbed's REAL registry (docker-registry, plain
http on a 10.77.x.1 address) before any pull, and `pdboot preflight` failing an old-driver
host on it. Traffic goes only to the testbed's addresses.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pdboot.preflight import registry
from pdboot.preflight.checks import docker as dk
from tests.cli import Cli
from tests.testbed.harness import HostSpec, Testbed

pytestmark = [pytest.mark.testbed, pytest.mark.slow]


def test_lookup_reads_the_image_config_from_the_registry(testbed: Testbed) -> None:
    assert testbed.registry.startswith("10.77.")
    look = registry.lookup(testbed.image)
    assert look.error == "" and look.config is not None, look.error
    cfg = look.config
    assert cfg.cuda_version == "13.0.1"
    assert cfg.require_cuda is not None and "cuda>=13.0" in cfg.require_cuda
    assert cfg.scheme == "http"  # https failed; a private address may fall back
    assert (cfg.os, cfg.architecture) == ("linux", "amd64")
    assert cfg.digest.startswith("sha256:") and cfg.compressed_size > 1_000_000


def test_lookup_failures_are_reasons(testbed: Testbed) -> None:
    missing = registry.lookup(f"{testbed.registry}/vllm/vllm-openai:v9.9.9")
    assert missing.config is None and "not found" in missing.error
    closed = f"{testbed.gateway}:5999"  # the testbed's own address, nothing listening
    nobody = registry.lookup(f"{closed}/x/y:z", timeout=1.0)
    assert nobody.config is None and closed in nobody.error and "refused" in nobody.error


def test_the_hosts_docker_info_lists_the_registry_as_insecure(testbed: Testbed) -> None:
    out = testbed.hosts["decode"].docker("info", "--format", "{{json .}}").stdout
    insecure = dk.parse_info(out).insecure_registries
    assert testbed.registry in insecure
    assert registry.allows_plain_http(testbed.registry, insecure)


def _preflight(cli: Cli, inv: Path) -> tuple[int, dict[str, Any]]:
    res, doc = cli.run_json("preflight", str(inv), "--json", timeout=180)
    return res.returncode, doc


def _check(doc: dict[str, Any], host: str, cid: str) -> dict[str, str]:
    found = [c for c in doc["hosts"][host]["checks"] if c["id"] == cid]
    assert len(found) == 1, doc["hosts"][host]["checks"]
    return found[0]


def test_preflight_fails_an_old_driver_on_the_registry_cuda_before_any_pull(
    cli: Cli, make_testbed: Callable[..., Testbed], tmp_path: Path
) -> None:
    bed = make_testbed([HostSpec("olddrv", profile="old-driver"), HostSpec("ok")])
    for h in bed.hosts.values():  # never pulled on either host
        assert h.docker("image", "inspect", bed.image, check=False).returncode != 0
    inv = bed.inventory(tmp_path / "inv.yaml", prefill=["olddrv"], decode=["ok"], router="ok")
    rc, doc = _preflight(cli, inv)
    assert rc == 1
    old = _check(doc, "olddrv", "docker.image_cuda")
    assert old["status"] == "fail"
    assert "CUDA 13.0.1 (CUDA_VERSION in the registry's image config" in old["message"]
    assert "580.65.06" in old["message"] and "550.90.07" in old["message"]
    assert "580.65.06" in old["fix"]
    ok = _check(doc, "ok", "docker.image_cuda")
    assert ok["status"] == "pass" and "the registry's image config" in ok["message"]
    for h in bed.hosts.values():  # preflight pulled nothing
        assert h.docker("image", "inspect", bed.image, check=False).returncode != 0

    # a tag the registry lacks: the lookup's reason is shown, the tag decides (CUDA 12.4,
    # which R550 runs: 550.90.07 >= 550.54.14)
    inv = bed.inventory(
        tmp_path / "missing.yaml",
        prefill=["olddrv"],
        decode=["ok"],
        router="ok",
        overrides={"image": f"{bed.registry}/vllm/vllm-openai:cu124-missing"},
    )
    _, doc = _preflight(cli, inv)
    old = _check(doc, "olddrv", "docker.image_cuda")
    assert old["status"] == "pass", old
    assert "from the tag" in old["message"] and "registry lookup failed" in old["message"]
