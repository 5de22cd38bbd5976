#!/usr/bin/env python3
"""Fail when the project's modules import each other in a cycle.

import-linter's contracts (pyproject.toml, ``lint-imports``) keep the layers apart; this
checks what they cannot: no cycle anywhere among our modules, ``TYPE_CHECKING`` imports
counted (a cycle hidden behind ``TYPE_CHECKING`` is still coupling both ways). A package's
``__init__`` counts as a module: a submodule importing its own package's ``__init__``,
which imports the submodule back, is a cycle too.
"""

from __future__ import annotations

import sys

import grimp

PACKAGES = ("hub", "protocol", "clients")


def cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph.modules):
        if root in index:
            continue
        work: list[tuple[str, list[str]]] = [(root, sorted(graph.find_modules_directly_imported_by(root)))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            if children:
                child = children.pop()
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, sorted(graph.find_modules_directly_imported_by(child))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def main() -> int:
    graph = grimp.build_graph(*PACKAGES, exclude_type_checking_imports=False)
    found = cycles(graph)
    for component in found:
        print("import cycle: " + " <-> ".join(component), file=sys.stderr)
    if not found:
        print(f"no import cycles among {len(graph.modules)} modules")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
