"""The built-in GSM8K-like word problems, math-verify rewards on them, and GSM8K / MATH files."""

from __future__ import annotations

import json
import re

import pytest

from gspo.envs.rewards import combine, format_reward, math_verify_match
from gspo.envs.tasks import DIFFICULTIES, TASKS, DataError, load_examples, make_file_task, make_task
from gspo.envs.tasks.base import Example
from gspo.envs.tasks.word_problems import INSTRUCTION, MAX_VALUE


@pytest.fixture(scope="module")
def tasks():
    return {
        d: make_task("word_problems", n_train=300, n_test=60, difficulty=d) for d in (1, 2, 3, 4)
    }


def _replay(example: Example) -> int:
    """Recompute the answer from the demo's arithmetic lines ("12 + 7 = 19")."""
    value = None
    for line in example.meta["steps"]:
        a, op, b, _, c = line.split()
        a, b, c = int(a), int(b), int(c)
        expected = {"+": a + b, "-": a - b, "x": a * b, "/": a // b}[op]
        assert c == expected, line
        if op == "/":
            assert a % b == 0, line
        assert value is None or a == value, "each step starts from the previous result"
        value = c
    return value


def test_registered_with_difficulty_range():
    assert "word_problems" in TASKS
    assert DIFFICULTIES["word_problems"] == (1, 2, 4)
    with pytest.raises(ValueError, match=r"\[1, 4\]"):
        make_task("word_problems", n_train=1, n_test=1, difficulty=5)


@pytest.mark.parametrize("difficulty", [1, 2, 3, 4])
def test_problems_are_verifiable(tasks, difficulty):
    task = tasks[difficulty]
    assert len(task.train) == 300 and len(task.test) == 60
    for ex in task.train[:50] + task.test:
        assert ex.meta["difficulty"] == difficulty
        assert len(ex.meta["steps"]) == difficulty
        assert ex.prompt.endswith(INSTRUCTION)
        assert "How many" in ex.prompt
        # Every intermediate value is a positive integer within range, and the answer follows.
        assert _replay(ex) == int(ex.answer)
        assert all(0 < int(v) <= MAX_VALUE for v in re.findall(r"= (\d+)", ex.demo))
        # The reference demo earns the full reward; the format reward sees its box.
        assert task.reward(ex.demo, ex) == 1.0
        assert format_reward(ex.demo) == 1.0


def test_splits_disjoint_by_arithmetic_and_deterministic(tasks):
    for task in tasks.values():
        train = {ex.meta["arithmetic"] for ex in task.train}
        test = {ex.meta["arithmetic"] for ex in task.test}
        assert not train & test  # not even under other names or objects
        assert len({ex.prompt for ex in task.test}) == len(task.test)
    again = make_task("word_problems", n_train=300, n_test=60, difficulty=2)
    assert [e.prompt for e in again.test] == [e.prompt for e in tasks[2].test]
    # The test split does not depend on how many training problems are drawn.
    other = make_task("word_problems", n_train=10, n_test=60, difficulty=2)
    assert [e.prompt for e in other.test] == [e.prompt for e in tasks[2].test]
    seeded = make_task("word_problems", n_train=10, n_test=60, difficulty=2, seed=1)
    assert [e.prompt for e in seeded.test] != [e.prompt for e in tasks[2].test]


# --------------------------------------------------------------------------- math-verify rewards


EX = Example(prompt="p", answer="14")


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("12 + 7 = 19\n19 - 5 = 14\nThe answer is \\boxed{14}.", 1.0),
        ("\\boxed{14.0}", 1.0),  # equivalent forms
        ("\\boxed{\\frac{28}{2}}", 1.0),
        ("\\boxed{14} dollars", 1.0),
        ("The answer is 14.\n#### 14", 1.0),
        ("\\boxed{13}", 0.0),  # wrong
        ("first \\boxed{14}, no wait: \\boxed{15}", 0.0),  # the last box counts
        ("The answer is 14.", 0.0),  # no box, no ####: no answer
        ("", 0.0),
        ("\\boxed{}", 0.0),
        ("\\boxed{14", 0.0),  # unclosed
    ],
)
def test_math_verify_cases(completion, expected):
    assert math_verify_match(completion, EX) == expected


def test_math_verify_fractions_and_latex():
    half = Example(prompt="p", answer="\\frac{1}{2}")
    for text in ("\\boxed{0.5}", "\\boxed{1/2}", "\\boxed{\\dfrac{1}{2}}"):
        assert math_verify_match(text, half) == 1.0, text
    assert math_verify_match("\\boxed{0.25}", half) == 0.0
    # A GSM8K-style reference solution is reduced to its final answer.
    gsm = Example(prompt="p", answer="She has 12 + 60 = 72 apples.\n#### 72")
    assert math_verify_match("\\boxed{72}", gsm) == 1.0
    assert math_verify_match("\\boxed{12}", gsm) == 0.0


def test_combined_correctness_and_format():
    reward = combine((math_verify_match, 1.0), (format_reward, 0.1))
    assert reward("\\boxed{14}", EX) == pytest.approx(1.1)
    assert reward("\\boxed{13}", EX) == pytest.approx(0.1)
    assert reward("14", EX) == 0.0


# --------------------------------------------------------------------------- GSM8K / MATH files


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_gsm8k_file(tmp_path):
    rows = [
        {
            "question": "Tom has 3 boxes of 4 pens. How many pens?",
            "answer": "3 * 4 = <<3*4=12>>12\n#### 12",
        },
        {"question": "What is 1,000 + 234?", "answer": "1,000 + 234 = 1,234\n#### 1,234"},
    ]
    path = _write_jsonl(tmp_path / "gsm8k.jsonl", rows)
    examples = load_examples(path, prompt_key="question", answer_format="gsm8k")
    assert [e.answer for e in examples] == ["12", "1,234"]
    assert examples[0].meta["solution"] == rows[0]["answer"]
    task = make_file_task(path, path, "math_verify", prompt_key="question", answer_format="gsm8k")
    assert task.reward("so \\boxed{12}", task.train[0]) == 1.0
    assert task.reward("\\boxed{1234}", task.train[1]) == 1.0


def test_gsm8k_row_without_marker_names_file_row_and_field(tmp_path):
    rows = [
        {"question": "q1", "answer": "#### 5"},
        {"question": "q2", "answer": "no final answer here"},
    ]
    path = _write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(
        DataError, match=r"bad\.jsonl row 1 \(line 2\): field 'answer' has no '####"
    ):
        load_examples(path, prompt_key="question", answer_format="gsm8k")
    skipped: list[str] = []
    kept = load_examples(
        path, prompt_key="question", answer_format="gsm8k", on_error="skip", skipped=skipped
    )
    assert [e.answer for e in kept] == ["5"] and len(skipped) == 1


def test_math_file_boxed_parquet(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = {
        "problem": ["Compute $\\frac{1}{2} + \\frac{1}{4}$.", "AIME-style: find n."],
        "solution": ["We get $\\boxed{\\frac{3}{4}}$.", "So $n = \\boxed{204}$."],
    }
    path = tmp_path / "math.parquet"
    datasets.Dataset.from_dict(rows).to_parquet(str(path))
    examples = load_examples(
        path, prompt_key="problem", answer_key="solution", answer_format="boxed"
    )
    assert [e.answer for e in examples] == ["\\frac{3}{4}", "204"]
    assert math_verify_match("\\boxed{0.75}", examples[0]) == 1.0
    with pytest.raises(ValueError, match="answer_format must be one of raw, gsm8k, boxed"):
        load_examples(path, prompt_key="problem", answer_key="solution", answer_format="latex")


def test_aime_integer_answers(tmp_path):
    path = _write_jsonl(tmp_path / "aime.jsonl", [{"problem": "p", "answer": 204}])
    (ex,) = load_examples(path, prompt_key="problem")
    assert ex.answer == "204"
    assert math_verify_match("\\boxed{204}", ex) == 1.0
