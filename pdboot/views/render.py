"""What `render` prints: each host's compose project, or what `render --out` wrote."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from pathlib import Path

from rich.console import Console
from rich.rule import Rule
from rich.syntax import Syntax

from pdboot.plan.model import Plan


def print_projects(out: Console, texts: dict[str, str], summary: str = "") -> None:
    """Highlighted on a terminal, then the summary; piped, plain text: one YAML document per
    host (what `docker compose -f -` reads), nothing else."""
    if not out.is_terminal:
        sys.stdout.write("---\n".join(texts.values()))
        return
    for name, text in texts.items():
        out.print(Rule(f"{name}/compose.yaml"))
        # wrapped, not cropped: a line cut at the terminal's edge copies as broken YAML
        out.print(Syntax(text, "yaml", background_color="default", word_wrap=True))
    if summary:
        out.print(Rule("summary"))
        out.print(summary, end="", highlight=False, markup=False, soft_wrap=True)


def print_written(out: Console, paths: Iterable[Path], summary: str) -> None:
    for path in paths:
        out.print(f"wrote {path}", highlight=False, markup=False)
    out.print(summary, end="", highlight=False, markup=False, soft_wrap=True)


def projects_json(plan: Plan, texts: dict[str, str], summary: str) -> str:
    """`render --json`: each host's compose text and every service's settings (the same
    values, no secret: the compose files reference secrets.env), for tools to read."""
    services = [
        {
            "service": s.key,
            "role": s.role,
            "host": s.host,
            "address": s.address,
            "port": s.port,
            "image": s.image,
            "gpus": s.gpus if s.gpus is None or s.gpus == "all" else list(s.gpus),
            "side_channel_port": s.side_channel_port,
            "metrics_port": s.metrics_port,
            "nic": s.nic or None,
            "command": list(s.command),
            "environment": dict(s.environment),
        }
        for s in plan.services()
        if s.host in texts
    ]
    doc = {
        "deployment": plan.deployment,
        "model": plan.model,
        "endpoint": f"{plan.endpoint}/v1",
        "hosts": {name: {"compose": text} for name, text in texts.items()},
        "services": services,
        "summary": summary,
    }
    return json.dumps(doc, indent=2)
