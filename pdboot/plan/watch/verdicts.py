"""What `status` shows of `pdboot watch`: its last verdict per pair, read from its /verdicts.

Pure parsing (pdboot.deploy.watch.verdicts asks for it); an unreadable answer is a verdict
set with an error, never an exception.
"""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class PairVerdict:
    prefill: str
    decode: str
    ok: bool
    result: str
    fault: str
    reason: str
    seconds: float


@dataclass(frozen=True)
class WatchVerdicts:
    url: str
    rounds: int = 0
    pairs: tuple[PairVerdict, ...] = ()
    out_of_rotation: tuple[str, ...] = ()
    error: str = ""  # "" when read
    serving: str = "pd"  # plan/degraded.py's mode: pd, decode_only, prefill_only, down
    serving_seconds: float = 0.0  # how long it has served so


def parse_verdicts(url: str, text: str) -> WatchVerdicts:
    try:
        doc = json.loads(text)
        pairs = tuple(
            PairVerdict(
                str(p["prefill"]),
                str(p["decode"]),
                bool(p["ok"]),
                str(p["result"]),
                str(p.get("fault", "")),
                str(p.get("reason", "")),
                float(p.get("seconds", 0.0)),
            )
            for p in doc["pairs"]
        )
        out = tuple(str(k) for k in doc.get("out_of_rotation", []))
        serving = doc.get("serving") or {}  # absent from a watch before degraded mode
        return WatchVerdicts(
            url,
            int(doc.get("rounds", 0)),
            pairs,
            out,
            serving=str(serving.get("mode", "pd")),
            serving_seconds=float(serving.get("seconds", 0.0)),
        )
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        return WatchVerdicts(url, error=f"unreadable /verdicts: {e}")
