"""The pdboot command line as the e2e tests run it: the real CLI (`python -m pdboot`) in a
subprocess of this interpreter, from the checkout, no mocks. The `cli` fixture
(tests/conftest.py) hands out a `Cli`; a module that needs more (a secret in the environment,
`up` without its preflight) overrides the fixture with `cli.with_(...)`.

COLUMNS and TERM are fixed so that tables and messages wrap the same on every terminal and the
assertions read the text an operator reads, without colour codes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLAIN_TERMINAL = {"COLUMNS": "200", "TERM": "dumb"}


def output(res: subprocess.CompletedProcess[str]) -> str:
    """What the operator saw: stdout then stderr."""
    return res.stdout + res.stderr


@dataclasses.dataclass(frozen=True)
class Cli:
    env: Mapping[str, str | None] = dataclasses.field(default_factory=dict)
    timeout: float = 300
    # preflight has its own e2e tests: a module that deploys many times skips it on `up`, and
    # a test that must show `up` gating on it asks with preflight=True
    skip_preflight: bool = False
    root: Path = ROOT

    def with_(self, **changes: Any) -> Cli:
        """A copy with other settings; `env` adds to this one's environment (None: unset)."""
        if "env" in changes:
            changes["env"] = {**self.env, **changes["env"]}
        return dataclasses.replace(self, **changes)

    def argv(self, *args: str, preflight: bool = False) -> list[str]:
        if args and args[0] == "up" and self.skip_preflight and not preflight:
            args = (*args, "--skip-preflight")
        return [sys.executable, "-m", "pdboot", *args]

    def environ(self, env: Mapping[str, str | None] | None = None) -> dict[str, str]:
        """os.environ with the plain terminal, this Cli's env and `env`; a None unsets."""
        merged = {**os.environ, **PLAIN_TERMINAL, **self.env, **(env or {})}
        return {k: v for k, v in merged.items() if v is not None}

    def popen(self, *args: str, env: Mapping[str, str | None] | None = None, **kw: Any) -> Any:
        """A pdboot process the test talks to while it runs (Ctrl-C, a follow)."""
        return subprocess.Popen(self.argv(*args), cwd=self.root, env=self.environ(env), **kw)

    def __call__(
        self,
        *args: str,
        timeout: float | None = None,
        env: Mapping[str, str | None] | None = None,
        preflight: bool = False,
        check: bool = False,
    ) -> subprocess.CompletedProcess[str]:
        """Run pdboot to its end; `check`: a non-zero exit fails the test with the output."""
        res = subprocess.run(
            self.argv(*args, preflight=preflight),
            capture_output=True,
            text=True,
            timeout=self.timeout if timeout is None else timeout,
            cwd=self.root,
            env=self.environ(env),
        )
        if check:
            assert res.returncode == 0, f"pdboot {' '.join(args)}: exit {res.returncode}\n" + (
                output(res)
            )
        return res

    def run_json(
        self,
        *args: str,
        timeout: float | None = None,
        env: Mapping[str, str | None] | None = None,
    ) -> tuple[subprocess.CompletedProcess[str], Any]:
        """Run a command that prints JSON (`preflight --json`, `status --json`): the result and
        the document; output that is not JSON fails the test, showing what came instead."""
        res = self(*args, timeout=timeout, env=env)
        try:
            return res, json.loads(res.stdout)
        except json.JSONDecodeError:
            pytest.fail(f"pdboot {' '.join(args)}: not JSON (rc {res.returncode}):\n{output(res)}")

    def status_json(self, inv: Path | str) -> Any:
        """`status INV --json` that exits 0 (the output shown otherwise): its document."""
        res, doc = self.run_json("status", str(inv), "--json")
        assert res.returncode == 0, output(res)
        return doc
