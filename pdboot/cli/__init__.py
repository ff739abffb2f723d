"""The `pdboot` command line: arguments in, calls into the core, a view out; no logic here.

main.py assembles the typer app and is what entry.py calls. console.py (no typer) holds what
a command does around its work; preflight.py the preflight verb's body (no typer); options.py
the options several commands share; app.py the app and its conventions; deploy.py, export.py
and operations.py the commands. This package imports nothing: `pdboot --version` loads none
of it."""
