"""Terminal colour and cursor codes (CSI sequences: vLLM colours its log level, nvidia-smi
underlines the ``topo -m`` header) removed from text that pdboot parses or shows."""

from __future__ import annotations

import re

_CSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def strip_ansi(line: str) -> str:
    return _CSI.sub("", line)
