"""The fast tier (``python -m pytest -m "not slow"``, docs/testing.md) stays fast without
timing anything: a static scan of the test files finds every test that starts Ray or vLLM,
runs ``gspo`` in a fresh process or trains 50 steps or more, and asserts that it carries the
``slow`` marker. A new test of that kind that forgets the marker fails here instead of quietly
joining the fast tier.

What a test reaches is read from the source: its own body and decorators, the fixtures it
names and the module's helpers it calls, followed within its module. A module that requires
Ray or vLLM at import (a module-level ``pytest.importorskip``) is slow as a whole."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

MODULE_HEAVY = re.compile(r"""importorskip\(\s*["'](ray|vllm)["']|^pytestmark\s*=.*needs_vllm""")
"""Module-level statements that make every test of the module need Ray or vLLM."""

HEAVY = {
    "starts Ray": re.compile(
        r"\bstart_ray\(|\bray\.init\(|\bneeds_ray\b|\bray_session\b|^\s+import ray$", re.M
    ),
    "starts vLLM": re.compile(r"\bneeds_vllm\b|\bvllm_engine\(|\bVLLMEngine\("),
    "runs gspo in a fresh process": re.compile(r"""\bGSPO_SCRIPT\b|["']-m["'],\s*["']gspo\b"""),
    "trains 50 steps or more": re.compile(
        r"""(\bsteps=|["']--steps["'],\s*["'])([5-9]\d|\d{3,})\b"""
    ),
}
"""What makes a test slow, as it reads in a test's source (docs/testing.md, "The fast tier").
The tests' training runs of a few steps of the tiny models take a second or less in the
test's process; the same command in a fresh Python process imports torch and the CLI first
(seconds), and the learning runs (50-300 steps) take tens of seconds."""

FAST = {
    "test_ray_cluster.py::test_the_private_ray_a_run_starts_is_marked": "Ray is a stand-in",
    "test_progress.py::test_the_bars_show_the_average_rate_eta": "a progress bar, no run",
    "test_cli_parsing.py::test_help_and_argument_errors_are_quick": "--help, before torch",
    "test_cli_parsing.py::test_help_states_how_train_and_eval_defaults_differ": "--help",
    "test_vision_data.py::test_cli_refuses_a_missing_image_before_training": "refused first",
}
"""Tests that read as slow to the scan but start nothing: each with why."""


class Module:
    """One test file: the source of its module-level functions and assignments, by name, and
    the names each of them uses (read once: the scan runs in the fast tier)."""

    def __init__(self, path: Path):
        self.path = path
        text = path.read_text()
        self.lines = text.splitlines()
        tree = ast.parse(text)
        self.defs: dict[str, ast.FunctionDef] = {}
        self.source: dict[str, str] = {}  # with its decorators
        self.uses: dict[str, set[str]] = {}  # the words of its source: names, fixtures
        self.top_level: list[str] = []  # module statements other than functions and classes
        for node in tree.body:
            names = set(re.findall(r"\w+", self.segment(node)))  # as ast.walk, 10x cheaper
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                self.defs[node.name] = node
                self.source[node.name] = self.segment(node)
                self.uses[node.name] = names
            elif not isinstance(node, ast.ClassDef):
                self.top_level.append(self.segment(node))
                if isinstance(node, ast.Assign):
                    for target in node.targets:
                        if isinstance(target, ast.Name):
                            self.source[target.id] = self.segment(node)
                            self.uses[target.id] = names
        self.module_is_slow = any(
            re.match(r"pytestmark\s*=", s) and "mark.slow" in s for s in self.top_level
        )

    def segment(self, node: ast.AST) -> str:
        first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
        return "\n".join(self.lines[first - 1 : node.end_lineno])

    def tests(self) -> list[ast.FunctionDef]:
        return [node for name, node in self.defs.items() if name.startswith("test_")]

    def reach(self, test: ast.FunctionDef) -> str:
        """The source of the test with its decorators, and of the module's functions and
        constants it names (fixtures by argument name, helpers by call), transitively."""
        seen: set[str] = set()
        todo = [test.name]
        while todo:
            name = todo.pop()
            if name in seen or name not in self.source:
                continue
            seen.add(name)
            todo += self.uses[name]
        return "\n".join(self.source[name] for name in seen)

    def marked_slow(self, test: ast.FunctionDef) -> bool:
        """The marker on the module, on the test, or on its parameters (``pytest.param(...,
        marks=pytest.mark.slow)`` in a module-level list the decorator names)."""
        if self.module_is_slow:
            return True
        for decorator in test.decorator_list:
            text = "\n".join(self.lines[decorator.lineno - 1 : decorator.end_lineno])
            names = {n.id for n in ast.walk(decorator) if isinstance(n, ast.Name)}
            text += "".join(
                self.source[n] for n in names if n in self.source and n not in self.defs
            )
            if "mark.slow" in text:
                return True
        return False


def _modules() -> list[Module]:
    """The test files in which some pattern occurs at all (only they can hold a slow test)."""
    patterns = [MODULE_HEAVY, *HEAVY.values()]
    return [
        Module(p)
        for p in sorted(TESTS.glob("test_*.py"))
        if p.name != Path(__file__).name and any(x.search(p.read_text()) for x in patterns)
    ]


def unmarked_slow_tests(modules: list[Module]) -> list[str]:
    """``file::test (why)`` for each test that starts Ray or vLLM or trains, without the marker."""
    found = []
    for module in modules:
        heavy_module = any(MODULE_HEAVY.search(s) for s in module.top_level)
        if heavy_module and not module.module_is_slow:
            found.append(f"{module.path.name} (requires Ray or vLLM at import: pytestmark)")
            continue
        for test in module.tests():
            reach = module.reach(test)
            why = [what for what, pattern in HEAVY.items() if pattern.search(reach)]
            key = f"{module.path.name}::{test.name}"
            if why and key not in FAST and not module.marked_slow(test):
                found.append(f"{key} ({', '.join(why)})")
    return found


def test_every_test_that_starts_ray_or_vllm_or_trains_is_marked_slow():
    missing = unmarked_slow_tests(_modules())
    assert not missing, (
        "mark these @pytest.mark.slow (or the module: pytestmark = pytest.mark.slow) so that "
        '`pytest -m "not slow"` stays the fast tier:\n  ' + "\n  ".join(missing)
    )


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("def test_a():\n    ray = start_ray(None)\n", ["x.py::test_a (starts Ray)"]),
        ("import pytest\n\n@pytest.mark.slow\ndef test_a():\n    start_ray(None)\n", []),
        (
            "import pytest\npytestmark = pytest.mark.slow\n\ndef test_a():\n    start_ray(None)\n",
            [],
        ),
        (  # through a fixture of the module
            "import pytest\n\n@pytest.fixture\ndef engine():\n    return vllm_engine(m)\n\n"
            "def test_a(engine):\n    pass\n",
            ["x.py::test_a (starts vLLM)"],
        ),
        (  # through a helper of the module
            "def _run(p):\n    return run_sft(SFTConfig(output_dir=p, steps=150))\n\n"
            "def test_a(tmp_path):\n    _run(tmp_path)\n",
            ["x.py::test_a (trains 50 steps or more)"],
        ),
        ("def test_a(tmp_path):\n    main(['train', '--steps', '3'])\n", []),
        (
            "def test_a(tmp_path):\n    subprocess.run([sys.executable, '-m', 'gspo', 'train'])\n",
            ["x.py::test_a (runs gspo in a fresh process)"],
        ),
        (  # a marked parameter in a module-level list
            "import pytest\nE = ['torch', pytest.param('vllm', marks=[needs_vllm, pytest.mark.slow])]"
            "\n\n@pytest.mark.parametrize('name', E)\ndef test_a(name):\n    pass\n",
            [],
        ),
        (
            "import pytest\n\npytest.importorskip('ray')\n\ndef test_a():\n    pass\n",
            ["x.py (requires Ray or vLLM at import: pytestmark)"],
        ),
        ("def test_a():\n    assert 1 + 1 == 2\n", []),
    ],
)
def test_the_scan_finds_an_unmarked_slow_test(tmp_path, source, expected):
    path = tmp_path / "x.py"
    path.write_text(source)
    assert unmarked_slow_tests([Module(path)]) == expected
