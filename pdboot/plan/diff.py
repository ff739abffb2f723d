"""What differs between a running container and its planned service, in an operator's words
(`up --plan`'s reason for a recreate): the image, the engine's arguments option by option, the
planned environment, the GPUs. Pure; reads only what docker inspect reports (converge.Observed).

Values printed are the plan's and the container's for the same planned keys: the plan holds no
secret values (they reach containers through secrets.env, whose keys the plan never names), so
nothing secret is shown."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pdboot.plan.converge import Observed
    from pdboot.plan.model import Service

_LONG = 40  # a value longer than this (the KV transfer JSON) is named, not printed


def options(argv: tuple[str, ...]) -> dict[str, str]:
    """``model --port 8201 --enforce-eager`` -> {"": "model", "--port": "8201",
    "--enforce-eager": ""}; ``--a=b`` as ``--a b``; a repeated option keeps its values."""
    out: dict[str, str] = {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("-"):
            name, eq, value = arg.partition("=")
            if not eq and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                value, i = argv[i + 1], i + 1
            out[name] = f"{out[name]} {value}" if name in out else value
        else:
            out[""] = f"{out.get('', '')} {arg}".strip()
        i += 1
    return out


def _value(v: str) -> str:
    return v if len(v) <= _LONG else v[: _LONG - 3] + "..."


def _json_object(text: str) -> dict[str, Any] | None:
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _changed(what: str, old: str, new: str) -> str:
    a, b = _json_object(old), _json_object(new)
    if a is not None and b is not None:  # --kv-transfer-config: the keys that moved
        keys = [k for k in dict.fromkeys([*a, *b]) if a.get(k) != b.get(k)]
        shown = [
            (k, json.dumps(a[k]) if k in a else "", json.dumps(b[k]) if k in b else "")
            for k in keys
        ]
        parts = [_changed(k, old_v, new_v) for k, old_v, new_v in shown]
        return f"{what} {{{', '.join(parts)}}}"
    if len(old) > _LONG or len(new) > _LONG:
        return f"{what} changed"
    return f"{what} {old or '(none)'} -> {new or '(none)'}"


def argument_changes(old: tuple[str, ...], new: tuple[str, ...]) -> list[str]:
    a, b = options(old), options(new)
    out = []
    for name in dict.fromkeys([*a, *b]):
        what = name or "model"
        if name not in a:
            out.append(f"{what} {_value(b[name])} added".replace("  ", " "))
        elif name not in b:
            out.append(f"{what} removed")
        elif a[name] != b[name]:
            out.append(_changed(what, a[name], b[name]))
    return out


def planned_gpus(svc: Service) -> str:
    if svc.gpus is None:
        return ""
    return "all" if svc.gpus == "all" else ",".join(str(g) for g in svc.gpus)


def config_changes(svc: Service, cur: Observed) -> str:
    """`image v0.33.0 -> v0.34.0; --max-num-seqs 128 -> 256; env UCX_TLS (none) -> tcp`; when
    inspect shows none of these, the hashes (mounts, labels, limits changed)."""
    out: list[str] = []
    if cur.image and cur.image != svc.image:
        out.append(_changed("image", cur.image, svc.image))
    if cur.command and cur.command != svc.command:
        out += argument_changes(cur.command, svc.command)
    running = dict(cur.env)
    for name, value in svc.environment:
        if cur.env and running.get(name) != value:
            out.append(_changed(f"env {name}", running.get(name, ""), value))
    if cur.command and cur.gpus != planned_gpus(svc):
        out.append(_changed("GPUs", cur.gpus, planned_gpus(svc)))
    if not out:
        return f"other settings (mounts, limits, labels; {cur.config_hash} -> {svc.config_hash})"
    return "; ".join(out)
