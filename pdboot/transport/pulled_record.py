"""The record of the images pdboot pulled on a host, so that `down --purge` removes those and
nothing else (an image an operator loaded or pulled by hand is not pdboot's to remove).

Why a file and not a label: an image's labels are baked into it at build time, and Docker
has no way to add one to a pulled image; a tag of our own would change what `docker images`
shows the operator. The record lives in the project directory pdboot created and marked
(``.pdboot-pulled``, one ``image digest`` line per pull), is read before that directory is
purged, and names the digest pulled: an image re-tagged or replaced by hand since then no
longer carries that digest and is left alone. Pure functions of plain strings.
"""

from __future__ import annotations

import re

PULLED_FILE = ".pdboot-pulled"

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


def record_lines(entries: list[tuple[str, str]]) -> str:
    """``(image, digest)`` pairs as the lines appended to the record."""
    return "".join(f"{image} {digest}\n" for image, digest in entries if _valid(image, digest))


def parse_record(text: str | None) -> list[tuple[str, str]]:
    """The record's ``(image, digest)`` pairs, in order, each once; malformed lines (a
    hand edit, a write cut short) are ignored: purge then removes less, never more."""
    out: list[tuple[str, str]] = []
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) == 2 and _valid(parts[0], parts[1]) and tuple(parts) not in out:
            out.append((parts[0], parts[1]))
    return out


def to_purge(record: list[tuple[str, str]], local: dict[str, list[str]]) -> list[str]:
    """The images to remove: those recorded whose local copy still carries a digest pdboot
    pulled (``local``: image -> its local repo digests, empty when absent)."""
    return sorted({img for img, digest in record if digest in local.get(img, [])})


def _valid(image: str, digest: str) -> bool:
    return bool(image) and not any(c.isspace() for c in image) and bool(_DIGEST.fullmatch(digest))
