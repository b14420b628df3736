"""Environments honoured everywhere: ``gspo eval --task``, ``gspo sft``'s held-out score and the
trainer's evaluation run the task's registered environment through one evaluation function
(:func:`gspo.orchestration.evaluation.evaluate`), multi-turn included, and agree on one model."""

from __future__ import annotations

import pytest

from gspo.compose.evaluate import evaluate as gspo_eval
from gspo.compose.sft import run_sft
from gspo.compose.train import build_parts
from gspo.config import EvalConfig, SFTConfig, TrainConfig, build
from gspo.orchestration.steps import StepState, evaluate_now

COMMON = dict(
    task="guess",
    difficulty=4,
    device="cpu",
    dtype="float64",
    threads=1,
    seed=0,
    n_test=8,
    max_new_tokens=4,
    max_turns=5,
    max_total_tokens=40,
)


@pytest.fixture(scope="module")
def sft_model(tmp_path_factory):
    """A tiny model SFT-trained a little on guess (binary-search demonstrations), with SFT's own
    held-out score of it."""
    out = tmp_path_factory.mktemp("sft") / "model"
    result = run_sft(
        build(
            SFTConfig,
            overrides=dict(
                COMMON,
                output_dir=str(out),
                steps=60,
                batch_size=32,
                n_train=128,
                lr=1e-2,
                progress=False,
            ),
        )
    )
    return out, result.eval


def _eval(model, **over):
    values = dict(COMMON, model=str(model), output=None, progress=False, **over)
    values.pop("max_new_tokens")
    cfg = build(EvalConfig, overrides=dict(values, max_new_tokens=COMMON["max_new_tokens"]))
    return gspo_eval(cfg)["metrics"]


@pytest.mark.slow
def test_eval_sft_and_training_score_the_same_episodes(sft_model, tmp_path):
    model, sft_metrics = sft_model
    evaluated = _eval(model, samples=0)
    # the trainer's evaluation of the same checkpoint, before any update
    cfg = build(
        TrainConfig,
        overrides=dict(
            COMMON,
            model=str(model),
            n_train=8,
            steps=1,
            output_dir=str(tmp_path / "run"),
            progress=False,
        ),
    )
    parts = build_parts(cfg, tmp_path / "run")
    trained = evaluate_now(parts, StepState(seed=0, step=1))
    assert trained == {f"eval/{k}": v for k, v in evaluated.items()}
    assert {k: sft_metrics[k] for k in evaluated} == evaluated
    # whole episodes of the environment, not one turn of the task's reward
    assert evaluated["turns_mean"] > 1
    assert 0 < evaluated["success"] <= 1 and evaluated["success"] >= evaluated["greedy_accuracy"]


@pytest.mark.slow
def test_eval_samples_episodes_of_a_multi_turn_env(sft_model):
    model, _ = sft_model
    got = _eval(model, samples=4, greedy=False, temperature=1.0)
    for key in ("sampled_success", "avg@4", "pass@4", "pass@1"):
        assert key in got and f"{key}_se" in got, key
    assert "greedy_accuracy" not in got  # greedy off: sampled episodes only
    assert got["pass@1"] == pytest.approx(got["sampled_success"])  # pass@1: the success rate
    assert got["pass@4"] >= got["pass@1"]


def test_the_report_shows_held_out_success_of_multi_turn_runs(tmp_path):
    from gspo.interface.report.data import Run
    from gspo.interface.report.stats import COLUMNS, columns_for, summarize

    ev = {"step": 2, "eval/greedy_accuracy": 0.0, "eval/success": 0.75}
    multi = Run(tmp_path, {"algo": "gspo"}, [{"step": 1, "reward/mean": 0.1}, ev])
    single = Run(tmp_path, {"algo": "gspo"}, [{"step": 1, "reward/mean": 0.1}])
    assert columns_for({"a": [single]}) == COLUMNS  # single-turn reports stay as they were
    columns = columns_for({"a": [multi]})
    summary = summarize({"a": [multi]}, columns=columns)
    assert summary.values["a"]["held-out success (end)"] == [0.75]
