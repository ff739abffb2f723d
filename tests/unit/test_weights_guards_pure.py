"""The weights guards' pure parts with plain values: the hashes the revision API gives,
the endpoint and directory refusals at inventory load, the HF cache directory's verdict."""

from __future__ import annotations

import json

import pytest

from pdboot.deploy.weights.workdir import cache_dir_problem
from pdboot.inventory.load import InventoryError, parse_inventory
from pdboot.plan.weights.hub import HubProblem, Resolution, endpoint_refusal
from pdboot.transport.http import HttpAnswer
from pdboot.transport.hub import parse_revision

C1 = "a" * 40
EP = "https://huggingface.co"
GOOD = """\
name: demo
model: org/m
hosts:
  a: {address: 192.0.2.10}
  b: {address: 192.0.2.11}
prefill: {hosts: [a], gpus: [[0]]}
decode: {hosts: [b], gpus: [[0]]}
router: {host: a}
"""


def answer(siblings: list[dict[str, object]]) -> HttpAnswer:
    return HttpAnswer(200, json.dumps({"sha": C1, "siblings": siblings}))


def test_each_file_gets_the_hubs_sha256_or_its_git_blob_id() -> None:
    r = parse_revision(
        answer(
            [
                {"rfilename": "config.json", "size": 6, "blobId": "1" * 40},
                {
                    "rfilename": "model.safetensors",
                    "size": 9,
                    "blobId": "2" * 40,
                    "lfs": {"sha256": "3" * 64, "size": 9, "pointerSize": 134},
                },
            ]
        ),
        "org/m",
        "main",
        EP,
        False,
    )
    assert isinstance(r, Resolution)
    assert dict(r.hashes) == {
        "config.json": "git:" + "1" * 40,
        "model.safetensors": "sha256:" + "3" * 64,
    }


@pytest.mark.parametrize(
    "sibling",
    [
        {"rfilename": "config.json", "size": 6},  # no ?blobs=true answer
        {"rfilename": "config.json", "size": 6, "blobId": "zz"},
        {"rfilename": "m.safetensors", "size": 6, "blobId": "1" * 40, "lfs": {"size": 6}},
    ],
)
def test_a_file_without_a_usable_hash_is_a_bad_answer(sibling: dict[str, object]) -> None:
    r = parse_revision(answer([sibling]), "org/m", "main", EP, False)
    assert isinstance(r, HubProblem) and r.kind == "bad_answer", r
    assert str(sibling["rfilename"]) in r.message


def test_plain_http_only_when_asked_by_name() -> None:
    assert endpoint_refusal(EP, False) is None
    assert "allow_plain_http" in (endpoint_refusal("http://10.0.0.1:5080", False) or "")
    assert endpoint_refusal("http://10.0.0.1:5080", True) is None
    assert endpoint_refusal("ftp://x", True) is not None
    with pytest.raises(InventoryError, match="allow_plain_http"):
        parse_inventory(GOOD + "weights: {endpoint: 'http://mirror:8080'}\n")
    inv = parse_inventory(GOOD + "weights: {endpoint: 'http://m:80', allow_plain_http: true}\n")
    assert inv.weights.endpoint == "http://m:80"
    assert parse_inventory(GOOD + "weights: {endpoint: 'https://m'}\n").weights.endpoint


@pytest.mark.parametrize(
    "extra",
    [
        "container: {hf_cache: /tmp/hf}\n",
        "container: {hf_cache: /var/tmp/pd/hf}\n",
        "container: {hf_cache: /dev/shm/hf}\n",
        "remote_dir: /tmp/pdboot\n",
        "remote_dir: /var/tmp/x\n",
    ],
)
def test_work_and_cache_dirs_under_world_writable_temp_trees_are_refused(extra: str) -> None:
    with pytest.raises(InventoryError, match=r"temporary|system"):
        parse_inventory(GOOD + extra)


def test_tmp_lookalikes_are_fine() -> None:
    assert parse_inventory(GOOD + "container: {hf_cache: /tmpdata/hf}\n").container.hf_cache


@pytest.mark.parametrize(
    ("out", "bad"),
    [
        ("missing\n0\n", None),
        ("0 755 directory\n0\n", None),
        ("1000 700 directory\n1000\n", None),
        ("0 777 directory\n0\n", "writable by others"),
        ("0 775 directory\n0\n", "writable by others"),
        ("1001 755 directory\n0\n", "owned by uid 1001"),
        ("0 777 symbolic link\n0\n", "symbolic link"),
        ("stat: permission denied\n", "cannot inspect"),
    ],
)
def test_the_hf_cache_dirs_owner_and_mode(out: str, bad: str | None) -> None:
    got = cache_dir_problem(out, "/data/hf")
    assert (got is None) if bad is None else (bad in (got or "")), got
