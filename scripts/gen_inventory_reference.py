"""Writes docs/inventory-reference.md from the inventory's pydantic models: every key, its type
and default as the validator has them, and what it is for from the comments beside the field
in the source (above it, or after it on its line). tests/unit/repo/test_examples.py holds the
committed file to this output, so a key added without a word fails the tests.

    python scripts/gen_inventory_reference.py            # rewrite the doc
    python scripts/gen_inventory_reference.py --check    # exit 1 when it is stale
"""

from __future__ import annotations

import inspect
import io
import re
import sys
import tokenize
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "inventory-reference.md"
sys.path.insert(0, str(ROOT))

from pdboot.inventory.schema import Inventory  # noqa: E402


def field_comments(model: type[BaseModel]) -> dict[str, str]:
    """Field name -> the comment lines right above it plus the one after it on its line,
    read from every class of the model's MRO that declares it (the nearest wins)."""
    found: dict[str, str] = {}
    for cls in reversed([c for c in model.__mro__ if issubclass(c, BaseModel)]):
        if cls is BaseModel or not inspect.get_annotations(cls):
            continue
        try:
            source = inspect.getsource(cls)
        except (OSError, TypeError):
            continue
        block: list[str] = []
        for line in source.splitlines()[1:]:
            text = line.strip()
            if text.startswith("#"):
                block.append(text.lstrip("# ").rstrip())
                continue
            name = text.split(":", 1)[0]
            if (
                line.startswith("    ")
                and not line.startswith("     ")
                and ":" in text
                and name.isidentifier()
            ):
                after = _trailing_comment(line)
                words = " ".join([*block, after]).strip()
                if name in inspect.get_annotations(cls):
                    found[name] = words or found.get(name, "")
            block = []
    return found


def _trailing_comment(line: str) -> str:
    try:
        for tok in tokenize.generate_tokens(io.StringIO(line.strip() + "\n").readline):
            if tok.type == tokenize.COMMENT:
                return tok.string.lstrip("# ").rstrip()
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return ""
    return ""


def _type(annotation: Any) -> str:
    """`int | None`, `list[str]`, `Literal['a', 'b']`, a section by its class name."""
    origin, args = get_origin(annotation), get_args(annotation)
    if annotation is type(None):
        return "None"
    if origin is None:
        return getattr(annotation, "__name__", str(annotation))
    if origin is Literal:
        return " \\| ".join(repr(a) for a in args)
    if origin in (Union, UnionType):
        return " \\| ".join(_type(a) for a in args)
    if origin is Annotated:
        return _type(args[0])
    name = getattr(origin, "__name__", str(origin))
    return f"{name}[{', '.join(_type(a) for a in args)}]"


def example_comments() -> dict[tuple[str, ...], str]:
    """Key path -> the words inventory.example.yaml says about it: its own comment and the
    continuation lines under it, else the comment block right above it; commented-out keys
    (`# key: value`) count as keys."""
    out: dict[tuple[str, ...], str] = {}
    stack: list[tuple[int, str]] = []
    last: tuple[str, ...] | None = None
    block: list[str] = []
    for raw in (ROOT / "inventory.example.yaml").read_text().splitlines():
        key = re.match(r"^(\s*)(#\s+)?([a-z_]+):(\s|$)", raw)
        if key:
            indent = len(key.group(1)) + (len(key.group(2)) - 2 if key.group(2) else 0)
            while stack and stack[-1][0] >= indent:
                stack.pop()
            stack.append((indent, key.group(3)))
            last = tuple(k for _, k in stack)
            rest = raw[key.end() :]
            out[last] = rest.split("# ", 1)[1].strip() if "# " in rest else " ".join(block)
            block = []
        elif last is not None and re.match(r"^\s{20,}#", raw):
            out[last] = (out[last] + " " + raw.strip().lstrip("#").strip()).strip()
        elif raw.strip().startswith("#"):
            block.append(raw.strip().lstrip("#").strip())
            last = None
        else:
            block, last = [], None
    return out


def _alike(path: tuple[str, ...], words: dict[tuple[str, ...], str]) -> str:
    """Words for a key the example shows only once: a host's ssh override as the ssh
    section's key, one tier's key as the other tier's."""
    if path[:1] == ("hosts",) and "ssh" in path:
        found = words.get(("ssh", path[-1]), "")
        return f"this host's own `ssh.{path[-1]}`" + (f" ({found})" if found else "")
    twin = {"prefill": "decode", "decode": "prefill"}.get(path[0]) if path else None
    return words.get((twin, *path[1:]), "") if twin else ""


def _default(field: Any) -> str:
    if field.default is PydanticUndefined and field.default_factory is None:
        return "required"
    value = field.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "(the section's defaults)"
    return f"`{value!r}`" if value not in (None, [], {}) else "none"


def _models(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    out: list[type[BaseModel]] = []
    for arg in get_args(annotation) if get_origin(annotation) is not None else ():
        out += _models(arg)
    return out


def sections(model: type[BaseModel], path: str, words: dict[tuple[str, ...], str]) -> list[str]:
    lines = [f"## `{path}`" if path else "## Top level", ""]
    doc = inspect.getdoc(model) or ""
    if doc and model.__doc__ and model.__module__.startswith("pdboot"):
        lines += [" ".join(doc.split()), ""]
    lines += ["| key | type | default | what it is |", "|---|---|---|---|"]
    comments = field_comments(model)
    nested: list[tuple[str, type[BaseModel]]] = []
    for name, field in model.model_fields.items():
        keypath = tuple(k for k in (*path.split("."), name) if k and k != "<host>")
        what = comments.get(name) or words.get(keypath, "") or _alike(keypath, words)
        if not what and _models(field.annotation):
            what = "a section: below"
        what = what.replace("|", "\\|")
        lines.append(f"| `{name}` | `{_type(field.annotation)}` | {_default(field)} | {what} |")
        for sub in _models(field.annotation):
            key = f"{path}.{name}" if path else name
            if sub.__name__ in ("Host",):
                key += ".<host>"
            nested.append((key, sub))
    lines.append("")
    seen: set[str] = set()
    for key, sub in nested:
        if key not in seen:
            seen.add(key)
            lines += sections(sub, key, words)
    return lines


def reference_text() -> str:
    head = [
        "# Inventory reference",
        "",
        "Generated from the inventory's models by `scripts/gen_inventory_reference.py` (the",
        "tests fail when it is stale): every key, its type and default as the validator has",
        "them, and what it is for. [inventory.md](inventory.md) explains them in prose,",
        "`inventory.example.yaml` shows them all, and `pdboot schema` prints the JSON Schema.",
        "Cross-key rules (ports per host, tensor parallel sizes, secrets) run at load and say",
        "`file:line: key: message`.",
        "",
    ]
    return "\n".join(head + sections(Inventory, "", example_comments())).rstrip() + "\n"


if __name__ == "__main__":
    text = reference_text()
    if "--check" in sys.argv[1:]:
        sys.exit(0 if OUT.exists() and OUT.read_text() == text else 1)
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)}")
