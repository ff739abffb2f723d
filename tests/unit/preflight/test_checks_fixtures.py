"""pyinfra style: walk every fixture file, hand each command's output to the parser for
that command, and require a value or a ParseError -- never any other exception. Sections
with exit 0 in the real capture must parse.

The expected facts live next to each capture, as pyinfra keeps them: ``NAME.txt`` has
``NAME.facts.json`` beside it, one entry per (parser, command) with the parsed value (as
plain JSON: dataclasses as objects, tuples as lists) or ``{"ParseError": message}``; the test
asserts the parser gives exactly that. ``PDBOOT_UPDATE_FACTS=1`` rewrites the files from
what the parsers give now; review their diff like a golden file's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pdboot.preflight.checks import (
    ParseError,
    Section,
    cpu,
    gpu,
    gpu_acs,
    gpu_settings,
    host,
    model,
    network,
    owners,
    parse_sections,
    rdma,
)
from pdboot.preflight.checks import cuda as cu
from pdboot.preflight.checks import docker as dk
from tests.unit.paths import FIXTURES

FIX = FIXTURES


def parse_ps(text: str) -> object:
    return owners.parse_ps("h", text)  # the host name is only carried along


def _query(cmd: str) -> Callable[[str], object]:
    fields = tuple(cmd.split("=", 1)[1].split()[0].split(","))
    return lambda text: gpu.parse_query(text, fields)


PARSERS: list[tuple[Callable[[str], bool], Callable[[str], object]]] = [
    (lambda c: c.startswith("nvidia-smi --query-compute-apps="), gpu.parse_apps),
    (lambda c: c in ("nvidia-smi --version", "nvidia-smi"), gpu.parse_versions),
    (lambda c: c == "cat /proc/driver/nvidia/version", gpu.parse_kmod),
    (lambda c: c.startswith("docker info"), dk.parse_info),
    (lambda c: c == "@dockerd", dk.parse_dockerd),
    (lambda c: c == "@image", cu.parse_image_env),
    (lambda c: c.startswith("ls /dev/infiniband"), rdma.parse_devices),
    (lambda c: c.startswith("ibv_devinfo"), rdma.parse_ibv_devinfo),
    (lambda c: c.startswith("ibv_devinfo"), rdma.parse_bluefield),
    (lambda c: c == "@sysfs", rdma.parse_sysfs),
    (lambda c: c in ("@mgmt", rdma.MGMT), rdma.parse_mgmt),
    (lambda c: c.startswith("ss -lt"), host.parse_ss),
    (lambda c: c == "@df", host.parse_disk),
    (lambda c: c.startswith("date "), network.parse_clock),
    (lambda c: c.startswith("@probe"), network.parse_probe),
    (lambda c: c == "@config", model.parse_config),
    (lambda c: c in (cpu.FLAGS, "cat /proc/cpuinfo"), cpu.parse_flags),
    (lambda c: c == cpu.LSCPU, cpu.parse_lscpu),
    (lambda c: c == cpu.FREE, cpu.parse_free),
    (lambda c: c.startswith("docker ps -a --no-trunc --filter"), parse_ps),
    (lambda c: c == owners.CGROUPS, owners.parse_cgroups),
    (lambda c: c.startswith("nvidia-smi topo -p2p"), gpu_settings.parse_p2p),
    (lambda c: c == gpu_settings.HMM, gpu_settings.parse_hmm),
    (lambda c: c == gpu_acs.NVIDIA, gpu_acs.parse_nvidia),
    (lambda c: c == gpu_acs.BRIDGES, gpu_acs.parse_bridges),
    (lambda c: c == gpu_acs.IOMMU_TYPES, gpu_acs.parse_iommu_types),
    (lambda c: c == gpu_acs.IOMMU_DEVICES, gpu_acs.parse_iommu_devices),
    (lambda c: c == gpu_acs.CMDLINE, gpu_acs.parse_cmdline),
]


def _plain(v: Any) -> Any:
    """A parsed value as JSON can hold it, the same on every run."""
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {f.name: _plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, (set, frozenset)):
        return sorted(_plain(x) for x in v)
    if isinstance(v, float) and not math.isfinite(v):
        return repr(v)
    if v is None or isinstance(v, (str, int, float, bool)):
        return v
    return repr(v)


def _fact(parser: Callable[[str], object], section: Section) -> Any:
    try:
        return _plain(parser(section.output))
    except ParseError as e:
        return {"ParseError": str(e)}


def _key(cmd: str, parser: Callable[[str], object]) -> str:
    name = getattr(parser, "__name__", "parser")
    return f"{'parse_query' if name == '<lambda>' else name} <- {cmd}"


def facts_file(fixture: str) -> Path:
    return (FIX / fixture).with_suffix(".facts.json")


def cases() -> list[tuple[str, str, Section, Callable[[str], object]]]:
    out = []
    for f in sorted(FIX.rglob("*")):
        if not f.is_file() or f.suffix not in (".txt", ".xml"):
            continue
        for cmd, sec in parse_sections(f.read_text(encoding="utf-8", errors="replace")).items():
            if cmd.startswith(
                ("nvidia-smi --query-gpu=index", "nvidia-smi -i 0 --query-gpu=index")
            ):
                out.append((str(f.relative_to(FIX)), cmd, sec, _query(cmd)))
            for match, parser in PARSERS:
                if match(cmd):
                    out.append((str(f.relative_to(FIX)), cmd, sec, parser))
    return out


CASES = cases()


def test_the_walk_finds_the_real_capture_and_the_derived_files() -> None:
    files = {c[0] for c in CASES}
    assert any(f.startswith("h200-host/") for f in files)
    assert len([f for f in files if f.startswith("derived/")]) >= 15
    assert len(CASES) >= 60


@pytest.mark.parametrize(
    ("file", "cmd", "section", "parser"),
    CASES,
    ids=[f"{c[0]}::{c[1][:40]}" for c in CASES],
)
def test_parser_never_crashes(
    file: str, cmd: str, section: Section, parser: Callable[[str], object]
) -> None:
    try:
        value = parser(section.output)
    except ParseError:
        expected = "malformed" in file or section.rc != 0 or "not found" in section.output
        assert expected, f"{file}: {cmd} should parse"
        return
    if file.startswith("h200-host/") and section.rc == 0 and "compute-apps" not in cmd:
        assert value not in (None, [], ""), f"{file}: {cmd} parsed to nothing"


def _expected() -> dict[str, dict[str, Any]]:
    by_file: dict[str, dict[str, Any]] = {}
    for file, cmd, section, parser in CASES:
        by_file.setdefault(file, {})[_key(cmd, parser)] = _fact(parser, section)
    return by_file


if os.environ.get("PDBOOT_UPDATE_FACTS"):
    for _file, _facts in _expected().items():
        facts_file(_file).write_text(json.dumps(_facts, indent=1, sort_keys=True) + "\n")


@pytest.mark.parametrize(
    ("file", "cmd", "section", "parser"),
    CASES,
    ids=[f"{c[0]}::{c[1][:40]}" for c in CASES],
)
def test_parser_gives_the_facts_stored_beside_the_capture(
    file: str, cmd: str, section: Section, parser: Callable[[str], object]
) -> None:
    stored = json.loads(facts_file(file).read_text())
    assert _fact(parser, section) == stored[_key(cmd, parser)]


def test_every_facts_file_belongs_to_a_capture_and_lists_every_command() -> None:
    expected = _expected()
    on_disk = {str(f.relative_to(FIX)) for f in FIX.rglob("*.facts.json")}
    assert on_disk == {str(facts_file(f).relative_to(FIX)) for f in expected}
    for file, facts in expected.items():
        assert set(json.loads(facts_file(file).read_text())) == set(facts), file


@pytest.mark.parametrize("text", ["", "\n", "\x00\x01garbage", "a, b, c\n" * 3, "{" * 50])
def test_every_parser_on_junk(text: str) -> None:
    for _, parser in PARSERS:
        with contextlib.suppress(ParseError):
            parser(text)
