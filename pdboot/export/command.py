"""`pdboot export k8s|slurm INVENTORY --out DIR`: the command line of pdboot/export/ (cli.py
adds this group with one line). Writes files; the layouts are pure functions elsewhere."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperCommand

from pdboot.cli_options import InventoryArg
from pdboot.exitcodes import EXIT_FAILED, EXIT_USAGE


class _Command(TyperCommand):
    """cli.py's help layout (flags without a value type)."""

    def get_params(self, ctx: Any) -> list[Any]:
        from pdboot.cli import _without_flag_types

        return _without_flag_types(super().get_params(ctx))


export_app = typer.Typer(
    name="export",
    help="Lay the deployment out for a scheduler: Kubernetes manifests or a Slurm batch script.",
    no_args_is_help=True,
)

OutOpt = Annotated[
    Path,
    typer.Option("--out", help="Write the files into DIR.", metavar="DIR", show_default=False),
]


def _write(out_dir: Path, files: dict[str, str], executable: frozenset[str] = frozenset()) -> None:
    from pdboot import cli

    try:
        for name, text in files.items():
            target = out_dir / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
            target.chmod(0o755 if name in executable else 0o644)
    except OSError as e:
        cli._stderr().print(f"cannot write {e.filename}: {e.strerror}", markup=False)
        raise typer.Exit(EXIT_FAILED) from None
    for name in files:
        cli._stdout().print(f"wrote {out_dir / name}", markup=False, highlight=False)


def _refuse(message: str) -> None:
    from pdboot import cli

    cli._stderr().print(message, markup=False, highlight=False)
    raise typer.Exit(EXIT_USAGE)


@export_app.command("k8s", cls=_Command)
def k8s(
    inventory: InventoryArg,
    out_dir: OutOpt,
    namespace: Annotated[
        str, typer.Option("--namespace", help="The namespace of every object.")
    ] = "default",
    llm_d: Annotated[
        bool,
        typer.Option("--llm-d", help="Also write llm-d's shape (an LWS DisaggregatedSet)."),
    ] = False,
) -> None:
    """Kubernetes manifests: a workload per engine, the router with its pod discovery, RBAC, a Service; secrets by name only."""  # noqa: E501
    from pdboot import cli
    from pdboot.export.common import ExportError
    from pdboot.export.k8s import render_k8s
    from pdboot.plan.build import build_plan

    inv = cli._load(inventory)
    try:
        files = render_k8s(inv, build_plan(inv), namespace, llm_d=llm_d)
    except ExportError as e:
        _refuse(f"cannot export to Kubernetes: {e}")
        return
    _write(out_dir, files)
