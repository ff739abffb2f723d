"""Issue 18, items 5-8: values the review showed accepted, now refused at load time with
``file:line: key: message`` (the inventory text is the reproduction)."""

from __future__ import annotations

import json
import re

import pytest

from pdboot.inventory import flagnames, optionlists
from pdboot.inventory.hostpaths import sensitive_reason
from pdboot.inventory.imageref import check_image_reference
from pdboot.inventory.load import InventoryError, InventoryIssue, parse_inventory
from tests.shared_data import SERVE_ARGS_034_JSON, SERVE_ARGS_JSON
from tests.unit.builders import TWO_HOSTS_TEXT
from tests.unit.paths import FIXTURES, ROOT

SERVE_ARGS = SERVE_ARGS_JSON  # the copy of ../shared's capture every checkout has
SERVE_ARGS_034 = SERVE_ARGS_034_JSON
ROUTER_HELP = FIXTURES / "vllm-router-0.1.17-help.txt"
LOCATED = re.compile(r"^inv\.yaml:\d+: ")

GOOD = TWO_HOSTS_TEXT


def issues(text: str) -> list[InventoryIssue]:
    with pytest.raises(InventoryError) as exc:
        parse_inventory(text, file="inv.yaml")
    for i in exc.value.issues:
        assert i.line is not None and LOCATED.match(str(i)), str(i)
    return exc.value.issues


def refused(text: str, key: str, words: str) -> InventoryIssue:
    found = issues(text)
    match = [i for i in found if str(i).split(": ", 2)[1] == key]
    assert match, [str(i) for i in found]
    assert re.search(words, match[0].message, re.IGNORECASE), str(match[0])
    return match[0]


def sub(old: str, new: str) -> str:
    assert old in GOOD
    return GOOD.replace(old, new)


# --------------------------------------------------------------------------- item 7


def test_option_lists_are_generated_from_the_real_captures() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen", ROOT / "scripts" / "gen_option_lists.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert gen.SERVE_ARGS["0.33.0"] == SERVE_ARGS and gen.SERVE_ARGS["0.34.0"] == SERVE_ARGS_034
    serve = {v: gen.serve_options(p.read_text()) for v, p in gen.SERVE_ARGS.items()}
    router = gen.router_options(ROUTER_HELP.read_text())
    assert tuple(serve["0.33.0"]) == optionlists.VLLM_SERVE_BY_VERSION["0.33.0"]
    assert tuple(serve["0.34.0"]) == optionlists.VLLM_SERVE_BY_VERSION["0.34.0"]
    assert set(optionlists.VLLM_SERVE) == set(serve["0.33.0"]) | set(serve["0.34.0"])
    assert tuple(router) == optionlists.VLLM_ROUTER
    assert (ROOT / "pdboot" / "inventory" / "optionlists.py").read_text() == gen.module_text(
        serve, router
    )
    # the captures hold what the review used
    assert (
        "--api-key" in router and "--prometheus-port" in router and "--api-key" in serve["0.33.0"]
    )
    assert "--max-num-inflight-kv-loads" in serve["0.34.0"]
    assert "--max-num-inflight-kv-loads" not in serve["0.33.0"]
    for version, path in gen.SERVE_ARGS.items():
        doc = json.loads(path.read_text())
        assert doc["vllm_version"] == version
        assert len(serve[version]) == len({o for a in doc["actions"] for o in a["option_strings"]})


@pytest.mark.parametrize(
    ("arg", "program", "expect"),
    [
        ("--api-ke", flagnames.ROUTER, ("--api-key",)),
        ("--prometheus-po=9", flagnames.ROUTER, ("--prometheus-port",)),
        ("--request-timeout", flagnames.ROUTER, ("--request-timeout-secs",)),
        ("--po", flagnames.ENGINE, ("--pooler-config", "--port")),  # argparse: ambiguous
        ("--por", flagnames.ENGINE, ("--port",)),
        ("--api_ke", flagnames.ENGINE, ("--api-key",)),
        ("--max-model-len", flagnames.ENGINE, ("--max-model-len",)),
        ("8192", flagnames.ENGINE, ()),
        ("--no-such-flag", flagnames.ENGINE, ()),
    ],
)
def test_resolve_reads_abbreviations_like_argparse(
    arg: str, program: str, expect: tuple[str, ...]
) -> None:
    assert flagnames.resolve(arg, flagnames.PROGRAM_OPTIONS[program]) == expect


def test_resolve_agrees_with_argparse_itself() -> None:
    """The same answers as a real argparse parser built from the router's option list."""
    import argparse

    p = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    p.error = lambda message: (_ for _ in ()).throw(SystemExit(2))  # type: ignore[method-assign]
    for o in optionlists.VLLM_ROUTER:
        p.add_argument(o, dest=o.lstrip("-").replace("-", "_") + "_x")
    for arg in ("--api-ke", "--prometheus-h", "--request-t", "--por", "--cache-t", "--bal"):
        got = flagnames.resolve(arg, optionlists.VLLM_ROUTER)
        try:
            ns, _rest = p.parse_known_args([arg, "1"])
        except (argparse.ArgumentError, SystemExit):
            assert len(got) > 1, (arg, got)  # ambiguous for both
            continue
        used = [k for k, v in vars(ns).items() if v is not None]
        assert len(got) == 1 and used == [got[0].lstrip("-").replace("-", "_") + "_x"]


@pytest.mark.parametrize(
    ("section", "arg", "words"),
    [
        ("router", "--api-ke", "abbreviation.*--api-key.*secret"),
        ("router", "--api-key=x", "secret"),
        ("router", "--prometheus-po", "abbreviation.*--prometheus-port.*set by pdboot"),
        ("router", "--prometheus-ho", "--prometheus-host.*set by pdboot"),
        ("router", "--request-timeout", "--request-timeout-secs.*set by pdboot"),
        ("router", "--p", "ambiguous"),
        ("prefill", "--po", "--port.*set by pdboot"),
        ("decode", "--hf-tok", "--hf-token.*secret"),
        ("decode", "--api_ke=x", "--api-key.*secret"),
        ("prefill", "--kv-transfer", "--kv-transfer-config"),
        ("decode", "--served-model", "--served-model-name"),
    ],
)
def test_abbreviations_of_managed_and_secret_flags_are_refused(
    section: str, arg: str, words: str
) -> None:
    key = (
        f"{section}: {{host: gpu-a}}"
        if section == "router"
        else f"{section}: {{hosts: [gpu-{'a' if section == 'prefill' else 'b'}]}}"
    )
    new = key[:-1] + f", extra_args: [{json.dumps(arg)}, '1']}}"
    refused(sub(key, new), f"{section}.extra_args[0]", words)


def test_unrelated_flags_still_pass() -> None:
    text = sub(
        "decode: {hosts: [gpu-b]}",
        "decode: {hosts: [gpu-b], extra_args: [--max-model-len, '8192']}",
    )
    assert parse_inventory(text).decode.extra_args == ["--max-model-len", "8192"]


# --------------------------------------------------------------------------- item 8


@pytest.mark.parametrize(
    ("text", "key", "words"),
    [
        (sub("router: {host: gpu-a}", "router: {host: gpu-a, extra_args: ['']}"), "router.extra_args", "empty"),
        (sub("decode: {hosts: [gpu-b]}", "decode: {hosts: [gpu-b], extra_args: ['']}"), "decode.extra_args", "empty"),
        (GOOD + "served_model_name: -rf\n", "served_model_name", "starts with '-'"),
        (GOOD + "image: Vllm/vllm-openai:v0.33.0\n", "image", "upper case"),
        (GOOD + "image: vllm/\n", "image", "not valid"),
        (GOOD + "router_image: vllm/vllm-openai:v0:33\n", "router_image", "not valid"),
        (GOOD + "container: {shm_size: \"\u0661\u0666g\"}\n", "container.shm_size", "ASCII digits"),
        (GOOD + "container: {shm_size: 999999999t}\n", "container.shm_size", "larger than"),
        (GOOD + "requirements: {cuda: \"\u0661\u0663.\u0660\"}\n", "requirements.cuda", "version such as"),
        (GOOD + "requirements: {min_driver: \"\u0665\u0668\u0660\"}\n", "requirements.min_driver", "version such as"),
        (GOOD + "requirements: {compute_capability: \"\u0661\u0662.\u0660\"}\n", "requirements.compute_capability", "not a valid"),
        (sub("{address: 192.0.2.11}", "{address: 'fe80::1%eth0'}"), "hosts.gpu-b.address", "zone id"),
        (sub("{address: 192.0.2.11}", "{address: 'fe80::1%p'}"), "hosts.gpu-b.address", "zone id"),
        (sub("{address: 192.0.2.11}", "{address: \"\u212aeys.example\"}"), "hosts.gpu-b.address", "non-ASCII"),
        (sub("{address: 192.0.2.11}", "{address: 192.0.2.10}"), "hosts.gpu-b.address", "same address"),
        (sub("{address: 192.0.2.11}", "{address: 192.0.2.11, advertise_address: 10.0.0.9}"), "hosts.gpu-b.advertise_address", "only for a `local` host"),
        (sub("decode: {hosts: [gpu-b]}", "decode: {hosts: [gpu-b], env: {HF_HOME: /x}}"), "decode.env.HF_HOME", "set by pdboot"),
        (sub("decode: {hosts: [gpu-b]}", "decode: {hosts: [gpu-b], env: {UCX_NET_DEVICES: eth0}}"), "decode.env.UCX_NET_DEVICES", "kv_transfer.ucx"),
        (sub("prefill: {hosts: [gpu-a]}", "prefill: {hosts: [gpu-a], env: {CUDA_VISIBLE_DEVICES: '3'}}"), "prefill.env.CUDA_VISIBLE_DEVICES", "gpus"),
        (GOOD + "kv_transfer: {ucx: {env: {UCX_TLS: tcp}}}\n", "kv_transfer.ucx.env", "own key"),
    ],
)  # fmt: skip
def test_item8_values_are_refused_with_their_line(text: str, key: str, words: str) -> None:
    refused(text, key, words)


@pytest.mark.parametrize(
    "ref",
    [
        "vllm/vllm-openai:v0.33.0",
        "10.77.1.1:5000/vllm/vllm-router:v0.1.17",
        "localhost:5000/vllm/vllm-openai",
        "nvcr.io/nvidia/vllm:25.01-py3",
        "vllm/vllm-openai@sha256:" + "a" * 64,
        "[2001:db8::1]:5000/a/b:c",
    ],
)
def test_valid_image_references_pass(ref: str) -> None:
    assert check_image_reference(ref) == ref


# --------------------------------------------------------------------------- items 5, 6


@pytest.mark.parametrize(
    "path",
    [
        "/var/run/docker.sock",
        "/run/docker.sock",
        "/srv/docker.sock",
        "/root/.ssh",
        "/home/alice/.ssh",
        "/home/alice",
        "/var/lib/docker/volumes",
        "/var/empty/sshd",
        "/var/lib/dpkg/updates",
        "/data/x/.ssh/keys",
        "/var/log/pdboot",
    ],
)
def test_sensitive_trees_are_refused_by_prefix(path: str) -> None:
    assert sensitive_reason(path) is not None
    refused(GOOD + f"container: {{hf_cache: {path}}}\n", "container.hf_cache", "")


def test_remote_dir_and_model_are_checked_by_prefix_too() -> None:
    refused(GOOD + "remote_dir: /var/empty\n", "remote_dir", "system")
    refused(GOOD + "remote_dir: /var/lib/dpkg\n", "remote_dir", "system")
    refused(
        GOOD.replace("model: meta-llama/Llama-3.1-8B-Instruct", "model: /root/.ssh"),
        "model",
        "credentials",
    )


@pytest.mark.parametrize(
    ("extra", "key", "words"),
    [
        ("name: hf-cache\n", "container.hf_cache", "project directory"),
        ("container: {hf_cache: /var/lib/pdboot/demo/cache}\n", "container.hf_cache", "project directory"),
        ("container: {hf_cache: /var/lib/pdboot/demo.lock}\n", "container.hf_cache", "project directory"),
        ("container: {hf_cache: /var/lib/pdboot}\n", "container.hf_cache", "contains remote_dir"),
        ("container: {hf_cache: /var/lib}\n", "container.hf_cache", "system"),
        ("remote_dir: /data/pd/x\ncontainer: {hf_cache: /data/pd}\n", "container.hf_cache", "contains remote_dir"),
    ],
)  # fmt: skip
def test_hf_cache_keeps_away_from_the_project_dir(extra: str, key: str, words: str) -> None:
    text = GOOD.replace("name: demo\n", "") if extra.startswith("name:") else GOOD
    refused(text + extra, key, words)


def test_model_path_containing_remote_dir_is_refused() -> None:
    text = GOOD.replace("model: meta-llama/Llama-3.1-8B-Instruct", "model: /var/lib")
    refused(text, "model", "system")
    text = (
        GOOD.replace("model: meta-llama/Llama-3.1-8B-Instruct", "model: /data")
        + "remote_dir: /data/pd\n"
    )
    refused(text, "model", "contains remote_dir")


def test_default_paths_still_pass() -> None:
    inv = parse_inventory(GOOD + "container: {hf_cache: /data/hf}\n")
    assert inv.container.hf_cache == "/data/hf"
    assert parse_inventory(GOOD).container.hf_cache == "/var/lib/pdboot/hf-cache"
