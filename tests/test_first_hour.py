"""A user's first hour: a refused run does not block its retry, every bad row of a data file is
reported at once before torch loads, gzipped data reads as it ships, a finished run's --resume
changes nothing, and ``gspo eval`` says what it needs before loading a model."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gspo.interface.cli import main

SRC = str(Path(__file__).resolve().parents[1] / "src")
SMOKE = ["--preset", "smoke", "--device", "cpu", "--threads", "1", "--reward", "exact_match"]
GOOD = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(8)]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def two_bad_kinds(path: Path) -> Path:
    """Invalid JSON on line 5 and a non-UTF-8 byte on line 10, good rows elsewhere."""
    lines = [json.dumps(r).encode() for r in GOOD]
    lines.insert(4, b'{"prompt": "x", "answer": oops}')
    lines.insert(9, b'{"prompt": "caf\xe9", "answer": "1"}')
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def test_a_refused_run_leaves_no_run_behind_and_the_retry_starts(tmp_path, capsys):
    data = tmp_path / "rows.jsonl"
    data.write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2="}\n')
    run = tmp_path / "run"
    argv = ["train", *SMOKE, "--task", "file", "--train-file", str(data), "--output-dir", str(run)]
    assert main(argv) == 2
    assert "field 'answer' is missing" in capsys.readouterr().err
    assert not (run / "config.json").exists()
    write_jsonl(data, GOOD)  # fixed: the same command now runs, without --overwrite
    assert main(argv) == 0
    assert (run / "config.json").is_file() and (run / "final").is_dir()


def test_train_leaves_no_config_when_its_parts_fail(tmp_path):
    """Below the CLI (gspo.compose.train.train): a failure while the run is built (here the
    data, read again there) removes the folder it made, so nothing marks it as a run."""
    from gspo.compose.train import train
    from gspo.config import TrainConfig, build

    data = write_jsonl(tmp_path / "rows.jsonl", [{"prompt": "a"}])
    run = tmp_path / "run"
    cfg = build(
        TrainConfig,
        preset="smoke",
        overrides=dict(
            task="file", train_file=str(data), reward="exact_match", device="cpu",
            output_dir=str(run),
        ),
    )  # fmt: skip
    with pytest.raises(ValueError, match="missing"):
        train(cfg)
    assert not run.exists()


def test_every_bad_row_in_one_message_before_torch(tmp_path):
    """Two kinds of bad row, both named (file, row, line) in one message, exit 2, and torch
    never imported: checked in a fresh process."""
    data = two_bad_kinds(tmp_path / "bad.jsonl")
    code = (
        "import sys\nfrom gspo.interface.cli import main\n"
        f"rc = main(['train', '--task', 'file', '--train-file', {str(data)!r}, '--output-dir', "
        f"{str(tmp_path / 'run')!r}, '--preset', 'smoke', '--device', 'cpu', '--reward', 'exact_match'])\n"
        "print('torch' in sys.modules, rc)\n"
    )
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert proc.stdout.split() == ["False", "2"], proc.stderr
    err = proc.stderr
    assert "2 bad row(s) (invalid JSON 1, not UTF-8 1)" in err
    assert "bad.jsonl line 5: invalid JSON" in err
    assert "bad.jsonl row 9 (line 10): not UTF-8 text" in err
    assert "--bad-rows skip" in err
    assert not (tmp_path / "run").exists()


def test_bad_rows_skip_counts_each_kind(tmp_path):
    from gspo.envs.tasks import make_file_task

    data = two_bad_kinds(tmp_path / "bad.jsonl")
    test = write_jsonl(tmp_path / "test.jsonl", [GOOD[0], {"prompt": "", "answer": "1"}])
    task = make_file_task(data, test, "exact_match", on_error="skip")
    assert len(task.train) == 8 and len(task.test) == 1
    assert task.skipped_kinds == {"invalid_json": 1, "not_utf8": 1, "empty_field": 1}
    with pytest.raises(ValueError) as info:  # without skip: both files' rows in one message
        make_file_task(data, test, "exact_match")
    assert "3 bad row(s)" in str(info.value) and "test.jsonl row 1" in str(info.value)


def test_empty_file_and_bad_rows_of_the_other_file_together(tmp_path):
    from gspo.envs.tasks import DataError, make_file_task

    empty = tmp_path / "train.jsonl"
    empty.write_text("")
    test = write_jsonl(tmp_path / "test.jsonl", [{"prompt": "a"}, GOOD[0]])
    with pytest.raises(DataError) as info:
        make_file_task(empty, test, "exact_match")
    message = str(info.value)
    assert "train.jsonl: file is empty" in message
    assert "test.jsonl row 0 (line 1): field 'answer' is missing" in message


@pytest.mark.parametrize("suffix", [".jsonl.gz", ".json.gz"])
def test_gzipped_data_reads_as_it_ships(tmp_path, suffix):
    from gspo.envs.tasks import load_examples

    path = tmp_path / f"rows{suffix}"
    if suffix == ".json.gz":
        path.write_bytes(gzip.compress(json.dumps(GOOD).encode()))
    else:
        path.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in GOOD).encode()))
    assert [e.answer for e in load_examples(path)] == [r["answer"] for r in GOOD]
    broken = tmp_path / f"broken{suffix}"
    broken.write_bytes(b"not gzip at all")
    with pytest.raises(ValueError, match="not a readable gzip file"):
        load_examples(broken)


def test_jsonl_gz_trains_the_tiny_model_and_skipped_rows_are_counted_by_kind(tmp_path):
    path = tmp_path / "rows.jsonl.gz"
    text = "".join(json.dumps(r) + "\n" for r in GOOD) + "{oops\n"
    path.write_bytes(gzip.compress(text.encode()))
    run = tmp_path / "run"
    argv = ["train", *SMOKE, "--task", "file", "--train-file", str(path), "--output-dir", str(run)]
    assert main([*argv, "--bad-rows", "skip"]) == 0
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    data = next(r for r in records if "data/train_problems" in r)
    assert data["data/train_problems"] == 8 and data["data/skipped_rows"] == 1
    assert data["data/skipped_rows_invalid_json"] == 1
    assert max(r["step"] for r in records) == 2


def test_resuming_a_finished_run_changes_nothing(tmp_path, capsys):
    run = tmp_path / "run"
    argv = ["train", *SMOKE, "--task", "addition", "--output-dir", str(run)]
    argv += ["--checkpoint-every", "1"]
    assert main(argv) == 0
    before = (run / "metrics.jsonl").read_text()
    capsys.readouterr()
    assert main(["train", "--output-dir", str(run), "--resume"]) == 0
    out = capsys.readouterr().out
    assert "already finished (step 2 of 2" in out and "at step 2 of 2" not in out
    assert (run / "metrics.jsonl").read_text() == before


def test_eval_without_data_or_task_is_one_line(capsys):
    assert main(["eval"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "give --data FILE" in err and "--task NAME" in err


def test_eval_refuses_to_overwrite_its_output(tmp_path, capsys):
    out = tmp_path / "eval.json"
    out.write_text("{}")
    argv = ["eval", "--task", "addition", "--model", "tiny", "--output", str(out)]
    assert main(argv) == 2
    assert "already exists: pass --overwrite" in capsys.readouterr().err
    assert out.read_text() == "{}"


def test_eval_takes_the_runs_generation_settings(tmp_path, capsys):
    """A checkpoint trained with 4 new tokens is scored with 4 unless the flags say otherwise."""
    from gspo.interface.preflight import run_settings

    final = tmp_path / "run" / "final"
    final.mkdir(parents=True)
    (final.parent / "config.json").write_text(
        json.dumps({"max_new_tokens": 4, "chat_template": "none", "system_prompt": None})
    )
    found, saved = run_settings(str(final))
    assert found == final.parent / "config.json" and saved["max_new_tokens"] == 4
    assert run_settings(str(tmp_path)) == (None, {})

    import argparse

    from gspo.interface.preflight import eval_overrides

    args = argparse.Namespace(preset=None, config=None, overwrite=False)
    lines: list[str] = []
    given = {"model": str(final), "task": "addition", "output": None}
    got = eval_overrides(args, given, echo=lines.append)
    assert got["max_new_tokens"] == 4 and got["chat_template"] == "none"
    assert "max_new_tokens 4" in lines[0]
    got = eval_overrides(args, {**given, "max_new_tokens": 9})
    assert got["max_new_tokens"] == 9


def test_sft_refuses_a_prompt_and_demonstration_over_the_context(tmp_path, capsys):
    """The tiny model's context is 256 positions: a 300-character prompt cannot be learned."""
    rows = [*GOOD, {"prompt": "1" * 300 + "+1=", "answer": "2"}]
    data = write_jsonl(tmp_path / "rows.jsonl", rows)
    test = write_jsonl(tmp_path / "test.jsonl", [GOOD[0], {"prompt": "2" * 300, "answer": "3"}])
    argv = ["sft", "--task", "file", "--train-file", str(data), "--test-file", str(test)]
    argv += ["--reward", "exact_match", "--device", "cpu", "--threads", "1", "--steps", "1"]
    argv += ["--batch-size", "4", "--hidden-size", "32", "--num-layers", "1", "--progress", "false"]
    out = tmp_path / "sft"
    assert main([*argv, "--output-dir", str(out)]) == 2
    err = capsys.readouterr().err
    assert "rows.jsonl row 8 has a 304-token prompt" in err and "context of 256" in err
    assert not out.exists()
    assert main([*argv, "--output-dir", str(out), "--long-prompts", "truncate"]) == 0
    err = capsys.readouterr().err
    assert "data: 1 training prompts truncated, 0 skipped" in err
    assert "data: 1 held-out prompts truncated, 0 skipped" in err
    # A finished SFT's --resume says so and changes nothing.
    assert main(["sft", "--output-dir", str(out), "--resume"]) == 0
    assert "already finished" in capsys.readouterr().out


def test_version_flag(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith("gspo ")


def test_a_builders_task_without_description_is_named(tmp_path, monkeypatch):
    from gspo.compose.evaluate import eval_examples
    from gspo.config import EvalConfig, build

    (tmp_path / "nodesc_task.py").write_text(
        "from gspo.envs.rewards import exact_match\n"
        "from gspo.envs.tasks.base import Example, Task\n"
        "def build(n_train, n_test, seed):\n"
        "    return Task('nodesc', [], [Example('1+1=', '2')], exact_match)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = build(EvalConfig, overrides={"task": "nodesc_task:build"})
    assert eval_examples(cfg)[2] == "task nodesc, test split"


def test_the_printed_evaluation_says_its_step():
    from gspo.interface.cli import eval_label

    history = [{"step": 0, "eval/greedy_accuracy": 0.1}, {"step": 1, "reward/mean": 0.5}]
    assert eval_label(history, stopped=True) == (
        "held-out evaluation at step 0 (the latest before the run was stopped):"
    )
    history.append({"step": 4, "eval/greedy_accuracy": 0.3})
    assert eval_label(history, stopped=False) == "held-out evaluation at step 4:"
