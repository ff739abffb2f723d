"""Docker's timestamps (RFC 3339 with nanoseconds, ``Z`` or an offset; ``0001-01-01...``
for "never") as aware datetimes. Python 3.10's ``fromisoformat`` takes neither ``Z`` nor more
than six fractional digits, hence this one parser for every reader of StartedAt."""

from __future__ import annotations

import re
from datetime import datetime

_RFC3339 = re.compile(r"^(.*?T[0-9:]+)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)?$")


def parse_rfc3339(text: str) -> datetime | None:
    """Aware datetime (no offset given: UTC); None for empty, Docker's zero time or junk."""
    if not text or text.startswith("0001-"):
        return None
    m = _RFC3339.match(text)
    if m is None:
        return None
    frac = (m.group(2) or "0")[:6]
    tz = m.group(3) or "Z"
    try:
        return datetime.fromisoformat(f"{m.group(1)}.{frac}{'+00:00' if tz == 'Z' else tz}")
    except ValueError:
        return None
