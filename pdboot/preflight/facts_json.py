"""A host's typed facts as JSON values, for `preflight --json` (pure).

Only what the parsers read: the raw command output each fact keeps for its failure
messages (``Section``) is left out -- it is the host's text, not a fact, and may be long.
Dataclasses become objects, tuples and sets lists, anything else not JSON its str().
"""

from __future__ import annotations

import dataclasses
import enum

from pdboot.preflight.checks import Section
from pdboot.preflight.checks.facts import HostFacts

_SKIP = object()


def to_value(v: object) -> object:
    if isinstance(v, Section):
        return _SKIP
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, enum.Enum):
        return to_value(v.value)
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        out: dict[str, object] = {}
        for f in dataclasses.fields(v):
            x = to_value(getattr(v, f.name))
            if x is not _SKIP:
                out[f.name] = x
        return out
    if isinstance(v, dict):
        return {str(k): x for k, val in v.items() if (x := to_value(val)) is not _SKIP}
    if isinstance(v, (list, tuple, set, frozenset)):
        items = sorted(v, key=str) if isinstance(v, (set, frozenset)) else v
        return [x for i in items if (x := to_value(i)) is not _SKIP]
    return str(v)


def facts_json(facts: HostFacts) -> dict[str, object]:
    """{area: its facts, or null where the area did not apply or its parser failed}."""
    out = to_value(facts)
    assert isinstance(out, dict)
    return out
