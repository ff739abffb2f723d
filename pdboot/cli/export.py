"""`pdboot export k8s|slurm INVENTORY --out DIR`: the command line of pdboot/export/ (main.py
adds this group). Writes files; the layouts are pure functions elsewhere."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from pdboot.cli.app import EXIT_CODES, Command
from pdboot.cli.console import load
from pdboot.cli.options import InventoryArg
from pdboot.exitcodes import EXIT_FAILED, EXIT_USAGE


def _err(message: str) -> None:
    typer.echo(message, err=True)  # plain text: messages quote user input


export_app = typer.Typer(
    name="export",
    help="Lay the deployment out for a scheduler: Kubernetes manifests or a Slurm batch script.",
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog=EXIT_CODES,
)

OutOpt = Annotated[
    Path,
    typer.Option(
        "--out",
        help="Write the files into DIR; `-`: the manifests to stdout, the notes to stderr.",
        metavar="DIR",
        show_default=False,
    ),
]
NOTES_SUFFIX = ".md"  # an export's notes (README.md): for the operator, not for the scheduler
YAML_SUFFIXES = (".yaml", ".yml")


def to_stream(files: dict[str, str]) -> tuple[str, str]:
    """`--out -`, as `helm template` prints: (stdout, stderr). The manifests only on stdout,
    YAML ones as one stream of documents each under a `# Source: NAME` comment, so that
    `| kubectl apply -f -` or `| sbatch` reads it; the notes on stderr. Raises ValueError
    when the manifests cannot share one stream (more than one file that is not YAML)."""
    manifests = {n: t for n, t in files.items() if not n.endswith(NOTES_SUFFIX)}
    notes = "".join(t for n, t in files.items() if n.endswith(NOTES_SUFFIX))
    if len(manifests) == 1:
        return next(iter(manifests.values())), notes
    if not all(n.endswith(YAML_SUFFIXES) for n in manifests):
        raise ValueError(f"{len(manifests)} files that are not all YAML: {', '.join(manifests)}")
    start = "---\n"
    stream = "".join(f"{start}# Source: {n}\n{t.removeprefix(start)}" for n, t in manifests.items())
    return stream, notes


def _write(out_dir: Path, files: dict[str, str], executable: frozenset[str] = frozenset()) -> None:
    if str(out_dir) == "-":
        try:
            manifests, notes = to_stream(files)
        except ValueError as e:
            _refuse(f"--out -: {e} cannot go to one stream; give --out DIR")
            return
        typer.echo(notes, err=True, nl=False)
        typer.echo(manifests, nl=False)
        return
    try:
        for name, text in files.items():
            target = out_dir / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8")
            target.chmod(0o755 if name in executable else 0o644)
    except OSError as e:
        _err(f"cannot write {e.filename}: {e.strerror}")
        raise typer.Exit(EXIT_FAILED) from None
    for name in files:
        typer.echo(f"wrote {out_dir / name}")


def _refuse(message: str) -> None:
    _err(message)
    raise typer.Exit(EXIT_USAGE)


DownloadOpt = Annotated[
    bool,
    typer.Option(
        "--download-at-start",
        help="Allow a branch or tag in model_revision: each engine downloads what it names "
        "when it starts (vLLM's own download; unpinned, nothing staged).",
    ),
]


@export_app.command("k8s", cls=Command, epilog=EXIT_CODES)
def k8s(
    out_dir: OutOpt,
    inventory: InventoryArg = None,
    namespace: Annotated[
        str, typer.Option("--namespace", help="The namespace of every object.")
    ] = "default",
    llm_d: Annotated[
        bool,
        typer.Option("--llm-d", help="Also write llm-d's shape (an LWS DisaggregatedSet)."),
    ] = False,
    rdma_resource: Annotated[
        str,
        typer.Option(
            "--rdma-resource",
            help="The extended resource an engine with RDMA asks for (your device plugin's).",
            metavar="NAME",
        ),
    ] = "rdma/rdma_shared_device_a",
    download_at_start: DownloadOpt = False,
) -> None:
    """Kubernetes manifests: a workload per engine (its weights staged by an init container), the router with its pod discovery and pdboot's proxy beside it, RBAC, a Service; secrets by name only."""  # noqa: E501
    from pdboot.export.common import ExportError
    from pdboot.export.k8s import dump, render_k8s
    from pdboot.export.llmd import disaggregated_set
    from pdboot.export.weights import export_weights
    from pdboot.plan.build import build_plan

    try:
        weights = export_weights(load(inventory), download_at_start)
        inv = weights.inventory
        plan = build_plan(inv)
        files = render_k8s(inv, plan, namespace, rdma_resource, download_at_start)
        if llm_d:
            ds = disaggregated_set(inv, plan, namespace, download_at_start)
            files["llm-d/disaggregatedset.yaml"] = dump([ds])
    except ExportError as e:
        _refuse(f"cannot export to Kubernetes: {e}")
        return
    _write(out_dir, files)
    _err(weights.summary)


@export_app.command("slurm", cls=Command, epilog=EXIT_CODES)
def slurm(
    out_dir: OutOpt,
    inventory: InventoryArg = None,
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
    account: Annotated[
        str | None, typer.Option("--account", help="#SBATCH --account.", metavar="NAME")
    ] = None,
    reservation: Annotated[
        str | None, typer.Option("--reservation", help="#SBATCH --reservation.", metavar="NAME")
    ] = None,
    qos: Annotated[str | None, typer.Option("--qos", help="#SBATCH --qos.", metavar="NAME")] = None,
    secrets_file: Annotated[
        str | None,
        typer.Option(
            "--secrets-file",
            help="The secrets file on the nodes (default: where `up` writes secrets.env).",
            metavar="PATH",
        ),
    ] = None,
    download_at_start: DownloadOpt = False,
) -> None:
    """A Slurm batch script: one node per inventory host, the weights staged per node, every engine and the router as job steps with render's arguments, pdboot's proxy in front; logs per engine; torn down with the job."""  # noqa: E501
    from pdboot.export.common import ExportError
    from pdboot.export.slurm import SlurmOptions, render_slurm
    from pdboot.export.weights import export_weights
    from pdboot.plan.build import build_plan

    sbatch = {
        "--partition": partition,
        "--time": time,
        "--account": account,
        "--reservation": reservation,
        "--qos": qos,
    }
    for what, value in sbatch.items():
        if value is not None and not _sbatch_value(value):
            _refuse(f"{what} {value!r}: letters, digits and -_:., only")
    if secrets_file is not None and not secrets_file.startswith("/"):
        _refuse("--secrets-file must be an absolute path on the nodes")
    opts = SlurmOptions(
        runtime="pyxis" if pyxis else "docker",
        partition=partition,
        time=time,
        account=account,
        reservation=reservation,
        qos=qos,
        secrets_file=secrets_file,
        download_at_start=download_at_start,
    )
    try:
        weights = export_weights(load(inventory), download_at_start)
        inv = weights.inventory
        files = render_slurm(inv, build_plan(inv), opts)
    except ExportError as e:
        _refuse(f"cannot export to Slurm: {e}")
        return
    _write(out_dir, files, executable=frozenset(n for n in files if n.endswith(".sbatch")))
    _err(weights.summary)


def _sbatch_value(value: str) -> bool:
    """An #SBATCH line's value: no spaces or shell characters (sbatch reads the line as is)."""
    return bool(value) and all(c.isalnum() or c in "-_:.," for c in value)
