"""An import-linter contract type that refuses any import cycle between modules (``.importlinter``
names it ``acyclic_modules``; ``lint-imports`` from the checkout root imports it from here).

import-linter's own ``acyclic_siblings`` compares the children of a package, each squashed with
its descendants, so a package's ``__init__`` is never one of the parties: a cycle through it
(``gspo.models`` importing ``gspo.models.vision``, which imported names back from
``gspo.models``) passed unseen. This contract looks at every module of the graph on its own,
``__init__`` modules included, function-local imports included (grimp reads them), and breaks on
any strongly connected group of two or more modules, or a module importing itself.
"""

from __future__ import annotations

from collections import deque
from itertools import pairwise

import grimp
from importlinter.application import output
from importlinter.domain.contract import Contract, ContractCheck


def module_cycles(graph: grimp.ImportGraph) -> list[tuple[list[str], list[str]]]:
    """``(group, cycle)`` for each strongly connected group of modules (every module of the group
    reaches every other through imports), sorted: the group's modules, and one cycle as
    ``[m, ..., m]``, the shortest import path from its alphabetically first module back to it."""
    successors = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    cycles = []
    for group in _strong_groups(successors):
        if len(group) == 1 and group[0] not in successors[group[0]]:
            continue
        cycles.append((group, _cycle_through(group[0], set(group), successors)))
    return sorted(cycles)


def _strong_groups(successors: dict[str, list[str]]) -> list[list[str]]:
    # Tarjan's algorithm, iterative: the gspo graph is shallow, but a recursion limit must not
    # decide whether a lint passes.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups = []
    for root in sorted(successors):
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            if i < len(successors[node]):
                work.append((node, i + 1))
                nxt = successors[node][i]
                if nxt not in index:
                    work.append((nxt, 0))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            if work:  # node is done: its caller inherits its low link
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                groups.append(sorted(group))
    return groups


def _cycle_through(start: str, group: set[str], successors: dict[str, list[str]]) -> list[str]:
    # Shortest path inside the group from start back to start (breadth first).
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for nxt in successors[node]:
            if nxt == start:
                path = [node]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return [start, *reversed(path[:-1]), start]
            if nxt in group and nxt not in came_from:
                came_from[nxt] = node
                queue.append(nxt)
    raise AssertionError(f"{start} is in a strongly connected group but on no cycle")


class AcyclicModulesContract(Contract):
    """No import cycle between any two modules of the root package (see the module docstring)."""

    type_name = "acyclic_modules"

    def check(self, graph: grimp.ImportGraph, verbose: bool) -> ContractCheck:
        cycles = module_cycles(graph)
        details = {}
        for _, cycle in cycles:
            for importer, imported in pairwise(cycle):
                found = graph.get_import_details(importer=importer, imported=imported)
                details[(importer, imported)] = [
                    f"l.{d['line_number']}: {d['line_contents']}" for d in found
                ]
        return ContractCheck(kept=not cycles, metadata={"cycles": cycles, "details": details})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for group, cycle in check.metadata["cycles"]:
            output.print_error(f"Import cycle among {len(group)} modules: {', '.join(group)}.")
            output.print_error(f"One of them: {' -> '.join(cycle)}", bold=False)
            for importer, imported in pairwise(cycle):
                lines = "; ".join(check.metadata["details"][(importer, imported)])
                output.print_error(f"- {importer} -> {imported} ({lines})", bold=False)
            output.new_line()
