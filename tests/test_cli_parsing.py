"""The ``gspo`` parser: fast help, no abbreviations, one bool-flag convention, clear messages."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gspo.interface.cli import main

SRC = str(Path(__file__).resolve().parents[1] / "src")


def run_cli(*args: str) -> tuple[subprocess.CompletedProcess, float]:
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "gspo.interface.cli", *args], capture_output=True, text=True, env=env
    )
    return proc, time.perf_counter() - t0


def test_building_the_parser_imports_no_heavy_module():
    code = (
        "import sys, gspo.interface.cli; gspo.interface.cli._parser(); "
        "heavy = [m for m in ('torch', 'transformers', 'matplotlib', 'tokenizers') "
        "if m in sys.modules]; print(heavy)"
    )
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_help_and_argument_errors_are_quick():
    # Generous bound (importing torch + transformers alone takes about 4 s here); the measured
    # figure is about 0.1 s, see docs/results.md ("The command line").
    for args, code in ((["--help"], 0), (["train", "--help"], 0), (["train", "--bogus"], 2)):
        proc, seconds = run_cli(*args)
        assert proc.returncode == code, proc.stderr
        assert seconds < 3.0, f"gspo {' '.join(args)} took {seconds:.1f} s"


@pytest.mark.parametrize(
    "argv",
    [
        ["train", "--clip-lo", "0.1"],
        ["sft", "--batch", "8"],
        ["eval", "--max-new", "8"],
        ["compare", "--algos", "gspo", "--sft-step", "2"],
        ["demo", "--sft", "2"],
    ],
)
def test_abbreviated_flags_are_errors(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert "unrecognized arguments" in capsys.readouterr().err


def test_group_size_zero_is_reported_once(tmp_path, capsys):
    assert main(["train", "--group-size", "0", "--output-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("group-size") == 1 and "--group-size must be >= 2" in err  # the flag typed


def test_demo_progress_flag_uses_the_config_convention(capsys):
    with pytest.raises(SystemExit):
        main(["demo", "--no-progress"])
    assert "unrecognized arguments: --no-progress" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["demo", "--progress", "maybe"])
    assert "expected true or false" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["train", "sft", "eval"])
def test_help_states_how_train_and_eval_defaults_differ(command):
    proc, _ = run_cli(command, "--help")
    text = " ".join(proc.stdout.split())
    assert "train and eval defaults differ on purpose" in text
    assert "--model smollm2-135m-instruct" in text and "--max-new-tokens 256" in text
    assert "--train-file/--test-file" in text and "--data FILE" in text
