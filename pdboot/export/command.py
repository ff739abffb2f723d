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


@export_app.command("slurm", cls=_Command)
def slurm(
    inventory: InventoryArg,
    out_dir: OutOpt,
    pyxis: Annotated[
        bool,
        typer.Option("--pyxis", help="Run the containers with pyxis/enroot, not Docker."),
    ] = False,
    partition: Annotated[
        str | None, typer.Option("--partition", help="#SBATCH --partition.", metavar="NAME")
    ] = None,
    time: Annotated[
        str | None, typer.Option("--time", help="#SBATCH --time (e.g. 1-00:00:00).")
    ] = None,
    secrets_file: Annotated[
        str | None,
        typer.Option(
            "--secrets-file",
            help="The secrets file on the nodes (default: where `up` writes secrets.env).",
            metavar="PATH",
        ),
    ] = None,
) -> None:
    """A Slurm batch script: one node per inventory host, every engine and the router as job steps with render's arguments; logs per engine; torn down with the job."""  # noqa: E501
    from pdboot import cli
    from pdboot.export.slurm import SlurmOptions, render_slurm
    from pdboot.plan.build import build_plan

    for what, value in (("--partition", partition), ("--time", time)):
        if value is not None and not _sbatch_value(value):
            _refuse(f"{what} {value!r}: letters, digits and -_:., only")
    if secrets_file is not None and not secrets_file.startswith("/"):
        _refuse("--secrets-file must be an absolute path on the nodes")
    inv = cli._load(inventory)
    opts = SlurmOptions(
        runtime="pyxis" if pyxis else "docker",
        partition=partition,
        time=time,
        secrets_file=secrets_file,
    )
    files = render_slurm(inv, build_plan(inv), opts)
    _write(out_dir, files, executable=frozenset(n for n in files if n.endswith(".sbatch")))


def _sbatch_value(value: str) -> bool:
    """An #SBATCH line's value: no spaces or shell characters (sbatch reads the line as is)."""
    return bool(value) and all(c.isalnum() or c in "-_:.," for c in value)
