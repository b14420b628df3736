"""`gspo compare`: planning and validation, and a seconds-long real comparison (smoke preset)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from plotcheck import capture_plots, is_png

from gspo.config import ConfigError
from gspo.envs.tasks.scratchpad import final_answer, long_form, run_chain, scratchpad_reward
from gspo.envs.tasks.synthetic import make_task, split_of
from gspo.interface.cli import main
from gspo.interface.compare import parse_algos, parse_seeds, plan, run_compare
from gspo.interface.report import train_records
from gspo.orchestration.logging import read_metrics


def test_parse_algos_and_seeds() -> None:
    assert parse_algos("grpo, gspo,luspo") == ["grpo", "gspo", "luspo"]
    with pytest.raises(ConfigError, match="unknown algo ppo"):
        parse_algos("grpo,ppo")
    with pytest.raises(ConfigError, match="twice"):
        parse_algos("gspo,gspo")
    assert parse_seeds("3") == [0, 1, 2]
    assert parse_seeds("2", base=5) == [5, 6]
    assert parse_seeds("4,1") == [4, 1]
    with pytest.raises(ConfigError, match="at least 1"):
        parse_seeds("0")
    with pytest.raises(ConfigError, match="count or a comma list"):
        parse_seeds("x")


def test_plan_shares_everything_but_algo_and_seed(tmp_path: Path) -> None:
    cfgs, sfts = plan(
        ["grpo", "luspo"], [0, 1], tmp_path, preset="smoke", overrides={"lr": 2e-4}, sft_steps=3
    )
    assert [(c.loss.algo, c.run.seed) for c in cfgs] == [
        ("grpo", 0),
        ("luspo", 0),
        ("grpo", 1),
        ("luspo", 1),
    ]
    assert {c.model.model for c in cfgs if c.run.seed == 1} == {str(tmp_path / "sft" / "seed1")}
    assert all(c.optim.lr == 2e-4 and c.run.steps == 2 for c in cfgs)
    assert (
        sfts[0].steps == 3
        and sfts[0].seed == 0
        and sfts[0].hidden_size == cfgs[0].model.hidden_size
    )
    assert sfts[1].model == "tiny" and sfts[1].n_train == cfgs[0].task.n_train
    with pytest.raises(ConfigError, match="cannot be combined with --model"):
        plan(["gspo"], [0], tmp_path, overrides={"model": "some/dir"}, sft_steps=3)
    with pytest.raises(ConfigError, match="--algos"):
        plan(["gspo"], [0], tmp_path, overrides={"algo": "grpo"})
    with pytest.raises(ConfigError, match="steps must be positive"):
        plan(["gspo"], [0], tmp_path, overrides={"steps": 0})


def test_mixed_clip_levels_warn_from_the_registry(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A clip range shared by token-clip and sequence-clip losses warns; the registry's
    ``token_clip`` decides which is which (gmpo clips token log-ratios, gspo_token does not)."""
    clip = {"clip_low": 0.2, "clip_high": 0.2}
    for algos, warns in (
        (["gspo", "gmpo"], True),
        (["grpo", "cispo"], False),
        (["gspo", "gspo_token"], False),
    ):
        plan(algos, [0], tmp_path, preset="smoke", overrides=clip)
        assert ("need ranges orders of magnitude apart" in capsys.readouterr().err) == warns, algos


@pytest.mark.slow
def test_compare_two_algos_from_one_cold_start(tmp_path: Path, monkeypatch) -> None:
    """Both algorithms of a seed start from the same SFT checkpoint and see the same first
    rollout (same data order, init and sampling), then the report covers every run."""
    plots = capture_plots(monkeypatch)
    logs: list[str] = []

    def planned() -> tuple:  # each call plans again, as `gspo compare` does
        return plan(
            ["grpo", "gspo"],
            [0],
            tmp_path / "cmp",
            preset="smoke",
            overrides={"steps": 3, "eval_every": 3, "device": "cpu"},
            sft_steps=2,
            sft_overrides={"batch_size": 8},
        )

    result = run_compare(*planned(), tmp_path / "cmp", log=logs.append)
    assert [p.name for p in result.run_dirs] == ["grpo_seed0", "gspo_seed0"]
    configs = [json.loads((p / "config.json").read_text()) for p in result.run_dirs]
    assert {c["model"] for c in configs} == {str(tmp_path / "cmp" / "sft" / "seed0")}
    first = [train_records(read_metrics(p / "metrics.jsonl"))[0] for p in result.run_dirs]
    for key in ("reward/mean", "response_length/mean", "response_length/max"):
        assert first[0][key] == first[1][key], key
    report = result.report_dir
    assert is_png(report / "curves_vs_step.png") and is_png(report / "curves_vs_time.png")
    # Each run's logged curves are what the report draws (one seed: no band; 3 steps: no
    # smoothing), against steps and against cumulative rollout + recompute + train time.
    for algo, run_dir in zip(["grpo", "gspo"], result.run_dirs, strict=True):
        records = train_records(read_metrics(run_dir / "metrics.jsonl"))
        line = f"{algo} (n=1)"
        for panel, key in (("train reward", "reward/mean"), ("KL(old || new)", "kl/old_new")):
            xs, ys = plots["curves_vs_step.png"][panel][line]
            assert xs == [1.0, 2.0, 3.0]
            values = [r[key] for r in records]
            if panel.startswith("KL"):  # log axis: zeros drawn at half the smallest positive
                assert ys == pytest.approx([v if v > 0 else min(ys) for v in values], rel=1e-12)
            else:
                assert ys == pytest.approx(values, rel=1e-12, abs=0)
        clock, total = [], 0.0
        for r in records:
            total += r["time/rollout_s"] + r.get("time/recompute_s", 0.0) + r["time/train_s"]
            clock.append(total)
        xs, ys = plots["curves_vs_time.png"]["train reward"][line]
        assert xs == pytest.approx(clock, rel=1e-9)
        assert ys == pytest.approx([r["reward/mean"] for r in records], rel=1e-12, abs=0)
    summary = json.loads((report / "summary.json").read_text())
    assert set(summary["groups"]) == {"grpo", "gspo"}
    assert summary["groups"]["gspo"]["steps"] == [3]
    assert len(list((report / "raw").glob("*.jsonl"))) == 2

    # A second call reuses the finished cold start and runs instead of redoing them.
    logs.clear()
    run_compare(*planned(), tmp_path / "cmp", log=logs.append)
    assert sum("reusing" in line for line in logs) == 3, logs


def test_cli_compare(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli"
    code = main(
        ["compare", "--algos", "gspo,luspo", "--seeds", "1", "--preset", "smoke",
         "--device", "cpu", "--output-dir", str(out)]
    )  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    assert "| `gspo` | 1 |" in printed and "| `luspo` | 1 |" in printed
    summary_md = (out / "report" / "summary.md").read_text()
    assert "| `gspo` | 1 |" in summary_md and "| `luspo` | 1 |" in summary_md
    assert main(["compare", "--algos", "nope", "--preset", "smoke"]) == 2
    assert "unknown algo nope" in capsys.readouterr().err


def test_scratchpad_task_mixes_forms_and_scores_only_the_final_answer() -> None:
    task = make_task("scratchpad", n_train=400, n_test=40, difficulty=6)
    forms = [e.meta["form"] for e in task.train]
    assert 0.35 < forms.count("long") / len(forms) < 0.65
    for example in task.train[:50] + task.test:
        assert scratchpad_reward(example.demo, example) == 1.0
        assert len(example.demo) in (1, 11)  # short: the digit; long: 6 digits and 5 commas
        assert len(example.prompt) == 14
    # 3*7=21 -> 1, +4 -> 5, *3=15 -> 5, +8=13 -> 3
    assert run_chain(3, [("*", 7), ("+", 4), ("*", 3), ("+", 8)]) == [1, 5, 5, 3]
    assert long_form(3, [("*", 7), ("+", 4), ("*", 3), ("+", 8)]) == "1,5,5,3"
    ex = task.test[0]
    wrong = str((int(ex.answer) + 1) % 10)
    assert scratchpad_reward(ex.answer, ex) == 1.0  # short form
    assert scratchpad_reward(f"{wrong},{wrong},{ex.answer}", ex) == 1.0  # scratchpad not checked
    assert scratchpad_reward(ex.answer + ",", ex) == 0.0
    assert scratchpad_reward(wrong, ex) == 0.0
    assert scratchpad_reward("", ex) == 0.0
    assert final_answer(" 1,2, 3 ") == "3"
    assert all(split_of(e.prompt) == "test" for e in task.test)
    assert not {e.prompt for e in task.test} & {e.prompt for e in task.train}
