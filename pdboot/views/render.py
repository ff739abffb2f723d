"""What `render` prints: each host's compose project, or what `render --out` wrote."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from pathlib import Path

from rich.console import Console
from rich.syntax import Syntax

from pdboot.diagnostics import versioned
from pdboot.plan.model import Plan


def print_projects(out: Console, err: Console, texts: dict[str, str], summary: str = "") -> None:
    """One YAML document per host on stdout (what `docker compose -f -` reads), the summary on
    stderr. On a terminal the same documents, highlighted, each under its host as a YAML
    comment and never wrapped or cropped at the terminal's width: pasted, it parses as the
    piped output does (`docker compose config` prints the same way)."""
    if not out.is_terminal:
        sys.stdout.write("---\n".join(texts.values()))
    else:
        for i, (name, text) in enumerate(texts.items()):
            if i:
                out.print("---", highlight=False, markup=False, soft_wrap=True)
            titled = f"# {name}/compose.yaml\n{text}"
            code = Syntax(titled, "yaml", background_color="default").highlight(titled)
            out.print(code, soft_wrap=True, end="")
    if summary:
        err.print(summary, end="", highlight=False, markup=False, soft_wrap=True)


def print_written(
    out: Console, removed: Iterable[Path], paths: Iterable[Path], summary: str
) -> None:
    for path in removed:
        out.print(f"removed {path}/", highlight=False, markup=False, soft_wrap=True)
    for path in paths:
        out.print(f"wrote {path}", highlight=False, markup=False, soft_wrap=True)
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
    doc = versioned(
        {
            "deployment": plan.deployment,
            "model": plan.model,
            "endpoint": f"{plan.endpoint}/v1",
            "hosts": {name: {"compose": text} for name, text in texts.items()},
            "services": services,
            "summary": summary,
        }
    )
    return json.dumps(doc, indent=2)
