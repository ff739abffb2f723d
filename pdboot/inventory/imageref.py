"""Image references, by the grammar of Docker's distribution/reference package.

An inventory's ``image`` that Docker would refuse (``Vllm/vllm-openai:v0.33.0``: upper
case in the repository; ``vllm/``; ``vllm/vllm-openai:v0:33``) used to pass pdboot's
character check and fail at the pull, on every host, long after `up` started. Checked
here at load time instead. All patterns are ASCII-only (``re.ASCII``): ``\\w`` and
``\\d`` would otherwise match any script's letters and digits.
"""

from __future__ import annotations

import re

_A = re.ASCII
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[0-9a-fA-F:.]+\])(?::[0-9]+)?"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[_.]|__|-+)[a-z0-9]+)*"
_TAG = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", _A)
_DIGEST = re.compile(r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}", _A)
# the characters an image reference may hold at all, before the grammar: registry/repo:tag@digest
IMAGE_CHARS_RE = r"[A-Za-z0-9][A-Za-z0-9._/:@+-]{0,254}"
_DOMAIN_RE = re.compile(_DOMAIN, _A)
_PATH_RE = re.compile(rf"{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*", _A)
NAME_MAX = 255


def check_image_reference(value: str) -> str:
    """``[registry[:port]/]repo/path[:tag][@algo:hex]``, or ValueError saying which part
    Docker would refuse."""
    if not value or not value.isascii():
        raise ValueError(
            f"{value!r} is not an image reference (ASCII, like vllm/vllm-openai:v0.33.0)"
        )
    name, at, digest = value.partition("@")
    if at and not _DIGEST.fullmatch(digest):
        raise ValueError(f"{value!r}: the digest must be algorithm:hex (sha256:<64 hex digits>)")
    if at and digest.startswith("sha256:") and len(digest) != len("sha256:") + 64:
        raise ValueError(f"{value!r}: a sha256 digest has 64 hex digits")
    # the tag follows the last ':' after the last '/' (a registry port comes before a '/')
    slash = name.rfind("/")
    colon = name.rfind(":")
    tag = ""
    if colon > slash:
        name, tag = name[:colon], name[colon + 1 :]
        if not _TAG.fullmatch(tag):
            raise ValueError(
                f"{value!r}: tag {tag!r} is not valid (letters, digits, _ . -, at most 128, "
                "not starting with . or -)"
            )
    if len(name) > NAME_MAX:
        raise ValueError(f"{value!r}: the repository name is longer than {NAME_MAX} characters")
    first, sep, rest = name.partition("/")
    # Docker's rule: the first component is a registry when it has a '.' or a ':' or is
    # localhost; otherwise it is part of the repository path.
    if sep and ("." in first or ":" in first or first == "localhost"):
        if not _DOMAIN_RE.fullmatch(first):
            raise ValueError(f"{value!r}: {first!r} is not a registry host[:port]")
        path = rest
    else:
        path = name
    if not _PATH_RE.fullmatch(path):
        raise ValueError(
            f"{value!r}: repository {path!r} is not valid (lowercase letters and digits, "
            "separated by . _ __ - or /; Docker refuses upper case)"
        )
    return value


__all__ = ["check_image_reference"]
