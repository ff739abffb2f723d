"""What `render` prints: each host's compose project, or what `render --out` wrote."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path

from rich.console import Console
from rich.rule import Rule
from rich.syntax import Syntax


def print_projects(out: Console, texts: dict[str, str]) -> None:
    """Highlighted on a terminal; piped, plain text: one YAML document per host."""
    if not out.is_terminal:
        sys.stdout.write("---\n".join(texts.values()))
        return
    for name, text in texts.items():
        out.print(Rule(f"{name}/compose.yaml"))
        out.print(Syntax(text, "yaml", background_color="default"))


def print_written(out: Console, paths: Iterable[Path], summary: str) -> None:
    for path in paths:
        out.print(f"wrote {path}", highlight=False, markup=False)
    out.print(summary, end="", highlight=False, markup=False, soft_wrap=True)
