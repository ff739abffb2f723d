"""`up`'s compact preflight: a line per host, then only failures and warnings with fixes."""

from __future__ import annotations

from rich.console import Console

from pdboot.preflight.checks import CheckResult
from pdboot.preflight.run import HostReport, PreflightResult
from pdboot.views import preflight as report

CHECKS = [
    CheckResult("ssh.connect", "pass", "connected"),
    CheckResult("host.ulimits", "warn", "container memlock limited to 8388608 bytes", "set -1"),
    CheckResult("host.shm", "pass", "/dev/shm 23.5 GiB"),
    CheckResult("gpu.driver", "pass", "driver 580.95.05 (>= 580.65.06)"),
    CheckResult("model.config", "skip", "config.json not on the host yet"),
]


def render(result: PreflightResult, width: int = 80) -> list[str]:
    console = Console(record=True, width=width, color_system=None)
    report.print_compact(result, console)
    return console.export_text().splitlines()


def test_a_line_per_host_and_only_the_warning_rows() -> None:
    res = PreflightResult(
        {
            "decode": HostReport("decode", True, CHECKS, seconds=1.0),
            "ingress": HostReport("ingress", True, CHECKS[:1], seconds=0.8),
        }
    )
    lines = render(res)
    assert lines[0] == "decode: 3 passed, 1 warning, 1 skipped (1.0s)"
    assert lines[1].split() == [
        "WARN",
        "host.ulimits",
        "container",
        "memlock",
        "limited",
        "to",
        "8388608",
        "bytes",
    ]
    assert lines[2].strip() == "fix: set -1"
    assert lines[3] == "ingress: 1 passed (0.8s)"
    assert lines[4] == "PASS: 2 host(s) ready for `pdboot up` (1 warning)"
    assert len(lines) == 5  # no passing rows, no tables
    assert not any("gpu.driver" in ln or "model.config" in ln for ln in lines)


def test_failures_come_first_with_their_fix_and_a_pointer_to_the_full_report() -> None:
    checks = [*CHECKS, CheckResult("host.disk_docker", "fail", "3.0 GiB free", "free space")]
    down = [CheckResult("ssh.connect", "fail", "timed out", "check the address")]
    res = PreflightResult(
        {"decode": HostReport("decode", True, checks), "x": HostReport("x", False, down)}
    )
    lines = render(res)
    assert lines[0] == "decode: 3 passed, 1 failure, 1 warning, 1 skipped"
    assert "FAIL" in lines[1] and "host.disk_docker" in lines[1] and "3.0 GiB free" in lines[1]
    assert lines[2].strip() == "fix: free space"
    assert lines[3].strip() == "see docs/troubleshooting.md#host.disk_docker"
    assert "host.ulimits" in lines[4]
    assert lines[6] == "x: UNREACHABLE, 0 passed, 1 failure"
    assert "ssh.connect" in lines[7] and "timed out" in lines[7]
    assert lines[-2].startswith("FAIL: 2 failures")
    assert lines[-1] == "`pdboot preflight INVENTORY` shows every check"


def test_long_messages_wrap_inside_their_column() -> None:
    long = CheckResult("host.disk_docker", "warn", "Docker data root /var/tmp/" + "x" * 90, "fix")
    lines = render(PreflightResult({"a": HostReport("a", True, [long])}), width=80)
    assert all(len(ln) <= 80 for ln in lines)
    indent = lines[1].index("Docker")
    assert lines[2][:indent].strip() == ""  # the continuation stays under the message
