"""Benchmark row layouts read as they are: HumanEval's ``test`` (a ``check(candidate)``
function) with its ``entry_point``, and MBPP's ``test_list`` with its setup code.

HumanEval's check functions start with ``assert True, "This prints if this assert fails..."``
lines (in 36 of 164) that test nothing; they are dropped, so a wrong solution scores 0 rather
than the share of those lines.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from typing import Any

SETUP_KEYS = ("setup", "preamble")
"""Row fields holding code run before the solution (imports it relies on), first one present."""


def _is_assert_true(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.Assert)
        and isinstance(node.test, ast.Constant)
        and node.test.value is True
    )


def _has_assert(node: ast.stmt) -> bool:
    return any(isinstance(n, ast.Assert) for n in ast.walk(node))


def humaneval_tests(test: str, entry_point: str) -> tuple[str, tuple[str, ...]]:
    """(test setup, tests) of a HumanEval ``test`` field for the function ``entry_point``.

    The test setup is the field's code outside ``check`` (``METADATA``, imports, helpers) and
    ``candidate = <entry_point>``; it runs after the solution. Each statement of ``check``'s
    body that holds an assert is one test (a loop of asserts is one test); statements without
    one (``import math``, ``rng = ...``) run with the next test, in the same namespace, so
    later tests see them. ``assert True`` lines are not tests.
    """
    if not isinstance(entry_point, str) or not entry_point.isidentifier():
        raise ValueError(f"meta['entry_point'] must be a function name, got {entry_point!r}")
    if not isinstance(test, str):
        raise ValueError(f"meta['test'] must be Python source, got {type(test).__name__}")
    try:
        tree = ast.parse(test)
    except SyntaxError as exc:
        raise ValueError(f"meta['test'] is not valid Python: {exc}") from None
    checks = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"]
    if not checks:
        raise ValueError("meta['test'] defines no check(candidate) function")
    check = checks[-1]
    argument = check.args.args[0].arg if check.args.args else "candidate"
    others = [ast.unparse(n) for n in tree.body if n is not check]
    setup = "\n".join([*others, f"{argument} = {entry_point}"])
    tests: list[str] = []
    pending: list[str] = []
    for node in check.body:
        if _is_assert_true(node):
            continue
        pending.append(ast.unparse(node))
        if _has_assert(node):
            tests.append("\n".join(pending))
            pending = []
    if pending and tests:
        tests[-1] += "\n" + "\n".join(pending)
    if not tests:
        raise ValueError("meta['test']: check() holds no assert besides 'assert True'")
    return setup, tuple(tests)


def mbpp_tests(meta: Mapping[str, Any]) -> tuple[str, ...]:
    """MBPP's ``test_list`` plus its ``challenge_test_list`` (often empty), assert strings."""
    tests: list[str] = []
    for key in ("test_list", "challenge_test_list"):
        value = meta.get(key)
        if value is None:
            continue
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
            raise ValueError(f"meta[{key!r}] must be a list of assert statements")
        tests += [t for t in value if t.strip()]
    if not tests:
        raise ValueError("meta['test_list'] is empty")
    return tuple(tests)


def mbpp_fixture(meta: Mapping[str, Any]) -> str:
    """MBPP's ``test_setup_code``: it builds the tests' objects from the solution's classes
    (``root = Node(1)`` in 367 and 927), so it runs after the solution, in its process."""
    value = meta.get("test_setup_code") or ""
    if not isinstance(value, str):
        raise ValueError("meta['test_setup_code'] must be Python source")
    return value


def prompt_preamble(prompt: str | None) -> str:
    """What of a HumanEval prompt runs before the solution: the whole prompt when it is Python
    (the signature stub with its imports and helpers, as HumanEval's own evaluation runs it),
    else its import lines (a prompt wrapped in instructions)."""
    if not prompt:
        return ""
    try:
        compile(prompt, "<prompt>", "exec")
        return prompt
    except (SyntaxError, ValueError):
        pass
    lines = [
        line
        for line in prompt.splitlines()
        if line.startswith(("import ", "from ")) and " import " in f" {line}"
    ]
    try:
        compile("\n".join(lines), "<prompt imports>", "exec")
    except (SyntaxError, ValueError):
        return ""
    return "\n".join(lines)


def row_setup(meta: Mapping[str, Any]) -> str | None:
    """The row's own setup code (:data:`SETUP_KEYS`), None when it has none."""
    for key in SETUP_KEYS:
        value = meta.get(key)
        if value is None or value == "":
            continue
        if not isinstance(value, str):
            raise ValueError(f"meta[{key!r}] must be Python source, got {type(value).__name__}")
        return value
    return None
