"""The contract of pdboot's JSON, as terraform's machine-readable output has one: a
``format_version`` on every JSON document and event line (a reader checks the major number;
a minor bump only adds keys), and one shape for whatever stops a command or warns, wherever it
comes from (an inventory problem, a host `down` could not reach, a failed `stage`): severity,
summary, detail, and the inventory's file and line when the inventory is to blame."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

# 1.0: format_version itself, diagnostics on events and on errors (issue 46)
FORMAT_VERSION = "1.0"

Severity = Literal["error", "warning"]


@dataclass(frozen=True)
class Diagnostic:
    severity: Severity
    summary: str  # one line: what went wrong
    detail: str = ""  # why, and the fix, when known
    file: str | None = None  # the inventory, when a key of it is to blame
    line: int | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "severity": self.severity,
            "summary": self.summary,
            "detail": self.detail,
            "file": self.file,
            "line": self.line,
        }


def versioned(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` with ``format_version`` first."""
    return {"format_version": FORMAT_VERSION, **doc}


def error_document(diagnostics: list[Diagnostic]) -> dict[str, Any]:
    """What a JSON document command (render, status, preflight --json) prints instead of its
    document when it cannot make one: ok false and the diagnostics."""
    return versioned({"ok": False, "diagnostics": [d.as_json() for d in diagnostics]})
