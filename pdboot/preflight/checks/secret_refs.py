"""The inventory's secret references, checked where pdboot runs (where `up` reads them):
``secrets.hf_token``, ``secrets.api_key`` and each ``secrets.env`` value, ``env:NAME`` or
``file:PATH`` (a bare path for hf_token). Each problem gets a fix an operator can paste:
``export NAME=...``, ``chmod 600 PATH``, the missing path. Values are never printed.

They are judged once per run and reported with the deployment's first host in inventory
order (prepull's hook): they are this machine's, not a host's.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path

from pdboot.inventory.schema import Inventory
from pdboot.plan.proxy import MAX_API_KEY_CHARS
from pdboot.preflight.checks import CheckResult
from pdboot.transport.secret_refs import SecretError, read_api_key, read_secret


def references(inv: Inventory) -> list[tuple[str, str, str]]:
    """(check id, inventory key, reference) of every secret the inventory names."""
    s = inv.secrets
    out = []
    if s.hf_token is not None:
        out.append(("secrets.hf_token", "secrets.hf_token", s.hf_token))
    if s.api_key is not None:
        out.append(("secrets.api_key", "secrets.api_key", s.api_key))
    out += [("secrets.env", f"secrets.env.{n}", ref) for n, ref in s.env.items()]
    return out


def _example(key: str) -> str:
    return "hf_..." if key == "secrets.hf_token" else "..."


def check(cid: str, key: str, ref: str, environ: Mapping[str, str]) -> CheckResult:
    if ref.startswith("env:"):
        name = ref[4:]
        if not environ.get(name, "").strip():
            return CheckResult(
                cid,
                "fail",
                f"{key} is {ref}: {name} is not set (or empty) where pdboot runs",
                f"export {name}={_example(key)} (in the shell that runs pdboot)",
            )
    else:
        path = os.path.expanduser(ref[5:] if ref.startswith("file:") else ref)
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return CheckResult(
                cid,
                "fail",
                f"{key} is {ref}: {path} does not exist",
                f"write the secret to {path} (one line), then chmod 600 {path}",
            )
        except OSError as e:
            return CheckResult(
                cid, "fail", f"{key} is {ref}: {e.strerror}", f"make {path} readable by you"
            )
        if stat.S_ISREG(st.st_mode) and st.st_mode & (stat.S_IROTH | stat.S_IWOTH):
            return CheckResult(
                cid,
                "fail",
                f"{key} is {ref}: {path} is world-readable (mode {stat.S_IMODE(st.st_mode):o})",
                f"chmod 600 {path}",
            )
    try:
        read_secret(ref, key, environ)
    except SecretError as e:
        where = (
            f"export {ref[4:]}=<the token alone>"
            if ref.startswith("env:")
            else f"write only the token to {Path(ref[5:] if ref.startswith('file:') else ref)}"
        )
        return CheckResult(cid, "fail", str(e), f"{where} (no spaces, quotes or $)")
    if key == "secrets.api_key":
        try:
            read_api_key(ref, environ)
        except SecretError as e:
            fix = f"use a key of at most {MAX_API_KEY_CHARS} characters (openssl rand -hex 32)"
            return CheckResult(cid, "fail", str(e), fix)
    return CheckResult(cid, "pass", f"{key} ({ref}) is readable")


def evaluate(inv: Inventory, environ: Mapping[str, str] | None = None) -> list[CheckResult]:
    env = os.environ if environ is None else environ
    return [check(cid, key, ref, env) for cid, key, ref in references(inv)]
