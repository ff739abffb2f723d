"""pyinfra style: walk every fixture file, hand each command's output to the parser for
that command, and require a value or a ParseError -- never any other exception. Sections
with exit 0 in the real capture must parse."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

import pytest

from pdboot.preflight.checks import (
    ParseError,
    Section,
    cpu,
    gpu,
    host,
    model,
    network,
    owners,
    parse_sections,
    rdma,
)
from pdboot.preflight.checks import docker as dk

FIX = Path(__file__).parent / "fixtures"


def _query(cmd: str) -> Callable[[str], object]:
    fields = tuple(cmd.split("=", 1)[1].split()[0].split(","))
    return lambda text: gpu.parse_query(text, fields)


PARSERS: list[tuple[Callable[[str], bool], Callable[[str], object]]] = [
    (lambda c: c.startswith("nvidia-smi --query-compute-apps="), gpu.parse_apps),
    (lambda c: c in ("nvidia-smi --version", "nvidia-smi"), gpu.parse_versions),
    (lambda c: c == "cat /proc/driver/nvidia/version", gpu.parse_kmod),
    (lambda c: c.startswith("docker info"), dk.parse_info),
    (lambda c: c == "@dockerd", dk.parse_dockerd),
    (lambda c: c == "@image", dk.parse_image_env),
    (lambda c: c.startswith("ls /dev/infiniband"), rdma.parse_devices),
    (lambda c: c.startswith("ibv_devinfo"), rdma.parse_ibv_devinfo),
    (lambda c: c == "@sysfs", rdma.parse_sysfs),
    (lambda c: c.startswith("ss -lt"), host.parse_ss),
    (lambda c: c == "@df", host.parse_disk),
    (lambda c: c.startswith("date "), network.parse_clock),
    (lambda c: c.startswith("@probe"), network.parse_probe),
    (lambda c: c == "@config", model.parse_config),
    (lambda c: c in (cpu.FLAGS, "cat /proc/cpuinfo"), cpu.parse_flags),
    (lambda c: c == cpu.LSCPU, cpu.parse_lscpu),
    (lambda c: c == cpu.FREE, cpu.parse_free),
    (lambda c: c.startswith("docker ps -a --no-trunc --filter"), lambda t: owners.parse_ps("h", t)),
    (lambda c: c == owners.CGROUPS, owners.parse_cgroups),
]


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


@pytest.mark.parametrize("text", ["", "\n", "\x00\x01garbage", "a, b, c\n" * 3, "{" * 50])
def test_every_parser_on_junk(text: str) -> None:
    for _, parser in PARSERS:
        with contextlib.suppress(ParseError):
            parser(text)
