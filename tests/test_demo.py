"""``gspo demo``: its one progress bar over SFT and RL."""

from __future__ import annotations

import pytest
from plotcheck import capture_plots

from gspo.interface.cli import main


@pytest.mark.slow
def test_demo_shows_one_bar_for_sft_and_rl(tmp_path, capsys, monkeypatch):
    capture_plots(monkeypatch)
    out = tmp_path / "demo"
    args = ["demo", "--output-dir", str(out), "--sft-steps", "3", "--steps", "2"]
    assert main([*args, "--threads", "1", "--progress", "true"]) == 0
    err = capsys.readouterr().err
    # one bar named for the demo, its phases in the postfix; no separate sft / gspo bars
    assert "demo: 100%" in err and "[1/2] SFT 3/3" in err and "[2/2] GSPO 2/2" in err
    assert "sft:" not in err and "gspo:" not in err


@pytest.mark.slow
def test_resuming_a_finished_demo_changes_nothing(tmp_path, capsys, monkeypatch):
    capture_plots(monkeypatch)
    out = tmp_path / "demo"
    args = ["demo", "--output-dir", str(out), "--sft-steps", "2", "--steps", "1"]
    assert main([*args, "--threads", "1", "--progress", "false"]) == 0
    summary = (out / "summary.json").read_text()
    capsys.readouterr()
    assert main(["demo", "--output-dir", str(out), "--resume", "--progress", "false"]) == 0
    assert "already finished" in capsys.readouterr().out
    assert (out / "summary.json").read_text() == summary  # its seconds not rewritten
