"""What pdboot writes on a host, as text and bytes (pure): the script that ships a project's
files over one SSH exec (the project dir claimed with its marker, every file by its byte
count, secrets.env 0600) and a secret file put into a container as a tar."""

from __future__ import annotations

import io
import posixpath
import shlex
import tarfile
import time
from collections.abc import Mapping

from pdboot.plan.model import PRIVATE_FILES, SECRETS_FILE
from pdboot.transport.connection import put_text_script

PROJECT_MARKER = ".pdboot-deployment"


def claim_project_dir(project_dir: str) -> str:
    """Shell lines: create the 0700 project dir and write its marker at once, or accept it
    when the marker (written at its creation) names this deployment. Anything else that
    is already there, an empty directory or one holding a pdboot-looking compose.yaml
    included, is refused: `down --purge` removes only what `up` created."""
    d, m = shlex.quote(project_dir), shlex.quote(f"{project_dir}/{PROJECT_MARKER}")
    name = shlex.quote(posixpath.basename(project_dir))
    parent = shlex.quote(posixpath.dirname(project_dir) or "/")
    not_ours = (
        f"  echo {d} exists and pdboot did not create it \\(no {PROJECT_MARKER} naming "
        f"deployment {name}\\): choose another remote_dir or name, or remove it by hand "
        "if it is yours >&2\n  exit 3\n"
    )
    return (
        f"if [ -L {d} ]; then\n{not_ours}"
        f"elif [ -f {m} ] && [ ! -L {m} ]; then\n"
        f'  [ "$(cat {m})" = {name} ] || {{ echo {d} belongs to another deployment >&2; '
        "exit 3; }\n"
        f"elif [ -e {d} ]; then\n{not_ours}"
        "else\n"
        f"  mkdir -p -- {parent}\n"
        # mkdir (not -p) fails if another run created it meanwhile: never adopted
        f"  mkdir -m 0700 -- {d} || exit 3\n"
        f"  printf '%s\\n' {name} > {m}\n"
        "fi\n"
        f"chmod 0700 {d}\n"
    )


def ship_script(
    project_dir: str, files: Mapping[str, str], secrets_text: str | None
) -> tuple[str, str]:
    """(script, stdin) writing ``files`` (0644) and secrets.env (0600) into the project dir.

    The script is a few lines whatever the files hold: the contents are concatenated on
    stdin and each file takes its exact byte count with dd (which, unlike head -c, never
    reads past it on a pipe); secrets.env, last, takes the rest (put_text_script)."""
    script = "set -e; umask 077\n" + claim_project_dir(project_dir)
    parts: list[str] = []
    for name, text in files.items():
        body = text if text.endswith("\n") else text + "\n"
        mode = 0o600 if name in PRIVATE_FILES else 0o644  # the proxy's key check: 0600
        script += _stdin_write(f"{project_dir}/{name}", len(body.encode("utf-8")), mode)
        parts.append(body)
    if secrets_text is not None:
        script += put_text_script(f"{project_dir}/{SECRETS_FILE}", 0o600) + "\n"
        parts.append(secrets_text)
    else:  # a token from an earlier inventory must not linger
        script += f"rm -f {shlex.quote(f'{project_dir}/{SECRETS_FILE}')}\n"
    return script, "".join(parts)


def _stdin_write(path: str, size: int, mode: int = 0o644) -> str:
    """Script lines moving the next ``size`` bytes of stdin to ``path`` (``mode``)
    atomically: temp file, length check, then mv."""
    target = shlex.quote(path)
    return (
        f"tmp=$(mktemp {target}.XXXXXX)\n"
        f'dd bs=65536 iflag=fullblock,count_bytes count={size} status=none > "$tmp"\n'
        f'[ "$(wc -c < "$tmp")" -eq {size} ] || '
        f'{{ rm -f "$tmp"; echo {target}: stdin ended early >&2; exit 3; }}\n'
        f'chmod {mode:o} "$tmp"; mv -f "$tmp" {target}\n'
    )


def secret_tar(path: str, text: str) -> bytes:
    """One file, mode 0600, owned by root, as a tar (what put_archive takes)."""
    data = text.encode()
    info = tarfile.TarInfo(posixpath.basename(path))
    info.size, info.mode, info.mtime = len(data), 0o600, int(time.time())
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        t.addfile(info, io.BytesIO(data))
    return buf.getvalue()
