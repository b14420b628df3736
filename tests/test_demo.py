"""``gspo demo``: its settings (the cold start's batch) and its one progress bar."""

from __future__ import annotations

import argparse
import json

from plotcheck import capture_plots

from gspo.interface.cli import main
from gspo.interface.demo import DEMO_DEFAULTS, SFT_BATCH_SIZE, demo_settings


def _args(**kw) -> argparse.Namespace:
    return argparse.Namespace(**{**{k: None for k in DEMO_DEFAULTS}, "resume": False, **kw})


def test_a_new_demo_saves_its_cold_start_batch_and_an_older_one_keeps_256(tmp_path):
    assert demo_settings(tmp_path, _args())["sft_batch_size"] == SFT_BATCH_SIZE == 64
    # demo.json of a demo started before the batch was a setting: SFT ran at gspo sft's 256
    old = {**DEMO_DEFAULTS, "sft_steps": 300, "steps": 800}
    (tmp_path / "demo.json").write_text(json.dumps(old))
    assert demo_settings(tmp_path, _args(resume=True))["sft_batch_size"] == 256


def test_demo_shows_one_bar_for_sft_and_rl(tmp_path, capsys, monkeypatch):
    capture_plots(monkeypatch)
    out = tmp_path / "demo"
    args = ["demo", "--output-dir", str(out), "--sft-steps", "3", "--steps", "2"]
    assert main([*args, "--threads", "1", "--progress", "true"]) == 0
    err = capsys.readouterr().err
    # one bar named for the demo, its phases in the postfix; no separate sft / gspo bars
    assert "demo: 100%" in err and "[1/2] SFT 3/3" in err and "[2/2] GSPO 2/2" in err
    assert "sft:" not in err and "gspo:" not in err
    assert json.loads((out / "demo.json").read_text())["sft_batch_size"] == SFT_BATCH_SIZE
