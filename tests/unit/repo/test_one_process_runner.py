"""One process runner (issue 41): the local host's connection (transport/connection.py's
``LocalConnection``) is the only place in pdboot/ that starts a process on this machine;
everything else runs commands through a connection (a `local` host's or an SSH host's), so
masking, timeouts and errors are the same everywhere. The bench/ scripts outside the package
are not held to it."""

from __future__ import annotations

import ast

from tests.unit.paths import ROOT

PKG = ROOT / "pdboot"
RUNNER = "transport/connection.py"
# modules whose import starts processes, and the os/asyncio calls that do
PROCESS_MODULES = {"subprocess", "pty", "multiprocessing"}
PROCESS_CALLS = {
    "os": {"system", "popen", "fork", "forkpty", "posix_spawn", "posix_spawnp"},
    "asyncio": {"create_subprocess_exec", "create_subprocess_shell"},
}


def starts_processes(source: str) -> list[str]:
    """What in this source starts a process: the imports and calls, each with its line."""
    found: list[str] = []
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.Import):
            found += [
                f"{n.lineno}: import {a.name}"
                for a in n.names
                if a.name.split(".")[0] in PROCESS_MODULES
            ]
        elif isinstance(n, ast.ImportFrom) and n.module:
            top = n.module.split(".")[0]
            names = {a.name for a in n.names}
            if top in PROCESS_MODULES or names & PROCESS_CALLS.get(top, set()):
                found.append(f"{n.lineno}: from {n.module} import {', '.join(sorted(names))}")
        elif isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name):
            calls = PROCESS_CALLS.get(n.value.id, set())
            if n.attr in calls or (n.value.id == "os" and n.attr.startswith(("exec", "spawn"))):
                found.append(f"{n.lineno}: {n.value.id}.{n.attr}")
    return found


def test_only_the_local_connection_starts_processes() -> None:
    offenders = {
        str(p.relative_to(PKG)): hits
        for p in sorted(PKG.rglob("*.py"))
        if str(p.relative_to(PKG)) != RUNNER and (hits := starts_processes(p.read_text()))
    }
    assert offenders == {}, "run commands through transport.connection.LocalConnection"


def test_the_runner_is_where_the_rule_says() -> None:
    assert starts_processes((PKG / RUNNER).read_text()), "the rule names the wrong module"


def test_every_way_of_starting_a_process_is_seen() -> None:
    snippets = [
        "import subprocess",
        "import subprocess as sp",
        "from subprocess import run",
        "import multiprocessing.pool",
        "import os\nos.system('x')",
        "import os\nos.execvp('x', ['x'])",
        "import os\nos.posix_spawn('x', ['x'], {})",
        "from os import popen",
        "import asyncio\nasyncio.create_subprocess_exec('x')",
    ]
    for s in snippets:
        assert starts_processes(s), s
    assert not starts_processes("import os\nos.environ.get('x')\nfrom os import path")


def test_a_lazy_import_inside_a_function_counts() -> None:
    source = "def f():\n    import subprocess\n    return subprocess.run(['true'])\n"
    assert starts_processes(source) == ["2: import subprocess"]
