"""pdboot.preflight.registry's pure parts (references, auth challenges, manifest lists, configs) and
how docker.image_cuda ranks its sources: registry > image on the host > tag > requirements.

No network: the registry documents are files under fixtures/registry/ (see its README).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from pdboot.preflight import registry as rg
from pdboot.preflight.checks import Section
from pdboot.preflight.checks import cuda as cu
from pdboot.preflight.checks import docker as dk
from pdboot.preflight.run import insecure_registries, with_lookup
from tests.unit.paths import FIXTURES
from tests.unit.preflight.test_checks import ctx, results

REG = FIXTURES / "registry"
OLD = "r550-old-driver.txt"  # driver 550.90.07
NOT_HERE = {"@image": Section("Error: No such image: vllm/vllm-openai:v0.33.0\n", 1)}


def doc(name: str) -> dict[str, Any]:
    out = json.loads((REG / name).read_text())
    assert isinstance(out, dict)
    return out


# --------------------------------------------------------------------------- references


@pytest.mark.parametrize(
    ("image", "expect"),
    [
        ("vllm/vllm-openai:v0.33.0", ("registry-1.docker.io", "vllm/vllm-openai", "v0.33.0", None)),
        ("ubuntu", ("registry-1.docker.io", "library/ubuntu", "latest", None)),
        (
            "docker.io/library/ubuntu:24.04",
            ("registry-1.docker.io", "library/ubuntu", "24.04", None),
        ),
        (
            "10.77.3.1:5000/vllm/vllm-openai:v0.33.0",
            ("10.77.3.1:5000", "vllm/vllm-openai", "v0.33.0", None),
        ),
        ("localhost/team/engine", ("localhost", "team/engine", "latest", None)),
        (
            "nvcr.io/nvidia/cuda:13.0.1-base-ubuntu24.04",
            ("nvcr.io", "nvidia/cuda", "13.0.1-base-ubuntu24.04", None),
        ),
        (
            "reg.lab:5000/vllm@sha256:" + "ab" * 32,
            ("reg.lab:5000", "vllm", None, "sha256:" + "ab" * 32),
        ),
        (
            "vllm/vllm-openai:v0.33.0@sha256:" + "cd" * 32,
            ("registry-1.docker.io", "vllm/vllm-openai", "v0.33.0", "sha256:" + "cd" * 32),
        ),
        ("[fd00::1]:5000/a/b:c", ("[fd00::1]:5000", "a/b", "c", None)),
    ],
)
def test_references_normalise_like_docker(image: str, expect: tuple[Any, ...]) -> None:
    r = rg.parse_reference(image)
    assert (r.registry, r.repository, r.tag, r.digest) == expect
    assert r.reference == (expect[3] or expect[2])


def test_digest_wins_and_hosts_lose_their_port() -> None:
    assert rg.parse_reference("a/b:t@sha256:" + "0" * 64).reference == "sha256:" + "0" * 64
    assert rg.parse_reference("10.77.3.1:5000/a:b").host == "10.77.3.1"
    assert rg.parse_reference("[fd00::1]:5000/a:b").host == "fd00::1"


@pytest.mark.parametrize("bad", ["", "a b", "Vllm/Engine:x", "a/b:", "a/b@sha256:zz", "reg:5000/"])
def test_bad_references_are_errors(bad: str) -> None:
    with pytest.raises(rg.RegistryError):
        rg.parse_reference(bad)
    assert rg.lookup(bad).error  # a reason, not an exception


# --------------------------------------------------------------------------- auth


def test_docker_hub_challenge_becomes_an_anonymous_token_request() -> None:
    scheme, p = rg.parse_www_authenticate(
        'Bearer realm="https://auth.docker.io/token",service="registry.docker.io",'
        'scope="repository:vllm/vllm-openai:pull"'
    )
    assert scheme == "bearer"
    assert p == {
        "realm": "https://auth.docker.io/token",
        "service": "registry.docker.io",
        "scope": "repository:vllm/vllm-openai:pull",
    }
    url = rg.token_url(p, "vllm/vllm-openai")
    assert url == (
        "https://auth.docker.io/token?scope=repository%3Avllm%2Fvllm-openai%3Apull"
        "&service=registry.docker.io"
    )


def test_challenge_without_scope_asks_for_pull_and_basic_is_recognised() -> None:
    _, p = rg.parse_www_authenticate('Bearer realm="https://reg.lab/auth?x=1", service=reg')
    assert (
        rg.token_url(p, "a/b")
        == "https://reg.lab/auth?x=1&scope=repository%3Aa%2Fb%3Apull&service=reg"
    )
    assert rg.parse_www_authenticate('Basic realm="Registry Realm"') == (
        "basic",
        {"realm": "Registry Realm"},
    )
    with pytest.raises(rg.RegistryError):
        rg.token_url({"realm": "ftp://x"}, "a/b")


# --------------------------------------------------------------------------- manifests


def test_manifest_list_and_oci_index_pick_the_platform() -> None:
    hub, oci = doc("hub-manifest-list.json"), doc("oci-index.json")
    assert rg.select_manifest(hub) == "sha256:" + "1" * 64
    assert rg.select_manifest(hub, "linux/arm64") == "sha256:" + "2" * 64
    assert rg.select_manifest(hub, "linux/arm64/v8") == "sha256:" + "2" * 64
    assert rg.select_manifest(oci).endswith("0002")  # amd64, not the first entry
    assert rg.select_manifest(oci, "linux/arm64").endswith("0001")
    with pytest.raises(rg.RegistryError) as e:
        rg.select_manifest(oci, "linux/ppc64le")
    # attestation entries are not offered as platforms
    assert "linux/arm64, linux/amd64" in str(e.value) and "unknown" not in str(e.value)


def test_image_manifests_give_the_config_digest_and_the_download_size() -> None:
    dm, om = doc("docker-manifest.json"), doc("oci-manifest.json")
    assert rg.config_digest(dm).endswith("0001") and rg.config_digest(om).endswith("0002")
    assert rg.layers_size(dm) == 29754290 + 4621053802 + 7345002117 + 93
    assert rg.layers_size(om) == 5_031_000_000
    with pytest.raises(rg.RegistryError):
        rg.config_digest(doc("oci-index.json"))
    with pytest.raises(rg.RegistryError):
        rg.layers_size({"schemaVersion": 2})


def test_config_env_carries_the_cuda_version() -> None:
    env = rg.env_map(doc("cuda-config.json"))
    assert env["CUDA_VERSION"] == "13.0.1"
    assert env["NVIDIA_REQUIRE_CUDA"].startswith("cuda>=13.0 ")
    assert rg.env_map({"config": {"Env": None}}) == {} and rg.env_map({}) == {}


def test_plain_http_only_for_private_loopback_or_insecure_registries() -> None:
    assert rg.allows_plain_http("10.77.3.1:5000")
    assert rg.allows_plain_http("127.0.0.1:5000") and rg.allows_plain_http("localhost:5000")
    assert rg.allows_plain_http("[fd00::1]:5000")
    assert not rg.allows_plain_http("registry-1.docker.io")
    assert not rg.allows_plain_http("8.8.8.8:5000")
    assert rg.allows_plain_http("reg.lab:5000", ["reg.lab:5000"])
    assert rg.allows_plain_http("100.64.0.9:5000", ["100.64.0.0/10"])


def test_docker_info_lists_insecure_registries_json_and_text() -> None:
    rc = doc("docker-info-registry.json")
    js = json.dumps({"ServerVersion": "26.1.5", "RegistryConfig": rc})
    assert dk.parse_info(js).insecure_registries == ("10.77.3.1:5000", "127.0.0.0/8")
    text = (
        "Server:\n Server Version: 26.1.5\n Insecure Registries:\n  10.77.3.1:5000\n"
        "  127.0.0.0/8\n Live Restore Enabled: false\n"
    )
    assert dk.parse_info(text).insecure_registries == ("10.77.3.1:5000", "127.0.0.0/8")
    batch = f"### $ {dk.INFO}\n{js}\n### exit=0\n"
    assert insecure_registries([batch, "garbage"]) == {"10.77.3.1:5000", "127.0.0.0/8"}


# --------------------------------------------------------------------------- image_cuda


def found(cuda: str | None = "13.0.1", size: int = 12_000_000_000, **env: str) -> rg.Lookup:
    e = dict(env)
    if cuda:
        e["CUDA_VERSION"] = cuda
    cfg = rg.ImageConfig(
        "vllm/vllm-openai:v0.33.0", "sha256:" + "e" * 64, "amd64", "linux", size, e
    )
    return rg.Lookup("vllm/vllm-openai:v0.33.0", cfg)


FAILED = rg.Lookup(
    "vllm/vllm-openai:v0.33.0", error="registry-1.docker.io rate-limited the lookup (HTTP 429)"
)


def image_cuda(look: rg.Lookup | None, *variants: str, **kw: Any) -> tuple[str, str]:
    extra = kw.pop("extra", None)
    r = results(ctx(image_lookup=look, **kw), *variants, extra=extra)
    return r["docker.image_cuda"][0].status, r["docker.image_cuda"][0].message


def test_registry_cuda_fails_an_old_driver_before_the_image_is_on_the_host() -> None:
    st, msg = image_cuda(found(), OLD, extra=NOT_HERE)
    assert st == "fail"
    assert "CUDA 13.0.1 (CUDA_VERSION in the registry's image config, before any pull)" in msg
    assert ">= 580.65.06" in msg and "550.90.07" in msg


def test_registry_beats_the_image_on_the_host() -> None:
    # the host holds a CUDA 13.0 image under that name; the registry's (12.4) is what `up` pulls
    st, msg = image_cuda(found("12.4.1"), OLD)
    assert st == "pass" and "CUDA 12.4.1" in msg and ">= 550.54.14" in msg


def test_a_failed_lookup_falls_back_to_the_host_then_the_tag_then_requirements() -> None:
    st, msg = image_cuda(FAILED, OLD)
    assert st == "fail" and "CUDA_VERSION of the image on this host" in msg
    assert "registry lookup failed: registry-1.docker.io rate-limited" in msg
    st, msg = image_cuda(FAILED, OLD, extra=NOT_HERE, image="vllm/vllm-openai:cu124-nightly")
    assert st == "pass" and "from the tag 'cu124-nightly'" in msg
    st, msg = image_cuda(None, OLD, extra=NOT_HERE)
    assert st == "fail" and "requirements.cuda" in msg and "registry" not in msg


def test_require_cuda_when_the_config_has_no_cuda_version() -> None:
    st, msg = image_cuda(found(None, NVIDIA_REQUIRE_CUDA="cuda>=12.8 brand=tesla,driver>=535"), OLD)
    assert st == "fail" and "CUDA 12.8 (NVIDIA_REQUIRE_CUDA" in msg and ">= 570.26" in msg
    st, msg = image_cuda(found(None), OLD)  # a config without CUDA: the host's image decides
    assert "no CUDA_VERSION" in msg and "image on this host" in msg


def test_a_cuda_minor_newer_than_the_table_is_a_warning_not_a_pass() -> None:
    st, msg = image_cuda(found("13.2.0"))
    assert st == "warn" and "CUDA 13.x needs driver >= 580.65.06" in msg
    assert cu.driver_floor("13.2") == ("580.65.06", False)
    assert cu.driver_floor("12.8.1") == ("570.26", True)
    assert cu.driver_floor("14.0") is None and cu.driver_floor("x") is None


def test_the_registry_size_feeds_the_disk_check() -> None:
    c = ctx()
    assert with_lookup(c, None) is c
    assert with_lookup(c, FAILED).image_size_bytes == c.image_size_bytes
    assert with_lookup(c, found(size=10_000_000_000)).image_size_bytes == 30_000_000_000
