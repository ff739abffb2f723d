"""Loading an inventory: YAML (with ``yamlsafe``'s caps) -> the strict models of ``schema`` ->
the cross-field ``rules``; every error mapped back to ``file:line: key.path: message``, all
errors at once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from pdboot.inventory import yamlsafe
from pdboot.inventory.kv_schema import KV_TRANSFER_FIELDS, KV_TRANSFER_PDBOOT_KEYS
from pdboot.inventory.localfiles import NotRegularFile, read_regular_file
from pdboot.inventory.rules import suggest, validate_rules
from pdboot.inventory.schema import Inventory


@dataclass(frozen=True)
class InventoryIssue:
    """One problem, located: rendered as ``file:line: key.path: message``."""

    path: tuple[str | int, ...]
    message: str
    line: int | None = None
    file: str = "inventory"

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        key = _dotted(self.path)
        return f"{where}: {key}: {self.message}" if key else f"{where}: {self.message}"


class InventoryError(Exception):
    """All problems found in an inventory. ``str()`` lists them one per line."""

    def __init__(self, issues: list[InventoryIssue]) -> None:
        self.issues = issues
        super().__init__("\n".join(str(i) for i in issues))


def _dotted(path: tuple[str | int, ...]) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


# --------------------------------------------------------------------------- loading


class _LineIndex:
    """Maps a key path to the line of the YAML node that defines it (1-based)."""

    def __init__(self, root: yaml.Node | None) -> None:
        self.root = root

    def line(self, path: tuple[str | int, ...]) -> int | None:
        node = self.root
        best = node.start_mark.line + 1 if node is not None else None
        for part in path:
            if node is None:
                break
            nxt: yaml.Node | None = None
            if isinstance(node, yaml.MappingNode):
                for k, v in node.value:
                    if isinstance(k, yaml.ScalarNode) and k.value == str(part):
                        nxt = v
                        best = k.start_mark.line + 1
                        break
            elif (
                isinstance(node, yaml.SequenceNode)
                and isinstance(part, int)
                and 0 <= part < len(node.value)
            ):
                nxt = node.value[part]
                best = nxt.start_mark.line + 1
            node = nxt
        return best


def _known_fields(model: type[BaseModel], path: tuple[str | int, ...]) -> list[str]:
    """Field names valid at the parent of ``path``, for 'did you mean' suggestions."""
    current: Any = model
    for part in path[:-1]:
        if isinstance(part, int):
            continue
        if isinstance(current, tuple):  # a dict of models: this part is a key
            current = current[1]
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return []
        field = current.model_fields.get(str(part))
        if field is None:
            return []
        ann = field.annotation
        if getattr(ann, "__origin__", None) is dict:
            current = ("dict", _unwrap_model(ann))
        else:
            current = _unwrap_model(ann)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


def _unwrap_model(ann: Any) -> Any:
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ann
    for a in getattr(ann, "__args__", ()):
        m = _unwrap_model(a)
        if m is not None:
            return m
    return None


_TAG = re.compile(r"[a-z][a-z_-]*\[.*\]")


def _pydantic_issues(exc: ValidationError, index: _LineIndex, file: str) -> list[InventoryIssue]:
    issues: list[InventoryIssue] = []
    for err in exc.errors():
        # pydantic adds validator tags such as `list[int]` or `function-after[...]`
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and _TAG.fullmatch(p)))
        # pydantic adds the union member name for `"all" | list[int]`; drop such tags
        loc = tuple(p for p in loc if p not in _UNION_TAGS)
        etype = err["type"]
        if etype == "extra_forbidden":
            key = str(loc[-1]) if loc else "?"
            msg = _unknown_key_message(key, loc)
        elif etype == "missing":
            msg = "required key is missing"
        else:
            msg = human_message(err)
        issues.append(InventoryIssue(loc, msg, index.line(loc), file))
    # one message per key path (unions can report the same path twice)
    seen: set[tuple[tuple[str | int, ...], str]] = set()
    unique = []
    for i in issues:
        if (i.path, i.message) not in seen:
            seen.add((i.path, i.message))
            unique.append(i)
    return unique


# pydantic's words for a pattern are the regex itself: an operator reads what the key takes.
_PATTERN_WORDS = {
    "^[a-z0-9][a-z0-9_-]{0,62}$": (
        "must be lower-case letters, digits, - and _ (starting with a letter or digit), "
        "at most 63 characters"
    ),
    "^[0-9]{1,4}(\\.[0-9]{1,4}){0,2}$": "must be a version such as 13.0 or 580.65.06",
    "^[A-Za-z0-9][A-Za-z0-9._/-]{0,199}$": "must be a branch, tag or commit name",
    "^[A-Za-z0-9_:,.-]+$": "must be a comma-separated list such as mlx5_0:1,mlx5_1:1",
    "^\\^?[A-Za-z0-9_:,.-]+$": "must be UCX transports such as rc,cuda_copy (^ to exclude)",
    "^[A-Za-z_][A-Za-z0-9_]*(\\.[A-Za-z_][A-Za-z0-9_]*)*$": (
        "must be a Python module path such as my_pkg.connectors"
    ),
    "^[0-9A-Fa-f.:]{2,45}$": "must be an IP address (IPv4 or IPv6) of the router host",
    "^https?://[A-Za-z0-9.:\\[\\]_-]+(/\\S*)?$": "must be a URL such as https://hf.example.com",
}
_TYPE_WORDS = {
    "dict_type": "must be a mapping (indented key: value lines)",
    "model_type": "must be a mapping (indented key: value lines)",
    "model_attributes_type": "must be a mapping (indented key: value lines)",
    "list_type": "must be a list (lines starting with -, or [a, b])",
    "int_type": "must be a whole number (an integer)",
    "int_parsing": "must be a whole number (an integer)",
    "int_from_float": "must be a whole number (an integer)",
    "float_type": "must be a valid number",
    "float_parsing": "must be a valid number",
    "bool_type": "must be true or false",
    "bool_parsing": "must be true or false",
    "string_type": "must be a string (quote it if YAML reads it as something else)",
}


def human_message(err: Any) -> str:
    """pydantic's message in the inventory's words: what the key takes, never a regex or a
    model's class name."""
    etype, msg = err["type"], str(err["msg"])
    if etype == "string_pattern_mismatch":
        pattern = str((err.get("ctx") or {}).get("pattern", ""))
        return _PATTERN_WORDS.get(pattern, "has characters this key does not take")
    if etype in _TYPE_WORDS:
        return _TYPE_WORDS[etype]
    if msg.startswith("Value error, "):
        return msg[len("Value error, ") :]
    if msg.startswith("Input should be "):
        return "must be " + msg[len("Input should be ") :]
    if msg.startswith("String should have "):
        return "must have " + msg[len("String should have ") :]
    if msg.startswith("List should have "):
        return "must have " + msg[len("List should have ") :]
    return msg


_UNION_TAGS = ("literal['all']", "list[int]", "list[list[int]]", "int", "constrained-int")

_KV_REJECTED_BY_VLLM = {
    "kv_rank": "from the old P2P/PyNccl connectors",
    "kv_parallel_size": "from the old P2P/PyNccl connectors",
    "kv_ip": "from the old P2P/PyNccl connectors; NIXL uses VLLM_NIXL_SIDE_CHANNEL_HOST",
    "kv_buffer_size": "from the old P2P/PyNccl connectors",
}


def _unknown_key_message(key: str, loc: tuple[str | int, ...]) -> str:
    if len(loc) == 2 and loc[0] == "kv_transfer":
        if key == "kv_role":
            return (
                "kv_role is set by pdboot per tier (kv_producer for prefill, "
                "kv_consumer for decode) and cannot be set by hand"
            )
        if key == "engine_id":
            return "engine_id is left to vLLM, which gives every engine its own; remove it"
        why = _KV_REJECTED_BY_VLLM.get(key)
        known = list(KV_TRANSFER_FIELDS) + list(KV_TRANSFER_PDBOOT_KEYS)
        base = (
            f"unknown key {key!r}: not a field of vLLM's KVTransferConfig, "
            "which forbids extra fields (vLLM would refuse to start)"
        )
        if why:
            return f"{base}; {key} is {why}"
        return base + suggest(key, known)
    return f"unknown key {key!r}" + suggest(key, _known_fields(Inventory, loc))


def parse_inventory(text: str, file: str = "inventory.yaml") -> Inventory:
    """Parse and validate inventory text. Raises InventoryError with every problem."""
    if len(text) > MAX_INVENTORY_BYTES:
        raise InventoryError([InventoryIssue((), _TOO_BIG, 1, file)])
    root, data = _load_yaml(text, file)
    if data is None:
        raise InventoryError([InventoryIssue((), "the inventory is empty", 1, file)])
    if not isinstance(data, dict):
        raise InventoryError([InventoryIssue((), "the inventory must be a YAML mapping", 1, file)])
    dups = _duplicate_keys(root, (), file)
    if dups:
        raise InventoryError(dups)
    index = _LineIndex(root)
    bad = [InventoryIssue(p, m, index.line(p), file) for p, m in yamlsafe.plain_values(data)]
    if bad:
        raise InventoryError(bad)
    try:
        inv = Inventory.model_validate(data)
    except ValidationError as e:
        raise InventoryError(_pydantic_issues(e, index, file)) from None
    issues = [InventoryIssue(p, m, index.line(p), file) for p, m in validate_rules(inv)]
    if issues:
        raise InventoryError(issues)
    return inv


def _load_yaml(text: str, file: str) -> tuple[yaml.Node | None, Any]:
    """The node tree (for lines) and the data, through the capped loader."""
    try:
        root, data = yamlsafe.load(text)
    except yaml.YAMLError as e:
        raise InventoryError(
            [InventoryIssue((), _yaml_message(e), yamlsafe.error_line(e, text), file)]
        ) from None
    return root, data


def _yaml_message(e: yaml.YAMLError) -> str:
    """One line (PyYAML's own text spans several and quotes the source)."""
    problem = getattr(e, "problem", None)
    context = getattr(e, "context", None)
    if problem is None:
        return f"not valid YAML: {' '.join(str(e).split())}"
    return f"not valid YAML: {problem}" + (f" ({context})" if context else "")


def _duplicate_keys(
    node: yaml.Node | None, path: tuple[str | int, ...], file: str
) -> list[InventoryIssue]:
    """PyYAML silently keeps the last of two equal keys; an inventory must not."""
    out: list[InventoryIssue] = []
    if isinstance(node, yaml.MappingNode):
        first: dict[str, int] = {}
        for k, v in node.value:
            key = str(k.value) if isinstance(k, yaml.ScalarNode) else None
            line = k.start_mark.line + 1
            if key is not None and key in first:
                out.append(
                    InventoryIssue(
                        (*path, key), f"duplicate key (first set on line {first[key]})", line, file
                    )
                )
            elif key is not None:
                first[key] = line
            out += _duplicate_keys(v, (*path, key if key is not None else "?"), file)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            out += _duplicate_keys(item, (*path, i), file)
    return out


MAX_INVENTORY_BYTES = 1 << 20
_TOO_BIG = f"the inventory is larger than {MAX_INVENTORY_BYTES >> 20} MiB; is this the right file?"


def load_inventory(path: str | Path) -> Inventory:
    p = Path(path)
    try:
        raw = read_regular_file(p, MAX_INVENTORY_BYTES + 1)
    except NotRegularFile as e:
        why = f"cannot read: {e}; give the inventory file's path"
        issue = InventoryIssue((), why, None, str(p))
        raise InventoryError([issue]) from None
    except OSError as e:
        # no line: there is no text (a missing file, a directory, no permission)
        issue = InventoryIssue((), f"cannot read: {e.strerror}", None, str(p))
        raise InventoryError([issue]) from None
    if len(raw) > MAX_INVENTORY_BYTES:
        raise InventoryError([InventoryIssue((), _TOO_BIG, 1, str(p))])
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise InventoryError(
            [InventoryIssue((), f"not UTF-8 text ({e.reason} at byte {e.start})", line, str(p))]
        ) from None
    return parse_inventory(text, file=str(path))


def key_lines(file: str | Path, paths: list[tuple[str | int, ...]]) -> list[int | None]:
    """The line of each key path in an inventory file that loaded (for a refusal made after
    loading, such as an example's address); None each where the file cannot be read again."""
    try:
        text = read_regular_file(Path(file), MAX_INVENTORY_BYTES + 1).decode("utf-8")
        root, _ = yamlsafe.load(text)
    except (OSError, NotRegularFile, UnicodeDecodeError, yaml.YAMLError):
        return [None for _ in paths]
    index = _LineIndex(root)
    return [index.line(p) for p in paths]
