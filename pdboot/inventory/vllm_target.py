"""Which vLLM release an inventory targets, and what that release's engines refuse (pure).

The release is read from the engine image's tag (``vllm/vllm-openai:v0.34.0`` -> 0.34.0).
pdboot carries the `vllm serve` option lists of the releases it knows (inventory/optionlists.py,
generated from the real wheels' dumps). A tag of a known minor (0.34.2) uses that minor's list;
a newer or unnamed tag (``nightly``, ``latest``, a digest) the newest list pdboot has; an older
one the oldest. Those guesses are only the early check: after the pull, the image's own
`vllm serve` parser has the last word (pdboot/preflight/image_args.py).

What differs from 0.34 on (../shared/docs/vllm-0.34-changes.md) is decided here too: the
environment variables 0.34 refuses at start, the extensible KV cache.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass

from pdboot.inventory.flagnames import normalise, resolve
from pdboot.inventory.optionlists import VLLM_SERVE_BY_VERSION

KNOWN: tuple[str, ...] = tuple(VLLM_SERVE_BY_VERSION)  # oldest first
NEWEST = KNOWN[-1]
_VERSION_IN_TAG = re.compile(
    r"(?:^|[^0-9.])v?([0-9]{1,3})\.([0-9]{1,3})(?:\.([0-9]{1,3}))?(?![0-9])"
)


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def at_least(version: str, floor: str) -> bool:
    """``at_least("0.34.0", "0.34")``; compares as many parts as ``floor`` has."""
    return _key(version)[: len(_key(floor))] >= _key(floor)


def tag_version(image: str) -> str | None:
    """The release an image tag names (``v0.34.0``, ``0.32.0-cpu``, ``v0.34.1rc1``), or None
    (``nightly``, ``latest``, no tag, a digest only)."""
    name = image.partition("@")[0]
    slash, colon = name.rfind("/"), name.rfind(":")
    if colon <= slash:
        return None
    m = _VERSION_IN_TAG.search(name[colon + 1 :])
    if m is None:
        return None
    return ".".join((m.group(1), m.group(2), m.group(3) or "0"))


@dataclass(frozen=True)
class Target:
    """The release whose facts pdboot applies (``version``, one of KNOWN) and what the tag
    says (``tagged``: None when it names no release)."""

    version: str
    tagged: str | None

    @property
    def exact(self) -> bool:
        return self.tagged is not None and self.tagged.split(".")[:2] == self.version.split(".")[:2]

    def describe(self) -> str:
        """How an error names the option list: `vLLM 0.34.0` or with why it was chosen."""
        if self.exact:
            return f"vLLM {self.version}"
        if self.tagged is None:
            why = "the image's tag names no release; the newest pdboot knows"
        else:
            why = f"the image's tag says {self.tagged}, which pdboot has no list for"
        return f"vLLM {self.version} ({why})"


def target(image: str) -> Target:
    tagged = tag_version(image)
    if tagged is None:
        return Target(NEWEST, None)
    for v in reversed(KNOWN):
        if _key(v)[:2] == _key(tagged)[:2]:
            return Target(v, tagged)
    return Target(NEWEST if _key(tagged) > _key(NEWEST) else KNOWN[0], tagged)


def serve_options(version: str) -> tuple[str, ...]:
    return VLLM_SERVE_BY_VERSION[version]


# --------------------------------------------------------------------------- extra_args


def _is_value(item: str) -> bool:
    """argparse reads ``-1``/``-0.5`` as values when the parser has no option like them
    (vLLM's has none): so do we."""
    return (
        not item.startswith("-") or item in ("-", "--") or bool(re.fullmatch(r"-\.?[0-9].*", item))
    )


def did_you_mean(flag: str, options: Sequence[str]) -> str:
    close = difflib.get_close_matches(flag, [o for o in options if o.startswith("--")], n=1)
    return f"; did you mean {close[0]}?" if close else ""


def _elsewhere(flag: str) -> str:
    """`; vLLM 0.34.0 has it (...)` when another release pdboot knows has the option."""
    have = [v for v, opts in VLLM_SERVE_BY_VERSION.items() if flag in opts]
    if not have:
        return ""
    return f"; vLLM {', '.join(have)} has it (the engine image's tag decides the release)"


def extra_args_problems(
    args: Sequence[str], options: Sequence[str], who: str
) -> list[tuple[int, str]]:
    """(item index, message) for each item ``vllm serve`` of that option list would refuse:
    an option it does not have (with the nearest real one), an abbreviation it finds
    ambiguous, or an option and its value written as one item with a space (argparse
    would take the whole item for an unknown option)."""
    opts = set(options)
    out: list[tuple[int, str]] = []
    for i, item in enumerate(args):
        if _is_value(item):
            continue
        flag = item.split("=", 1)[0]
        if any(c.isspace() for c in flag):
            parts = flag.split()
            hint = ", ".join(repr(p) for p in parts[:2]) + (", ..." if len(parts) > 2 else "")
            out.append(
                (
                    i,
                    f"{item!r} holds a space: one option and its value are two items "
                    f"(write [{hint}]), or join them with '=' (--option=value)",
                )
            )
            continue
        if re.fullmatch(r"-O[0-9.]*", flag):
            continue  # vLLM's own parser rewrites -O3 / -O.x=y (FlexibleArgumentParser)
        if flag.startswith("--") and "." in flag:
            # --compilation-config.level=3: vLLM expands dotted keys of a JSON option
            item = flag.split(".", 1)[0]
            flag = item
        cands = resolve(item, opts)
        if not cands:
            out.append(
                (
                    i,
                    f"{flag} is not an option of {who}'s `vllm serve`"
                    + (_elsewhere(normalise(flag)) or did_you_mean(normalise(flag), options)),
                )
            )
        elif len(cands) > 1:
            shown = ", ".join(cands[:4]) + (", ..." if len(cands) > 4 else "")
            out.append(
                (
                    i,
                    f"{flag} is an ambiguous abbreviation for {who}'s `vllm serve` ({shown}); "
                    "write the whole option",
                )
            )
    return out


# --------------------------------------------------------------------------- 0.34 facts

# Removed in 0.34 and fatal when set (envs.py of 0.34.0): the V1 model runner is gone.
REFUSED_ENV_034 = {
    "VLLM_USE_V2_MODEL_RUNNER": (
        "vLLM 0.34 removed model runner V1 and refuses to start with any value but 1; "
        "remove it (V2 is the only runner)"
    ),
    "VLLM_MARLIN_INPUT_DTYPE": (
        "vLLM 0.34 removed it and refuses to start while it is set; remove it"
    ),
}


def refused_env(name: str, value: str, version: str) -> str | None:
    """Why an engine of ``version`` would refuse to start with this variable, or None."""
    if not at_least(version, "0.34") or name not in REFUSED_ENV_034:
        return None
    if name == "VLLM_USE_V2_MODEL_RUNNER" and value.strip() == "1":
        return None
    return REFUSED_ENV_034[name]


# Layouts vLLM 0.34 refuses when the extensible KV cache is on with a KV connector
# (v1/attention/backends/utils.py): only block-compact ones are allowed.
NON_COMPACT_LAYOUTS = ("HND", "NHD", "LHBNC", "BHLNC")
TRANSFER_MODES = ("pull", "push")


__all__ = [
    "KNOWN",
    "NEWEST",
    "NON_COMPACT_LAYOUTS",
    "TRANSFER_MODES",
    "Target",
    "at_least",
    "did_you_mean",
    "extra_args_problems",
    "refused_env",
    "serve_options",
    "tag_version",
    "target",
]
