"""The typer app with every command on it, in the order `pdboot --help` lists them: the deploy
verbs (deploy.py), the verbs around a running deployment (operations.py), then `export`.

Exit codes (pdboot/exitcodes.py): 0 success, 1 a check or deployment step failed, 2 bad usage
or inventory, 130 interrupted (Ctrl-C).
"""

from __future__ import annotations

# registering is importing: each module's @command adds its verbs to the app
import pdboot.cli.deploy
import pdboot.cli.operations  # noqa: F401
from pdboot.cli.app import Group, app
from pdboot.cli.export import export_app

app.add_typer(export_app, name="export", cls=Group)


def main() -> None:
    app()
