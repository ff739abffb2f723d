"""Secret masking: every secret value pdboot handles is registered once, and every command
line or message that could reach a log or a terminal goes through ``mask``.
"""

from __future__ import annotations

import threading


class Masker:
    """Values registered here are replaced by ``***`` in anything we log or report."""

    def __init__(self) -> None:
        self._values: set[str] = set()
        self._lock = threading.Lock()

    def register(self, value: str) -> None:
        if value and len(value) >= 4:  # masking "a" would shred every message
            with self._lock:
                self._values.add(value)

    def mask(self, text: str) -> str:
        with self._lock:
            values = sorted(self._values, key=len, reverse=True)
        for v in values:
            text = text.replace(v, "***")
        return text


# Process-wide: a secret registered once (e.g. the HF token read by `up`) stays masked in
# every log line, whichever connection printed it.
SECRETS = Masker()


def register_secret(value: str) -> None:
    SECRETS.register(value)


def mask(text: str) -> str:
    return SECRETS.mask(text)
