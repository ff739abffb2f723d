"""The first error of an engine's log: what a failure report leads with (pure).

When vLLM's worker dies at start, the last lines of the log are the API server's own
traceback ending "Engine core initialization failed. See root cause above": the cause (a
worker's exception, e.g. ``InvalidCxxCompiler: No working C++ compiler found`` for a CPU
image started without ``--enforce-eager``) is hundreds of lines above, in the first
traceback. vLLM prefixes each line of its subprocesses with ``(Worker pid=161) ERROR
12-04 21:43:12 [file.py:1063]``; the prefix is dropped before reading the traceback.
"""

from __future__ import annotations

import re

# "(Worker pid=161) ERROR 12-04 21:43:12 [multiproc_executor.py:1063] " and its parts
_PROC = re.compile(r"^\((?:[\w.-]+(?: [\w.-]+)*) pid=\d+\) ")
_LEVEL = re.compile(
    r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[[^\]]*\] ?"
)
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Failure)\b:? ?")
_CHAIN = ("During handling of the above exception", "The above exception was the direct")
MAX_CHARS = 500
# the lines a failure report reads for it: a worker's traceback with the cause sits a few
# hundred lines above the API server's own, which ends the log
READ_LINES = 2000


def body(line: str) -> str:
    """The line without vLLM's process and logging prefixes."""
    return _LEVEL.sub("", _PROC.sub("", line), count=1)


def _is_error_level(line: str) -> bool:
    rest = _PROC.sub("", line)
    return rest.startswith(("ERROR ", "CRITICAL "))


def first_error(lines: list[str]) -> tuple[str, ...]:
    """The first error in ``lines``: the exception line that ends the first traceback (the
    innermost, original exception: a chained one follows it); without a traceback, the
    first ERROR-level or exception-looking line. Empty when there is none. One line: what
    follows it unindented is as often the next log line as the message's continuation."""
    bodies = [body(x) for x in lines]
    start = next((i for i, b in enumerate(bodies) if b.startswith("Traceback (most recent")), None)
    if start is not None:
        for i in range(start + 1, len(bodies)):
            b = bodies[i]
            if not b.strip() or b[0].isspace() or b.startswith(_CHAIN):
                continue
            if b.startswith("Traceback (most recent"):
                continue
            return (b[:MAX_CHARS],)
    for raw, b in zip(lines, bodies, strict=True):
        if b.strip() and not b[0].isspace() and (_is_error_level(raw) or _EXCEPTION.match(b)):
            return (b[:MAX_CHARS],)
    return ()
