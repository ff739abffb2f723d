"""Import graphs for the layer and shape tests: what runs at import, and the cycles."""

from __future__ import annotations

import ast
from collections.abc import Mapping, Set


def cycles(graph: Mapping[str, Set[str]]) -> list[str]:
    """Each cycle a depth-first walk meets, as "a -> b -> a" (nodes in sorted order, so the
    report is the same every run)."""
    found: list[str] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for d in sorted(graph.get(node, ())):
            if state.get(d) == 1:
                found.append(" -> ".join([*path[path.index(d) :], d]))
            elif d not in state:
                visit(d, [*path, d])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return found


def typing_only_nodes(tree: ast.AST) -> set[int]:
    """The ids of the nodes under ``if TYPE_CHECKING:``: names imported there are no import
    at run time."""
    return {
        id(x)
        for n in ast.walk(tree)
        if isinstance(n, ast.If)
        and ast.unparse(n.test) in {"TYPE_CHECKING", "typing.TYPE_CHECKING"}
        for x in ast.walk(n)
    }
