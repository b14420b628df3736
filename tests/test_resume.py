"""``gspo train --resume`` restores the run's saved config; flags may change only safe fields."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gspo.compose.train import train
from gspo.config import ConfigError, TrainConfig, build, to_dict
from gspo.interface.cli import main
from gspo.orchestration.logging import read_metrics

RUN = ["--preset", "smoke", "--device", "cpu", "--task", "reversal", "--max-new-tokens", "5"]


def start_run(tmp_path, capsys) -> str:
    out = str(tmp_path / "run")
    assert main(["train", *RUN, "--steps", "4", "--stop-after", "2", "--output-dir", out]) == 0
    capsys.readouterr()
    return out


def saved(out: str) -> dict:
    return json.loads((Path(out) / "config.json").read_text())


def test_resume_without_flags_resumes_the_saved_run(tmp_path, capsys):
    out = start_run(tmp_path, capsys)
    before = saved(out)
    assert main(["train", "--output-dir", out, "--resume"]) == 0
    text = capsys.readouterr().out
    assert f"resuming {out} at step 2 of 4" in text and "gspo on reversal" in text
    after = saved(out)
    # task, steps, max_new_tokens, model shape: all the run's own; stop_after (a global step)
    # belongs to the command that gave it, so a plain resume runs to `steps`.
    assert after == {**before, "stop_after": None}
    steps = [r["step"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "loss" in r]
    assert steps == [1, 2, 3, 4]
    assert (tmp_path / "run" / "final" / "model.safetensors").is_file()


def test_resume_safe_changes_are_applied_and_printed(tmp_path, capsys):
    out = start_run(tmp_path, capsys)
    assert (
        main(["train", "--output-dir", out, "--resume", "--steps", "3", "--eval-every", "1"]) == 0
    )
    text = capsys.readouterr().out
    assert "changed on resume: steps 4 -> 3" in text
    assert "changed on resume: eval_every 0 -> 1" in text
    cfg = saved(out)
    assert cfg["steps"] == 3 and cfg["eval_every"] == 1 and cfg["task"] == "reversal"


@pytest.mark.parametrize(
    "flags, names",
    [
        (["--model", "tiny-moe"], ["model"]),
        (["--task", "addition"], ["task"]),
        (["--algo", "grpo", "--seed", "1"], ["algo", "seed"]),
        (["--group-size", "8"], ["group_size"]),
        (["--max-new-tokens", "8"], ["max_new_tokens"]),
        (["--preset", "demo"], ["task", "group_size", "prompts_per_step"]),
    ],
)
def test_resume_refuses_a_different_run(tmp_path, capsys, flags, names):
    out = start_run(tmp_path, capsys)
    before = (tmp_path / "run" / "config.json").read_text()
    assert main(["train", "--output-dir", out, "--resume", *flags]) == 2
    err = capsys.readouterr().err
    assert "would make a different run" in err
    for name in names:
        assert f"  - {name}: " in err
    assert (tmp_path / "run" / "config.json").read_text() == before  # nothing overwritten


def test_library_resume_with_another_config_is_refused(tmp_path):
    cfg = build(
        TrainConfig,
        preset="smoke",
        overrides=dict(device="cpu", output_dir=str(tmp_path), steps=3, stop_after=1),
    )
    train(cfg)
    other = build(TrainConfig, overrides={**to_dict(cfg), "lr": 1.0, "stop_after": None})
    with pytest.raises(ConfigError, match=r"lr: 5e-05 -> 1\.0"):
        train(other, resume=True)


def test_resume_past_the_end_is_refused(tmp_path, capsys):
    out = start_run(tmp_path, capsys)
    assert main(["train", "--output-dir", out, "--resume", "--steps", "1"]) == 2
    assert "at step 2, past steps=1" in capsys.readouterr().err
