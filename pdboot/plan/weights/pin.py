"""Which commit a deployment runs: the one it was staged at, until the operator asks.

`up` records the commit in `weights.pin` beside compose.yaml on every engine host. On the
next `up` a moved branch changes nothing (both tiers keep loading the recorded commit, so
they cannot split across two revisions) and is reported; `--refresh-weights`, or a changed
`model` / `model_revision`, moves the deployment to what the hub says now. Pure.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from pdboot.plan.weights.hub import is_commit

PIN_FILE = "weights.pin"


@dataclass(frozen=True)
class Pin:
    model: str
    revision: str  # as the inventory asked it (branch, tag or commit)
    commit: str

    def text(self) -> str:
        body = {"model": self.model, "revision": self.revision, "commit": self.commit}
        return json.dumps(body, sort_keys=True) + "\n"


def parse_pin(text: str | None) -> Pin | None:
    """A recorded pin, or None (missing, unreadable or not a commit: treated as no pin)."""
    if not text:
        return None
    try:
        d = json.loads(text)
        pin = Pin(str(d["model"]), str(d["revision"]), str(d["commit"]))
    except (ValueError, KeyError, TypeError):
        return None
    return pin if is_commit(pin.commit) else None


@dataclass(frozen=True)
class PinChoice:
    commit: str | None  # None: no commit can be chosen (error says why)
    notes: tuple[str, ...] = ()
    error: str = ""
    moved: bool = False  # a recorded commit is left for another: the engines change weights


def choose(
    recorded: Mapping[str, str | None],
    model: str,
    revision: str,
    resolved: str | None,
    refresh: bool = False,
) -> PinChoice:
    """recorded: engine host -> its weights.pin text (None: none). resolved: the commit the hub
    names for `revision` now (None: not asked or not reachable)."""
    pins = {h: p for h, p in ((h, parse_pin(t)) for h, t in recorded.items()) if p is not None}
    same = {h: p for h, p in pins.items() if p.model == model and p.revision == revision}
    commits = sorted({p.commit for p in same.values()})
    if refresh or not commits:
        if resolved is None:
            return PinChoice(None, error=f"cannot resolve {model}@{revision} to a commit")
        notes: tuple[str, ...] = ()
        if refresh and commits and commits != [resolved]:
            notes = (
                f"--refresh-weights: moving {model} from {', '.join(c[:12] for c in commits)}"
                f" to {resolved[:12]} ({revision})",
            )
        return PinChoice(resolved, notes, moved=bool(commits) and commits != [resolved])
    if len(commits) > 1:
        where = ", ".join(f"{h}={p.commit[:12]}" for h, p in sorted(same.items()))
        return PinChoice(
            None,
            error=f"engine hosts record different commits of {model}@{revision} ({where}); "
            "run `up --refresh-weights` to put every host on the hub's current one",
        )
    commit = commits[0]
    notes = ()
    if resolved is not None and resolved != commit:
        notes = (
            f"{model}@{revision} now points at {resolved[:12]}; this deployment stays on "
            f"{commit[:12]} (both tiers load one commit); `up --refresh-weights` moves it",
        )
    return PinChoice(commit, notes)
