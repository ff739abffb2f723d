"""Which real option an ``extra_args`` item is, the way argparse would read it.

vLLM's and vllm-router's parsers are argparse with abbreviations allowed: ``--api-ke X``
is ``--api-key X``, ``--prometheus-po 1`` is ``--prometheus-port 1``, ``--po 9`` is an
engine's ``--port 9``. Matching flag names exactly therefore lets a secret onto the
command line and lets an operator silently override what pdboot sets. ``resolve`` answers
with the options argparse would take the item for, over the real option lists
(inventory/optionlists.py, generated from the captures); the inventory refuses an item that
resolves (exactly, as an abbreviation, or ambiguously) to a flag pdboot manages or treats
as secret. Pure functions of plain values.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from pdboot.inventory.optionlists import VLLM_ROUTER, VLLM_SERVE

ENGINE = "vllm serve"
ROUTER = "vllm-router"
PROGRAM_OPTIONS: Mapping[str, tuple[str, ...]] = {ENGINE: VLLM_SERVE, ROUTER: VLLM_ROUTER}


def normalise(arg: str) -> str:
    """``--kv_transfer_config=...`` -> ``--kv-transfer-config`` (vLLM's parser accepts
    both spellings; for the router this is only stricter). The value is dropped."""
    flag = arg.split("=", 1)[0]
    return "--" + flag[2:].replace("_", "-") if flag.startswith("--") else flag


def resolve(arg: str, options: Iterable[str]) -> tuple[str, ...]:
    """The options argparse (allow_abbrev=True, Python 3.10+) could take ``arg`` for:
    one exact match, the candidates of an abbreviation (one: it is used; several:
    argparse refuses it as ambiguous), or () for a value or an unknown option."""
    opts = set(options)
    if not arg.startswith("-") or arg in ("-", "--") or " " in arg.split("=", 1)[0]:
        return ()
    flag = normalise(arg)
    if flag in opts:
        return (flag,)
    if flag.startswith("--"):
        return tuple(sorted(o for o in opts if o.startswith(flag)))
    # a single dash: `-xVALUE` for a one-letter option, or a prefix of a longer one (-tp)
    short = flag[:2]
    return tuple(sorted(o for o in opts if o == short or (len(flag) > 1 and o.startswith(flag))))


@dataclass(frozen=True)
class FlagHit:
    """An extra_args item that is (or abbreviates) one of ``wanted``."""

    given: str  # the flag as written (without a value)
    flag: str  # the real option it stands for (the first, when ambiguous)
    exact: bool
    candidates: tuple[str, ...]

    def spelled(self, program: str) -> str:
        if self.exact:
            return self.flag
        if len(self.candidates) == 1:
            return f"{self.given} ({program} reads this abbreviation as {self.flag})"
        return (
            f"{self.given} (an ambiguous abbreviation {program} would refuse: "
            f"{', '.join(self.candidates[:4])}{', ...' if len(self.candidates) > 4 else ''})"
        )


def find(arg: str, program: str, wanted: Iterable[str]) -> FlagHit | None:
    """Does ``arg`` name one of ``wanted`` for ``program``? Options outside the real list
    (an older or newer release's) count when they match ``wanted`` exactly."""
    wanted_set = set(wanted)
    flag = normalise(arg)
    if flag in wanted_set:
        return FlagHit(arg.split("=", 1)[0], flag, True, (flag,))
    options = set(PROGRAM_OPTIONS[program]) | wanted_set
    cands = resolve(arg, options)
    hits = [c for c in cands if c in wanted_set]
    if not hits:
        return None
    return FlagHit(arg.split("=", 1)[0], hits[0], len(cands) == 1 and cands[0] == flag, cands)


__all__ = ["ENGINE", "PROGRAM_OPTIONS", "ROUTER", "FlagHit", "find", "normalise", "resolve"]
