"""One run per output folder: a second run is refused (or moves the first aside with
--overwrite), a new run never mixes with an earlier run's checkpoints, a resumed run reads as one
run from step 1, --stop-after is a global step, and no temporary folder outlives a resume."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gspo.compose.train import train
from gspo.config import TrainConfig, build, to_dict
from gspo.core.checkpoint_paths import checkpoint_root, latest_checkpoint, list_checkpoints
from gspo.interface.cli import main
from gspo.orchestration.logging import read_metrics
from gspo.orchestration.loop import _progress

RUN = ["--preset", "smoke", "--device", "cpu", "--task", "reversal", "--max-new-tokens", "5"]


def fake_run(folder: Path) -> str:
    """A folder holding an earlier run: what gspo train leaves (no training needed)."""
    (folder / "checkpoints" / "step_000009").mkdir(parents=True)
    (folder / "checkpoints" / "step_000009" / "state.json").write_text('{"step": 9}')
    text = '{"step": 9, "loss": 1.0}\n'
    (folder / "metrics.jsonl").write_text(text)
    return text


@pytest.mark.parametrize("command", ["train", "sft", "demo"])
def test_second_run_is_refused_in_one_line_before_torch(tmp_path, command):
    out = tmp_path / "run"
    before = fake_run(out)
    code = (
        "import sys; from gspo.interface.cli import main; rc = main(sys.argv[1:]); "
        "print('torch loaded' if 'torch' in sys.modules else 'no torch'); sys.exit(rc)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, command, "--output-dir", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert str(out) in lines[0] and "already holds a run" in lines[0]
    assert "--overwrite" in lines[0] and "--resume" in lines[0]
    assert proc.stdout.strip() == "no torch"  # refused before torch and the model load
    assert (out / "metrics.jsonl").read_text() == before  # nothing touched


@pytest.mark.slow
def test_overwrite_moves_the_earlier_run_aside(tmp_path, capsys):
    out = tmp_path / "run"
    before = fake_run(out)
    assert main(["train", *RUN, "--steps", "1", "--output-dir", str(out), "--overwrite"]) == 0
    assert f"moved the earlier run in {out} aside to {out}.old-1" in capsys.readouterr().out
    aside = Path(f"{out}.old-1")
    assert (aside / "metrics.jsonl").read_text() == before  # kept whole, never deleted
    assert (aside / "checkpoints" / "step_000009" / "state.json").is_file()
    # The new folder holds only the new run.
    assert [p.name for p in list_checkpoints(out)] == ["step_000001"]
    assert {r["step"] for r in read_metrics(out / "metrics.jsonl")} <= {0, 1}
    # A second --overwrite picks the next free name.
    assert main(["train", *RUN, "--steps", "1", "--output-dir", str(out), "--overwrite"]) == 0
    assert Path(f"{out}.old-2", "metrics.jsonl").is_file()


def test_resume_and_overwrite_exclude_each_other(tmp_path, capsys):
    out = tmp_path / "run"
    fake_run(out)
    assert main(["demo", "--output-dir", str(out), "--resume", "--overwrite"]) == 2
    assert "exclude each other" in capsys.readouterr().err


def test_a_new_library_run_never_keeps_an_earlier_runs_checkpoints(tmp_path):
    # Before: the earlier run's step 9 stayed beside the new steps 1-2, and --resume took it.
    fake_run(tmp_path)
    cfg = build(TrainConfig, preset="smoke", overrides=dict(device="cpu", output_dir=str(tmp_path)))
    train(cfg)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_000002"]
    assert latest_checkpoint(tmp_path).name == "step_000002"


@pytest.mark.slow
def test_resumed_run_reads_as_one_run_from_step_1(tmp_path, capsys):
    out = str(tmp_path / "run")
    assert main(["train", *RUN, "--steps", "4", "--stop-after", "2", "--output-dir", out]) == 0
    capsys.readouterr()
    assert main(["train", "--output-dir", out, "--resume"]) == 0
    table = capsys.readouterr().out
    for step in (1, 2, 3, 4):  # the curve table (and curves.png) cover the whole run
        assert f"| {step}-{step} |" in table
    # The library result too: the earlier records, then this process's.
    cfg = build(
        TrainConfig,
        preset="smoke",
        overrides=dict(device="cpu", output_dir=str(tmp_path / "lib"), steps=3, stop_after=1),
    )
    train(cfg)
    rest = train(build(TrainConfig, overrides={**to_dict(cfg), "stop_after": None}), resume=True)
    assert [r["step"] for r in rest.history if "loss" in r] == [2, 3]
    assert [r["step"] for r in rest.run_history if "loss" in r] == [1, 2, 3]
    assert rest.run_history[0]["step"] == 0  # the step-0 data counts


def test_progress_bar_counts_the_global_step():
    cfg = build(TrainConfig, overrides=dict(steps=10, progress=True))
    bar = _progress(cfg, 4, 10)
    try:
        assert (bar.n, bar.total) == (4, 10)
    finally:
        bar.close()


@pytest.mark.slow
def test_stop_after_is_the_global_step(tmp_path, capsys):
    out = str(tmp_path / "run")
    assert main(["train", *RUN, "--steps", "5", "--stop-after", "2", "--output-dir", out]) == 0
    # --stop-after 3 on resume stops at step 3 (not 2 + 3 = 5).
    assert main(["train", "--output-dir", out, "--resume", "--stop-after", "3"]) == 0
    assert latest_checkpoint(out).name == "step_000003"
    assert not (tmp_path / "run" / "final").exists()
    # A stop at or before the checkpoint is refused in one line.
    assert main(["train", "--output-dir", out, "--resume", "--stop-after", "3"]) == 2
    assert "stop_after=3 is not past the checkpoint's step 3" in capsys.readouterr().err
    # Without --stop-after a resume runs to `steps` (the saved stop is not kept).
    assert main(["train", "--output-dir", out, "--resume"]) == 0
    assert latest_checkpoint(out).name == "step_000005"
    assert (tmp_path / "run" / "final" / "model.safetensors").is_file()


def test_resume_removes_what_interrupted_writes_left(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", *RUN, "--steps", "3", "--stop-after", "1", "--output-dir", str(out)]) == 0
    root = checkpoint_root(out)
    # What a kill leaves: a checkpoint folder mid-write, a half-written `latest`, a model export.
    (root / ".tmp-step_000002-abc").mkdir()
    (root / ".latest.xyz").write_text("step_0")
    (out / ".tmp-final-q1").mkdir()
    assert main(["train", "--output-dir", str(out), "--resume", "--stop-after", "2"]) == 0
    hidden = [p.name for p in [*root.iterdir(), *out.iterdir()] if p.name.startswith(".")]
    assert hidden == []
    state = json.loads((root / "step_000002" / "state.json").read_text())
    assert state["step"] == 2


SFT = ["--device", "cpu", "--threads", "1", "--steps", "4", "--batch-size", "8", "--lr", "1e-2"]
SFT += ["--hidden-size", "32", "--num-layers", "1", "--num-heads", "2", "--num-kv-heads", "1"]
SFT += ["--n-train", "64", "--n-test", "0", "--progress", "false"]


def test_sft_stops_on_sigint_and_resumes_exactly(tmp_path, capsys, monkeypatch):
    import os
    import signal

    import torch
    from safetensors.torch import load_file

    import gspo.compose.sft

    threads = torch.get_num_threads()
    try:
        assert main(["sft", *SFT, "--output-dir", str(tmp_path / "a")]) == 0
        step = gspo.compose.sft._sft_step

        def interrupted_at_step_2(cfg, index, *args):  # a Ctrl-C arrives during step 2
            step(cfg, index, *args)
            if index == 1:
                os.kill(os.getpid(), signal.SIGINT)

        monkeypatch.setattr(gspo.compose.sft, "_sft_step", interrupted_at_step_2)
        out = tmp_path / "b"
        assert main(["sft", *SFT, "--output-dir", str(out)]) == 130
        err = capsys.readouterr().err
        assert f"resume with: gspo sft --output-dir {out} --resume" in err
        assert "stopped by SIGINT after step 2" in err
        assert latest_checkpoint(out).name == "step_000002"
        monkeypatch.setattr(gspo.compose.sft, "_sft_step", step)
        assert main(["sft", "--output-dir", str(out), "--resume", "--lr", "1"]) == 2
        assert "lr would make a different run" in capsys.readouterr().err
        (tmp_path / ".tmp-b-x1").mkdir()  # what a kill during the model's save leaves
        assert main(["sft", "--output-dir", str(out), "--resume"]) == 0
    finally:
        torch.set_num_threads(threads)
    assert "resuming SFT" in capsys.readouterr().out
    a = load_file(str(tmp_path / "a" / "model.safetensors"))
    b = load_file(str(out / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not (out / "checkpoints").exists()  # the saved model replaced its checkpoints
    assert not (tmp_path / ".tmp-b-x1").exists()
