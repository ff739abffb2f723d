"""The image's own parser's verdicts, kept on pdboot's machine so that a second preflight and
the `up` after it do not start the image's vLLM again (35-45 s per image, most of it
importing vLLM) for commands it has already judged.

Why here and not on the hosts: a verdict is a pure function of the image's content and the
argv (the probe selects vLLM's CPU platform, so nothing of the host enters it), and the
image ID (`docker image inspect --format {{.Id}}`) is the sha256 of the image's config, the
same on every host that pulled it. One record on the machine that runs pdboot therefore
serves every host and every deployment using that image, needs no write on a host (preflight
changes nothing there) and no extra round trip to read it. Another operator machine pays the
check once more.

Layout: ``$PDBOOT_CACHE_DIR`` (else ``$XDG_CACHE_HOME/pdboot``, else ``~/.cache/pdboot``)
``/image-args/<probe>/<image id>.json``, where ``<probe>`` is a hash of the probe's source
(a changed probe judges anew) and the file holds the image's vLLM version, its option
strings (for a did-you-mean) and, per sha256 of an engine's argv, the parser's error ("" =
accepted) with when it was judged. Written whole to a temporary file and renamed, so a
reader never sees half a record; a lost race between two writers loses an entry, which is
only judged again.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

ENV = "PDBOOT_CACHE_DIR"
_LOCK = threading.Lock()  # the hosts' threads of one run share an image's record


def root(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    if env.get(ENV):
        return Path(env[ENV]) / "image-args"
    base = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".cache")
    return Path(base) / "pdboot" / "image-args"


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def argv_key(argv: Sequence[str]) -> str:
    return digest(json.dumps(list(argv)))


@dataclass(frozen=True)
class Verdict:
    error: str  # the parser's error; "" = accepted
    checked_at: str  # ISO time the image's parser judged it


@dataclass(frozen=True)
class Record:
    version: str
    options: tuple[str, ...]
    verdicts: Mapping[str, Verdict]  # argv_key -> verdict
    connector_version: str = ""  # NIXL's, a hash input of its handshake (plan/nixl_compat.py)
    nixl_version: str = ""  # the NIXL wheel's, and its UCX's (image_args.nixl_verdicts)
    ucx_version: str = ""


@dataclass(frozen=True)
class Cache:
    """The record files of one probe (``probe``: the probe's source) under ``base``."""

    base: Path
    probe: str

    @classmethod
    def default(cls, probe: str, environ: Mapping[str, str] | None = None) -> Cache:
        return cls(root(environ), probe)

    def path(self, image_id: str) -> Path:
        name = image_id.split(":", 1)[-1]
        if not name or not all(c in "0123456789abcdef" for c in name):
            raise ValueError(f"not an image ID: {image_id!r}")
        return self.base / digest(self.probe)[:16] / f"{name}.json"

    def read(self, image_id: str) -> Record | None:
        try:
            d = json.loads(self.path(image_id).read_text())
            return Record(
                str(d["version"]),
                tuple(str(o) for o in d.get("options") or ()),
                {
                    str(k): Verdict(str(v["error"]), str(v["checked_at"]))
                    for k, v in dict(d["verdicts"]).items()
                },
                str(d.get("connector_version") or ""),
                str(d.get("nixl_version") or ""),
                str(d.get("ucx_version") or ""),
            )
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None  # none yet, or unreadable: judged again, then rewritten

    def lookup(self, image_id: str, argvs: Sequence[Sequence[str]]) -> Record | None:
        """The record when it judges every one of ``argvs``; else None."""
        rec = self.read(image_id)
        if rec is None or any(argv_key(a) not in rec.verdicts for a in argvs):
            return None
        return rec

    def store(
        self,
        image_id: str,
        version: str,
        options: Sequence[str],
        errors: Mapping[tuple[str, ...], str],
        now: datetime | None = None,
        connector_version: str = "",
        nixl_version: str = "",
        ucx_version: str = "",
    ) -> Record:
        """Add the verdicts (argv -> the parser's error, "" = accepted) to the image's record."""
        at = (now or datetime.now(timezone.utc)).isoformat(timespec="seconds")
        path = self.path(image_id)
        with _LOCK:
            old = self.read(image_id)
            kept = dict(old.verdicts) if old is not None and old.version == version else {}
            kept.update({argv_key(a): Verdict(e, at) for a, e in errors.items()})
            rec = Record(
                version, tuple(options), kept, connector_version, nixl_version, ucx_version
            )
            body = {
                "image_id": image_id,
                "version": version,
                "connector_version": connector_version,
                "nixl_version": nixl_version,
                "ucx_version": ucx_version,
                "options": list(rec.options),
                "verdicts": {
                    k: {"error": v.error, "checked_at": v.checked_at} for k, v in kept.items()
                },
            }
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump(body, f, indent=1)
                os.replace(tmp, path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        return rec


__all__ = ["ENV", "Cache", "Record", "Verdict", "argv_key", "root"]
