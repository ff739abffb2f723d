"""A YAML loader that no inventory can make hang, recurse or eat the memory.

PyYAML's SafeLoader composes recursively (500 nested ``[`` is a RecursionError), shares
aliased nodes (a few hundred bytes of nested aliases expand to millions of values once
something walks them: a "billion laughs"), accepts ``x: &a [*a]`` (a list containing
itself) and converts digits of any length to int (Python refuses above 4,300 digits).
Here depth, aliases and the expanded size are capped while composing, before any value
is built, and ``plain_values`` refuses what JSON and Compose cannot carry.
"""

from __future__ import annotations

import datetime
import math
import re
from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.constructor import ConstructorError

MAX_DEPTH = 32  # an inventory is 5 levels deep; kv_connector_extra_config gets the rest
MAX_ALIASES = 200
MAX_NODES = 20_000  # values after expanding aliases; a full inventory has ~200
MAX_INT_DIGITS = 40  # past any int64 (19 digits); the range check comes later

Path = tuple[str | int, ...]


class _Loader(yaml.SafeLoader):
    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise _refuse(f"more than {MAX_ALIASES} aliases", self._mark())
            return super().compose_node(parent, index)
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _refuse(f"nested deeper than {MAX_DEPTH} levels", self._mark())
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def _mark(self) -> Any:
        return self.peek_event().start_mark  # type: ignore[no-untyped-call]

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        if sum(c.isdigit() for c in str(node.value)) > MAX_INT_DIGITS:
            raise ConstructorError(
                None, None, f"an integer of more than {MAX_INT_DIGITS} digits", node.start_mark
            )
        value: int = super().construct_yaml_int(node)
        return value


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)
# YAML 1.1 reads 1e10 (no dot) as text; an operator means the number, so the bound on the
# key applies (and 1e999, infinite, is refused as such) instead of "not a valid number".
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9]+[eE][-+]?[0-9]+$"), list("-+0123456789")
)


def load(text: str) -> tuple[yaml.Node | None, Any]:
    """(root node, data). Raises yaml.YAMLError (with a mark) for anything refused."""
    loader = _Loader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return None, None
        _check_graph(root)
        return root, loader.construct_document(root)
    finally:
        loader.dispose()


def _refuse(message: str, mark: Any) -> ComposerError:
    return ComposerError(None, None, message, mark)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _check_graph(root: yaml.Node) -> None:
    """Expanded size and depth of the node graph (aliases share nodes), in time linear in
    the graph, with recursion bounded by MAX_DEPTH; a node inside itself is refused."""
    memo: dict[int, tuple[int, int]] = {}  # id -> (expanded size, height)
    active: set[int] = set()
    too_deep = f"nested deeper than {MAX_DEPTH} levels (through aliases)"

    def walk(node: yaml.Node, depth: int) -> tuple[int, int]:
        key, mark = id(node), node.start_mark
        if key in active:
            raise _refuse("an alias refers to a node that contains it (recursive alias)", mark)
        if key not in memo:
            if depth > MAX_DEPTH:
                raise _refuse(too_deep, mark)
            active.add(key)
            size, height = 1, 0
            for child in _children(node):
                s, h = walk(child, depth + 1)
                size, height = size + s, max(height, h + 1)
                if size > MAX_NODES:
                    raise _refuse(f"expands to more than {MAX_NODES} values (aliases)", mark)
            active.discard(key)
            memo[key] = (size, height)
        size, height = memo[key]
        if depth + height > MAX_DEPTH:
            raise _refuse(too_deep, mark)
        return size, height

    walk(root, 1)


def error_line(e: yaml.YAMLError, text: str) -> int:
    """1-based line of a YAML error; 1 when PyYAML gives no position."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    if mark is not None:
        return int(mark.line) + 1
    position = getattr(e, "position", None)  # ReaderError: a character offset
    if isinstance(position, int):
        return text[:position].count("\n") + 1
    return 1


_KINDS = (
    (datetime.date, "a date or time (quote it to make it text)"),
    (set, "a set (!!set)"),
    (bytes, "binary data (!!binary)"),
)


def plain_values(data: Any, path: Path = ()) -> list[tuple[Path, str]]:
    """What JSON, Compose and a shell can carry: mappings with text keys, lists, text
    without control characters, booleans, null, int64 and finite numbers."""
    if isinstance(data, dict):
        out: list[tuple[Path, str]] = []
        for k, v in data.items():
            if not isinstance(k, str):
                out.append(((*path, str(k)), f"keys must be text, not {_kind(k)}"))
            else:
                out += plain_values(v, (*path, k))
        return out
    if isinstance(data, list):
        return [issue for i, v in enumerate(data) for issue in plain_values(v, (*path, i))]
    problem = _scalar_problem(data)
    return [(path, problem)] if problem else []


def _scalar_problem(v: Any) -> str | None:
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, str):
        bad = next((c for c in v if (ord(c) < 32 and c not in "\t\n\r") or c == "\x7f"), None)
        if bad is None:
            return None
        what = "a NUL character" if bad == "\0" else f"control character U+{ord(bad):04X}"
        return f"contains {what}"
    if isinstance(v, int):
        return None if -(2**63) <= v < 2**63 else "integer out of range (64-bit)"
    if isinstance(v, float):
        return None if math.isfinite(v) else f"{v} is not a finite number"
    return f"{_kind(v)} is not allowed here"


def _kind(v: Any) -> str:
    for t, name in _KINDS:
        if isinstance(v, t):
            return name
    return type(v).__name__
