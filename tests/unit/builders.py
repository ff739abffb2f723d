"""One way for unit tests to build an inventory: a document with the fields a test cares about,
changed by dotted paths, then YAML text read by pdboot's own loader (parse_inventory), so every
rule and every ``file:line`` a test meets is the real one.

    inventory()                                   # 1P1D: p1 -> d1, router on r
    inventory(hosts={"a": "192.0.2.10"}, prefill=["a"], decode=["a"], router="a")
    inventory(overrides={"decode.engines_per_host": 2, "kv_transfer.rdma": "off"})
    inventory(overrides={"router.host": None})    # None deletes: an inventory with a hole
    load(changed(BASE, {"prefill.gpus": [0]}), "inv.yaml")   # a test's own base, changed

Tests whose subject is the text itself (YAML syntax, hostile documents, line numbers of a
hand-written layout) keep their text; everything else starts here.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from pdboot.inventory.load import parse_inventory
from pdboot.inventory.schema import Inventory
from pdboot.plan.converge import Observed
from pdboot.plan.model import LABEL_CONFIG_HASH, Service
from pdboot.preflight.checks.gpu import Gpu

# TEST-NET-1 addresses (RFC 5737): nothing answers there, and pdboot never connects in a unit test
HOSTS: Mapping[str, str] = {"p1": "192.0.2.10", "d1": "192.0.2.11", "r": "192.0.2.12"}

# 2P3D over six hosts: the base of the roll tests (a pair of each tier to replace, a decode
# host to add)
ROLL_HOSTS: Mapping[str, str] = {
    "p1": "192.0.2.10",
    "p2": "192.0.2.13",
    "d1": "192.0.2.11",
    "d2": "192.0.2.14",
    "d3": "192.0.2.15",
    "r": "192.0.2.12",
}
# 1P1D with a standby ingress host s, and the router keys that make it a pair with r
STANDBY_HOSTS: Mapping[str, str] = {**HOSTS, "s": "192.0.2.13"}
STANDBY_PAIR: Mapping[str, str] = {
    "router.standby": "s",
    "router.virtual_ip": "192.0.2.100/24",
    "router.vrrp_interface": "eth0",
}
# The CPU rehearsal's inventory keys (device: cpu, the vllm-cpu image, a local model)
CPU_REHEARSAL: Mapping[str, str] = {
    "name": "rehearsal",
    "model": "/srv/models/tiny",
    "device": "cpu",
    "image": "registry.example:5000/vllm-cpu:0.32.0",
}

# Two hosts, 1P1D, as text: the base of the tests whose subject is the text (what a line
# appended to it is refused with, and on which line of inv.yaml)
TWO_HOSTS_TEXT = """\
name: demo
model: meta-llama/Llama-3.1-8B-Instruct
hosts:
  gpu-a: {address: 192.0.2.10}
  gpu-b: {address: 192.0.2.11}
prefill: {hosts: [gpu-a]}
decode: {hosts: [gpu-b]}
router: {host: gpu-a}
"""


def inventory_doc(
    hosts: Mapping[str, str] = HOSTS,
    prefill: Sequence[str] = ("p1",),
    decode: Sequence[str] = ("d1",),
    router: str = "r",
    *,
    name: str = "demo",
    model: str = "m",
    device: str | None = None,
    image: str | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The inventory as a document: ``hosts`` maps names to addresses, the tiers name hosts,
    then ``overrides`` (see ``changed``). Keys come in the order an operator writes them."""
    doc: dict[str, Any] = {"name": name, "model": model}
    if device is not None:
        doc["device"] = device
    if image is not None:
        doc["image"] = image
    doc["hosts"] = {h: {"address": a} for h, a in hosts.items()}
    doc["prefill"] = {"hosts": list(prefill)}
    doc["decode"] = {"hosts": list(decode)}
    doc["router"] = {"host": router}
    return changed(doc, overrides or {})


def changed(doc: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``doc`` with each ``"a.b.c": value`` set (the mappings on the way are made
    when missing; the value replaces what was there, whole); the value None deletes the key."""
    data = copy.deepcopy(dict(doc))
    for dotted, value in overrides.items():
        keys = dotted.split(".")
        node = data
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        if value is None:
            node.pop(keys[-1], None)
        else:
            node[keys[-1]] = copy.deepcopy(value)
    return data


def as_text(doc: Mapping[str, Any]) -> str:
    """YAML of ``doc``, keys in the document's order."""
    return yaml.safe_dump(dict(doc), sort_keys=False)


def changed_text(base: Mapping[str, Any], **changes: Any) -> str:
    """YAML text of ``base`` with ``a__b=value`` changes (``changed``'s ``a.b``; None
    deletes)."""
    return as_text(changed(base, {k.replace("__", "."): v for k, v in changes.items()}))


def gpu_pair_doc(**kw: Any) -> dict[str, Any]:
    """1P1D on two GPU hosts, gpu-a (prefill, router) and gpu-b (decode), serving Llama 3.1 8B;
    ``kw``: inventory_doc's keywords."""
    hosts = {"gpu-a": "192.0.2.10", "gpu-b": "192.0.2.11"}
    kw.setdefault("model", "meta-llama/Llama-3.1-8B-Instruct")
    return inventory_doc(hosts, ["gpu-a"], ["gpu-b"], "gpu-a", **kw)


def cpu_pair_doc(**kw: Any) -> dict[str, Any]:
    """The CPU rehearsal on two hosts, cpu-a (prefill, router) and cpu-b (decode)."""
    hosts = {"cpu-a": "192.0.2.20", "cpu-b": "192.0.2.21"}
    return inventory_doc(hosts, ["cpu-a"], ["cpu-b"], "cpu-a", **{**CPU_REHEARSAL, **kw})


def load(doc: Mapping[str, Any], source: str = "inventory.yaml") -> Inventory:
    """The Inventory pdboot reads from ``doc``'s YAML in a file named ``source``."""
    return parse_inventory(as_text(doc), source)


def inventory(*args: Any, source: str = "inventory.yaml", **kw: Any) -> Inventory:
    """``load(inventory_doc(...))``: the arguments are inventory_doc's."""
    return load(inventory_doc(*args, **kw), source)


def rtx_gpus(n: int, name: str = "NVIDIA RTX PRO 6000 Blackwell Server Edition") -> tuple[Gpu, ...]:
    """``n`` idle 96 GiB RTX PRO 6000 GPUs as nvidia-smi reports them (driver 580.95.05)."""
    return tuple(
        Gpu(i, name, f"GPU-{i}", "580.95.05", 97887, 0, 97887, "12.0", "Disabled", 0)
        for i in range(n)
    )


def with_api_key(source: Path, path: Path) -> Path:
    """``source``'s inventory written to ``path`` with ``secrets.api_key: env:PD_API_KEY``
    beside its hf_token."""
    text = source.read_text()
    path.write_text(
        text.replace(
            "  hf_token: env:HF_TOKEN", "  hf_token: env:HF_TOKEN\n  api_key: env:PD_API_KEY"
        )
    )
    return path


def running_as_planned(services: Iterable[Service]) -> list[Observed]:
    """What the hosts report for each planned service: running, with its config hash label
    (the state a converge starts from when nothing changed)."""
    return [
        Observed(
            s.host,
            f"id-{s.key}",
            s.container_name,
            {**dict(s.labels), LABEL_CONFIG_HASH: s.config_hash},
            "running",
        )
        for s in services
    ]
