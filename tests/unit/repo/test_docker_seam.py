"""One Docker seam (issue 41): deploy/, preflight/ and every other package say what they want
from Docker (compose up of a file, exec, a one-shot program in an image, stop, remove by
label) through transport/docker_cli.py; only transport/ spells a docker command line: no
argv list starting with "docker" and no shell line running a docker subcommand with options
anywhere else in pdboot/. (Messages naming a command, "docker image inspect did not run",
are words for the operator, not commands: the rule looks for options after the verb.)"""

from __future__ import annotations

import ast
import re

from tests.unit.paths import ROOT

PKG = ROOT / "pdboot"
# transport/ spells them; export/ renders a Slurm script that runs elsewhere, as plan/
# renders compose files: text for another system, not a command pdboot runs
EXEMPT = ("transport/", "export/")
VERBS = r"compose|run|exec|ps|rm|stop|restart|start|kill|info|inspect|pull|logs|image|container"
# `docker <verb> [<word>] -x` / `--xyz`: a command line. Not in backticks: an operator's hint
# ("run the probe by hand: `docker run ...`") or a docstring's words
SHELL_LINE = re.compile(rf"(?<!`)\bdocker (?:{VERBS})(?: \w+)? +-")


def docker_spelled(source: str) -> list[str]:
    """Where this source spells a docker command line, each with its line."""
    tree = ast.parse(source)
    docstrings = {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and n.body
        and isinstance(n.body[0], ast.Expr)
        and isinstance(n.body[0].value, ast.Constant)
    }
    found: list[str] = []
    for n in ast.walk(tree):
        if isinstance(n, (ast.List, ast.Tuple)) and len(n.elts) >= 2:
            first, verb = n.elts[0], n.elts[1]
            if (
                isinstance(first, ast.Constant)
                and first.value == "docker"
                and isinstance(verb, ast.Constant)
                and re.fullmatch(VERBS, str(verb.value))
            ):
                found.append(f"{n.lineno}: argv {ast.unparse(n)[:60]}")
        elif (
            isinstance(n, ast.Constant)
            and isinstance(n.value, str)
            and id(n) not in docstrings
            and SHELL_LINE.search(n.value)
        ):
            found.append(f"{n.lineno}: shell line {n.value[:60]!r}")
    return found


def test_only_transport_spells_docker_command_lines() -> None:
    offenders = {
        name: hits
        for p in sorted(PKG.rglob("*.py"))
        if not (name := str(p.relative_to(PKG))).startswith(EXEMPT)
        and (hits := docker_spelled(p.read_text()))
    }
    assert offenders == {}, "build the argv with pdboot.transport.docker_cli"


def test_the_seam_is_where_the_rule_says() -> None:
    assert docker_spelled((PKG / "transport" / "docker_cli.py").read_text())


def test_argv_lists_and_shell_lines_are_seen_and_messages_are_not() -> None:
    spelled = [
        '["docker", "rm", "--force", name]',
        '("docker", "exec", c, "sh")',
        "\"docker info --format '{{json .}}'\"",
        "f\"docker ps -a --no-trunc --filter {label} --format '{{{{json .}}}}'\"",
        "\"docker image inspect --format '{{json .Config.Env}}' x\"",
        '"docker compose --project-name p up"',
    ]
    for s in spelled:
        assert docker_spelled(f"x = {s}"), s
    words = [
        'x = "docker image inspect did not run"',
        'x = f"docker restart {name}: {out}"',
        'x = f"docker info ({error})"',
        'x = ["compose", "docker"]',
        'f(also_for=("docker", "model"))',  # an area's name
        'x = "fix: run it by hand: `docker run --rm --entrypoint python3 IMAGE`"',
        'def f():\n    """Reads `docker info --format json`."""\n',
        '"""docker ps -a --filter x: a module\'s docstring"""',
    ]
    for s in words:
        assert not docker_spelled(s), s
