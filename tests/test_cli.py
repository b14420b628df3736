"""The command line as a user runs it (in-process, so the suite pays the import once)."""

from __future__ import annotations

import json

import pytest

from gspo.cli import main


def test_train_smoke_writes_metrics_plot_and_model(tmp_path, capsys):
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
    assert (out / "metrics.jsonl").is_file() and (out / "curves.png").stat().st_size > 1000
    assert (out / "final" / "model.safetensors").is_file()
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
    assert "algo must be one of" in err and "steps must be positive" in err
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


def test_demo_short(tmp_path, capsys):
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
    assert (out / "demo.png").stat().st_size > 1000
