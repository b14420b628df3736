"""The ``acyclic_modules`` import contract (scripts/import_cycles.py, run by ``lint-imports``):
it breaks on a cycle through a package's ``__init__``, which import-linter's ``acyclic_siblings``
lets pass, and on a cycle between siblings."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("importlinter", reason="needs import-linter (the test extra)")
grimp = pytest.importorskip("grimp", reason="needs grimp (installed with import-linter)")

from importlinter import configuration  # noqa: E402
from importlinter.contracts.acyclic_siblings import AcyclicSiblingsContract  # noqa: E402

configuration.configure()  # as lint-imports does: acyclic_siblings times itself with its clock

_PATH = Path(__file__).resolve().parents[1] / "scripts" / "import_cycles.py"
_SPEC = importlib.util.spec_from_file_location("import_cycles", _PATH)
import_cycles = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(import_cycles)


def _graph(*imports: tuple[str, str]) -> grimp.ImportGraph:
    graph = grimp.ImportGraph()
    for module in ("pkg", "pkg.a", "pkg.b", "pkg.c"):
        graph.add_module(module)
    for importer, imported in imports:
        graph.add_import(importer=importer, imported=imported, line_number=1, line_contents="x")
    return graph


def _check(contract_class, graph, **options):
    return contract_class("c", session_options={}, contract_options=options).check(graph, False)


def test_a_cycle_through_the_parent_init_breaks_it_where_acyclic_siblings_keeps():
    # As gspo.models was: the package re-exports a child (pkg -> pkg.a), a child's child imports
    # names from the package (pkg.b -> pkg).
    graph = _graph(("pkg", "pkg.a"), ("pkg.a", "pkg.b"), ("pkg.b", "pkg"))
    assert _check(AcyclicSiblingsContract, graph, ancestors=["pkg"]).kept
    check = _check(import_cycles.AcyclicModulesContract, graph)
    assert not check.kept
    assert check.metadata["cycles"] == [
        (["pkg", "pkg.a", "pkg.b"], ["pkg", "pkg.a", "pkg.b", "pkg"])
    ]


def test_a_sibling_cycle_breaks_it():
    graph = _graph(("pkg.a", "pkg.b"), ("pkg.b", "pkg.c"), ("pkg.c", "pkg.a"))
    check = _check(import_cycles.AcyclicModulesContract, graph)
    assert [cycle for _, cycle in check.metadata["cycles"]] == [
        ["pkg.a", "pkg.b", "pkg.c", "pkg.a"]
    ]


def test_an_acyclic_graph_keeps_it():
    # The package re-exports its children and the children import one another one way only.
    graph = _graph(("pkg", "pkg.a"), ("pkg", "pkg.b"), ("pkg.a", "pkg.b"), ("pkg.b", "pkg.c"))
    assert _check(import_cycles.AcyclicModulesContract, graph).kept
