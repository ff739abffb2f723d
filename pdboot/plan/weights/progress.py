"""The staging container's report lines (programs.py prints them), parsed. Pure.

Each line is `PDBOOT-STAGE {json}`; anything else (the client's own warnings) is kept as
plain text for a failure report and otherwise ignored."""

from __future__ import annotations

import json
from dataclasses import dataclass

PREFIX = "PDBOOT-STAGE "


@dataclass(frozen=True)
class StageLine:
    kind: str  # plan / bytes / cached / done / error
    done: int = 0  # bytes on disk for this commit
    total: int = 0  # bytes the commit's files add up to
    files: int = 0
    commit: str = ""
    message: str = ""
    client: str = ""  # huggingface_hub's version in the image


def parse_line(line: str) -> StageLine | None:
    """One report line, or None for anything else (including a malformed report)."""
    at = line.find(PREFIX)
    if at < 0:
        return None
    try:
        d = json.loads(line[at + len(PREFIX) :])
        return StageLine(
            kind=str(d["kind"]),
            done=int(d.get("done", 0)),
            total=int(d.get("total", 0)),
            files=int(d.get("files", 0)),
            commit=str(d.get("commit", "")),
            message=str(d.get("message", "")),
            client=str(d.get("client", "")),
        )
    except (ValueError, KeyError, TypeError):
        return None


@dataclass
class StageState:
    """What one host's staging has reported so far."""

    done: int = 0
    total: int = 0
    files: int = 0
    client: str = ""
    cached: bool = False
    finished: bool = False
    error: str = ""
    digest: str = ""  # sha256 of config.json + the index as staged (the sameness check)

    def update(self, s: StageLine) -> None:
        if s.kind == "plan":
            self.total, self.files, self.client = s.total, s.files, s.client
            self.done = max(self.done, s.done)
        elif s.kind == "bytes":
            self.done = s.done
            self.total = s.total or self.total
        elif s.kind == "cached":
            self.cached = self.finished = True
            self.done = self.total = s.total or self.total
            self.digest = s.message
        elif s.kind == "done":
            self.finished = True
            self.digest = s.message
        elif s.kind == "error":
            self.error = s.message or "staging failed"
