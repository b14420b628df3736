"""What a sandboxed test run checks: the program in a completion (:func:`extract_code`) and
the unit tests of a problem (:class:`TestSuite`, read from ``Example.meta``: assert
statements, HumanEval's check function, MBPP's test list, stdin/stdout pairs or
LiveCodeBench-style functional cases)."""

from __future__ import annotations

import base64
import binascii
import dataclasses
import io
import json
import pickle
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gspo.sandbox.compare import check_mode
from gspo.sandbox.compare import loads as _loads
from gspo.sandbox.extract import extract_code
from gspo.sandbox.layouts import (
    humaneval_tests,
    mbpp_fixture,
    mbpp_tests,
    prompt_preamble,
    row_setup,
)

__all__ = ["TestSuite", "extract_code"]


def _decode_test_cases(value: Any, field_name: str) -> list[dict[str, Any]]:
    """LiveCodeBench-style test cases: a list, a JSON string, or base64(zlib(pickle(JSON)))."""
    if isinstance(value, list):
        cases = value
    elif isinstance(value, str):
        try:
            cases = json.loads(value)
        except json.JSONDecodeError:
            cases = json.loads(_unpickle_string(value, field_name))
    else:
        raise ValueError(f"meta[{field_name!r}] must be a list or a JSON string")
    if not isinstance(cases, list) or not all(
        isinstance(c, dict) and "input" in c and "output" in c for c in cases
    ):
        raise ValueError(f"meta[{field_name!r}] must be a list of {{'input', 'output'}} objects")
    return cases


def _unpickle_string(text: str, field_name: str) -> str:
    """Decode LiveCodeBench's compressed private tests without running pickle's code paths.

    They are base64(zlib(pickle(json_string))). An unpickler that resolves no global at all
    can only build plain values, so a hostile data file cannot execute code through it.
    """

    class _NoGlobals(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            raise pickle.UnpicklingError(f"refusing to load global {module}.{name}")

    try:
        raw = zlib.decompress(base64.b64decode(text, validate=False))
        value = _NoGlobals(io.BytesIO(raw)).load()
    except (binascii.Error, zlib.error, pickle.UnpicklingError, EOFError, ValueError) as exc:
        raise ValueError(
            f"meta[{field_name!r}] is neither JSON nor base64(zlib(pickle(JSON))): {exc}"
        ) from None
    if not isinstance(value, str):
        raise ValueError(f"meta[{field_name!r}] decodes to {type(value).__name__}, not a string")
    return value


def _output(value: Any) -> Any:
    """An expected stdout as the data gave it: numbers stay numbers (compared as numbers in
    the ``auto`` mode), everything else is text."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    return str(value)


@dataclass(frozen=True)
class TestSuite:
    """The unit tests of one problem, in one of three forms (see :meth:`from_meta`)."""

    kind: str
    """``assert`` (statements run after the solution), ``stdio`` (stdin -> expected stdout) or
    ``call`` (arguments -> expected return value of ``func_name``)."""
    cases: tuple[Any, ...]
    """Statements (assert), stdin texts (stdio) or argument lists (call)."""
    expected: tuple[Any, ...] = ()
    """Expected stdout (stdio: texts, or numbers where the data gave numbers) or return values
    (call); never sent into the sandbox."""
    func_name: str | None = None
    setup: str = ""
    """Code run before the solution, in its namespace (a row's ``setup`` / ``preamble``;
    HumanEval: the prompt's stub, imports and helpers). If it fails, every test fails."""
    fixture: str = ""
    """Code run after the solution, in its process and namespace (MBPP's ``test_setup_code``:
    objects built from the solution's classes, which the tests pass back as handles). If it
    fails, every test fails."""
    test_setup: str = ""
    """Code run after the solution and before the tests (assert kind; HumanEval: the test
    field outside ``check`` and ``candidate = <entry_point>``). If it fails, every test fails."""
    entry_point: str | None = None
    """HumanEval's function under test: the tests call the solution's, whatever the setup
    (the prompt) defines under that name; the setup's other names stay the tests' own."""
    compare: str | None = None
    """The row's comparison mode (``meta["compare"]``: auto, text or number); None: the
    task's (``code_reward(compare=...)``)."""

    __test__ = False  # not a pytest class

    def __len__(self) -> int:
        return len(self.cases)

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any], prompt: str | None = None) -> TestSuite:
        """Read the tests from ``Example.meta``; ValueError if there are none or they are bad.

        Accepted layouts, first match wins:

        * ``tests``: a list of Python statements (usually ``assert f(2) == 4``), each one test,
          run in the namespace the solution defined;
        * HumanEval: ``test`` (source defining ``check(candidate)``) and ``entry_point``; each
          assert of ``check`` is one test, ``assert True`` lines are not tests
          (:func:`~gspo.sandbox.layouts.humaneval_tests`); without a setup field, the
          ``prompt`` (the example's) runs first when it is Python, else its import lines;
        * MBPP: ``test_list`` (assert strings) plus ``challenge_test_list``;
        * ``inputs`` and ``outputs``: equal-length lists of stdin texts and expected stdout;
        * ``test_cases``, or LiveCodeBench's ``public_test_cases`` + ``private_test_cases``: a
          list (or JSON string) of ``{"input", "output", "testtype"}`` objects. ``testtype``
          ``stdin`` compares stdout; ``functional`` calls ``func_name`` (from
          ``meta["func_name"]`` or the JSON ``meta["metadata"]``) on the JSON values of the
          input's lines, on ``Solution()`` if the code defines that class (LeetCode style),
          and compares the return value with the JSON output.

        Any layout may add a setup field (``setup`` or ``preamble``: code run before the
        solution; MBPP's ``test_setup_code`` runs after it, in its process) and ``compare``
        (the comparison mode of :mod:`~gspo.sandbox.compare`).
        """
        suite = cls._tests_from_meta(meta, prompt)
        compare = meta.get("compare")
        if compare is not None and compare != "":
            try:
                compare = check_mode(compare)
            except ValueError as exc:
                raise ValueError(f"meta['compare']: {exc}") from None
        else:
            compare = None
        setup = row_setup(meta)
        if setup is None:
            setup = suite.setup
        return dataclasses.replace(suite, setup=setup, compare=compare)

    @classmethod
    def _tests_from_meta(cls, meta: Mapping[str, Any], prompt: str | None) -> TestSuite:
        if "tests" in meta:
            tests = meta["tests"]
            if isinstance(tests, str):
                tests = [tests]
            if not isinstance(tests, list) or not all(isinstance(t, str) for t in tests):
                raise ValueError("meta['tests'] must be a list of Python statements")
            if not tests:
                raise ValueError("meta['tests'] is empty")
            return cls("assert", tuple(tests))
        if "test" in meta and "entry_point" in meta:
            test_setup, tests = humaneval_tests(meta["test"], meta["entry_point"])
            preamble = prompt_preamble(meta.get("prompt", prompt))
            return cls(
                "assert",
                tests,
                setup=preamble,
                test_setup=test_setup,
                entry_point=meta["entry_point"],
            )
        if "test_list" in meta:
            return cls("assert", mbpp_tests(meta), fixture=mbpp_fixture(meta))
        if "inputs" in meta or "outputs" in meta:
            inputs, outputs = meta.get("inputs"), meta.get("outputs")
            if not (isinstance(inputs, list) and isinstance(outputs, list)):
                raise ValueError("meta['inputs'] and meta['outputs'] must both be lists")
            if len(inputs) != len(outputs) or not inputs:
                raise ValueError(
                    f"meta['inputs'] ({len(inputs)}) and meta['outputs'] ({len(outputs)}) "
                    "must be non-empty and of equal length"
                )
            return cls("stdio", tuple(map(str, inputs)), tuple(map(_output, outputs)))
        keys = [k for k in ("test_cases", "public_test_cases", "private_test_cases") if k in meta]
        if not keys:
            raise ValueError(
                "no tests in example.meta: expected 'tests', 'test' + 'entry_point' (HumanEval), "
                "'test_list' (MBPP), 'inputs'/'outputs' or 'test_cases' (have: "
                f"{', '.join(map(str, meta)) or 'nothing'})"
            )
        cases = [c for k in keys if meta[k] for c in _decode_test_cases(meta[k], k)]
        if not cases:
            raise ValueError(f"{' and '.join(keys)} hold no test cases")
        types = {str(c.get("testtype", "stdin")) for c in cases}
        if len(types) != 1 or not types <= {"stdin", "functional"}:
            raise ValueError(f"test cases must all be 'stdin' or all 'functional', got {types}")
        if types == {"stdin"}:
            return cls(
                "stdio",
                tuple(str(c["input"]) for c in cases),
                tuple(str(c["output"]) for c in cases),
            )
        func_name = meta.get("func_name")
        if func_name is None and meta.get("metadata"):
            metadata = meta["metadata"]
            metadata = json.loads(metadata) if isinstance(metadata, str) else metadata
            func_name = metadata.get("func_name") if isinstance(metadata, dict) else None
        if not isinstance(func_name, str) or not func_name.isidentifier():
            raise ValueError("functional test cases need meta['func_name'] (or metadata.func_name)")
        try:
            args = tuple(
                [_loads(line) for line in str(c["input"]).split("\n") if line.strip()]
                for c in cases
            )
            expected = tuple(_loads(str(c["output"])) for c in cases)
        except (ValueError, RecursionError, ArithmeticError) as exc:
            raise ValueError(f"functional test case is not JSON: {exc}") from None
        return cls("call", args, expected, func_name)
