"""The command line as a user runs it (in-process, so the suite pays the import once)."""

from __future__ import annotations

import json

import pytest
import torch
from plotcheck import capture_plots, is_png
from safetensors.torch import load_file

from gspo.compose.parts import build_policy_for
from gspo.config import TrainConfig, build
from gspo.interface.cli import main


def test_train_smoke_writes_metrics_plot_and_model(tmp_path, capsys, monkeypatch):
    plots = capture_plots(monkeypatch)
    out = tmp_path / "run"
    code = main(
        [
            "train",
            "--preset",
            "smoke",
            "--device",
            "cpu",
            "--output-dir",
            str(out),
            "--algo",
            "luspo",
        ]
    )
    assert code == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "reward/mean" in r]
    assert [r["step"] for r in train] == [1, 2]
    # The plot draws the logged numbers: reward and response length per step.
    assert is_png(out / "curves.png")
    panels = plots["curves.png"]
    steps = [1.0, 2.0]
    assert panels["reward"]["train reward (per step)"] == (steps, [r["reward/mean"] for r in train])
    lengths = [r["response_length/mean"] for r in train]
    assert panels["response length"]["mean response length"] == (steps, lengths)
    # The final model holds the run's weights. A random model never solves addition: every
    # reward and advantage is 0, so they are exactly the seeded initial weights.
    assert all(r["reward/mean"] == 0 and r["advantage/zero_fraction"] == 1 for r in train)
    cfg = build(TrainConfig, preset="smoke", overrides={"device": "cpu", "algo": "luspo"})
    initial = build_policy_for(cfg, torch.device("cpu"))[0].state_dict()
    final = load_file(out / "final" / "model.safetensors")
    assert set(final) <= set(initial) and len(final) >= len(initial) - 1  # tied head saved once
    assert all(torch.equal(final[k], initial[k]) for k in final)
    assert "| steps | reward |" in capsys.readouterr().out


def test_train_rejects_unknown_flag_values_before_work(tmp_path, capsys):
    code = main(
        [
            "train",
            "--preset",
            "smoke",
            "--output-dir",
            str(tmp_path),
            "--algo",
            "ppo",
            "--steps",
            "-1",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert "algo must be one of" in err and "--steps must be > 0" in err
    assert not (tmp_path / "metrics.jsonl").exists()


def test_config_file_unknown_key(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("algo: gspo\nlearning_rate: 0.1\n")
    assert main(["train", "--config", str(cfg)]) == 2
    assert "unknown config key 'learning_rate'" in capsys.readouterr().err


def test_unknown_flag_is_an_argparse_error():
    with pytest.raises(SystemExit) as exc:
        main(["train", "--no-such-flag", "1"])
    assert exc.value.code == 2


def test_sft_then_train_from_it(tmp_path, capsys):
    sft_dir = tmp_path / "sft"
    assert (
        main(
            [
                "sft",
                "--device",
                "cpu",
                "--output-dir",
                str(sft_dir),
                "--steps",
                "3",
                "--batch-size",
                "8",
                "--hidden-size",
                "32",
                "--num-layers",
                "1",
                "--num-heads",
                "2",
                "--num-kv-heads",
                "1",
                "--n-train",
                "64",
                "--n-test",
                "8",
                "--progress",
                "false",
            ]
        )
        == 0
    )
    assert "held-out greedy accuracy" in capsys.readouterr().out
    run = tmp_path / "rl"
    assert (
        main(["train", "--preset", "smoke", "--model", str(sft_dir), "--output-dir", str(run)]) == 0
    )
    # The RL run started from the SFT model (its weights, not a fresh tiny model) and ran.
    assert json.loads((run / "config.json").read_text())["model"] == str(sft_dir)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "reward/mean" in r] == [1, 2]
    # A fresh smoke model earns no reward on addition, so a run that ignored --model would end
    # on the fresh initial weights; this one ends elsewhere (SFT moved them).
    final = load_file(run / "final" / "model.safetensors")
    fresh = build_policy_for(
        build(TrainConfig, preset="smoke", overrides={"device": "cpu"}), torch.device("cpu")
    )[0].state_dict()
    assert any(not torch.equal(final[k], fresh[k]) for k in final)


def test_demo_short(tmp_path, capsys, monkeypatch):
    plots = capture_plots(monkeypatch)
    out = tmp_path / "demo"
    code = main(
        [
            "demo",
            "--output-dir",
            str(out),
            "--sft-steps",
            "4",
            "--steps",
            "2",
            "--progress",
            "false",
        ]
    )
    assert code == 0
    text = capsys.readouterr().out
    assert "after SFT (RL step 0)" in text and "greedy accuracy" in text
    summary = json.loads((out / "summary.json").read_text())
    assert summary["before"]["step"] == 0 and summary["after"]["step"] == 2
    # The after-SFT scores are recorded once (RL step 0), not a second time with other samples.
    sampled = [
        name
        for name, v in summary.items()
        if isinstance(v, dict) and any(key.endswith("pass@1") for key in v)
    ]
    assert sampled == ["before", "after"]
    # The plot shows the held-out accuracy the summary reports, before and after RL.
    assert is_png(out / "demo.png")
    accuracy = plots["demo.png"]["reward"]["held-out greedy accuracy"]
    before, after = summary["before"], summary["after"]
    assert accuracy == ([0.0, 2.0], [before["eval/greedy_accuracy"], after["eval/greedy_accuracy"]])
