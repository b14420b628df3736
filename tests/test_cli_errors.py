"""Every CLI mistake is one line on stderr with exit code 2 and no traceback, and config mistakes
are reported before torch is imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gspo.interface.cli import main

SRC = str(Path(__file__).resolve().parents[1] / "src")
COMMANDS = ["train", "sft", "demo", "algos", "compare", "report", "eval"]


def run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter (nothing imported yet), this checkout's gspo first."""
    full_env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    full_env.update(env)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=full_env
    )


def run_main(argv: list[str]) -> tuple[int, str, list[str]]:
    """(exit code, stderr, heavy modules imported) of ``main(argv)`` in a fresh interpreter."""
    code = (
        "import json, sys\nfrom gspo.interface.cli import main\n"
        f"rc = main({argv!r})\n"
        "heavy = [m for m in ('torch', 'transformers', 'datasets') if m in sys.modules]\n"
        "print(json.dumps([rc, heavy]))\n"
    )
    proc = run_python(code)
    assert proc.stdout.strip(), proc.stderr
    rc, heavy = json.loads(proc.stdout.strip().splitlines()[-1])
    return rc, proc.stderr, heavy


def one_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def test_unknown_algo_is_reported_before_torch_is_imported():
    rc, err, heavy = run_main(["train", "--algo", "gsop"])
    assert rc == 2 and heavy == []
    assert "unknown algorithm 'gsop' — did you mean 'gspo'?" in one_line(err)
    rc, err, heavy = run_main(["compare", "--algos", "gspo,gsop", "--output-dir", "unused"])
    assert rc == 2 and heavy == []
    assert "unknown algo gsop — did you mean 'gspo'?" in one_line(err)
    rc, err, heavy = run_main(["compare", "--algos", "gspo", "--steps", "0"])
    assert rc == 2 and heavy == []
    assert "--steps must be > 0" in one_line(err)


def test_demo_checks_its_rl_config_before_the_cold_start():
    # The SFT stage would import torch and train for 300 steps first.
    rc, err, heavy = run_main(["demo", "--algo", "gsop", "--output-dir", "unused"])
    assert rc == 2 and heavy == []
    assert "unknown algorithm 'gsop' — did you mean 'gspo'?" in one_line(err)


def test_all_config_problems_are_listed_together_without_torch():
    argv = ["train", "--algo", "gsop", "--steps", "x", "--lr=-1", "--dtype", "bfloat61"]
    rc, err, heavy = run_main(argv)
    assert rc == 2 and heavy == [] and "Traceback" not in err
    for part in ("gsop", "steps: expected int", "--lr must be > 0", "'bfloat16'?"):
        assert part in err
    assert err.count("\n  - ") == 4


def test_algos_and_every_help_import_no_torch_and_show_no_rest_markup():
    code = (
        "import contextlib, io, json, sys\nfrom gspo.interface.cli import main\n"
        "out = {}\n"
        f"for argv in [['--help']] + [[c, '--help'] for c in {COMMANDS!r}] + [['algos']]:\n"
        "    buf = io.StringIO()\n"
        "    with contextlib.redirect_stdout(buf):\n"
        "        try:\n"
        "            main(argv)\n"
        "        except SystemExit:\n"
        "            pass\n"
        "    out[' '.join(argv)] = buf.getvalue()\n"
        "heavy = [m for m in ('torch', 'transformers') if m in sys.modules]\n"
        "print(json.dumps([out, heavy]))\n"
    )
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr
    out, heavy = json.loads(proc.stdout)
    assert heavy == []
    assert len(out) == len(COMMANDS) + 2
    for argv, text in out.items():
        assert text.strip(), argv
        assert "``" not in text, f"gspo {argv} shows reST markup"
    assert "\ngspo\n  objective" in out["algos"]  # a terminal table, not Markdown


def test_negative_number_is_a_value_then_refused_by_validation(capsys):
    assert main(["train", "--lr", "-1e-4"]) == 2
    assert "--lr must be > 0, got -0.0001" in one_line(capsys.readouterr().err)
    assert main(["train", "--clip-low", "-.5"]) == 2
    assert "--clip-low must be >= 0" in one_line(capsys.readouterr().err)


def test_unknown_flag_and_command_get_did_you_mean(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["train", "--clip-lo", "0.1"])
    assert exc.value.code == 2
    assert "did you mean '--clip-low'?" in one_line(capsys.readouterr().err)
    with pytest.raises(SystemExit) as exc:
        main(["trian"])
    assert exc.value.code == 2
    assert "did you mean 'train'?" in one_line(capsys.readouterr().err)


def test_cuda_without_cuda_is_one_line(monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["train", "--device", "cuda"]) == 2
    assert "torch sees no CUDA device" in one_line(capsys.readouterr().err)


@pytest.mark.parametrize(
    "argv, module, install",
    [
        (["train", "--rollout-engine", "vllm"], "vllm", 'pip install -e ".[vllm'),
        (["eval", "--rollout-engine", "vllm"], "vllm", 'pip install -e ".[vllm'),
        (["train", "--backend", "ray"], "ray", "pip install 'gspo[ray]'"),
        (["train", "--tensorboard", "true"], "tensorboard", "pip install tensorboard"),
        (["train", "--wandb", "true"], "wandb", "pip install wandb"),
        (["train", "--lora-rank", "4"], "peft", "pip install -c constraints.txt"),
    ],
)
def test_missing_extra_is_one_line_with_its_install_command(
    argv, module, install, monkeypatch, capsys
):
    monkeypatch.setitem(sys.modules, module, None)  # what an uninstalled module looks like
    assert main(argv) == 2
    line = one_line(capsys.readouterr().err)
    assert "not installed" in line and install in line


@pytest.mark.parametrize(
    "flags, stub, expected",
    [
        (["--device", "cuda"], None, "torch sees no CUDA device"),
        (["--tensorboard", "true"], "torch.utils.tensorboard", "pip install tensorboard"),
    ],
)
def test_checks_the_preflight_cannot_see_are_one_line_too(
    flags, stub, expected, tmp_path, monkeypatch, capsys
):
    # As for a --resume run, whose config comes from its checkpoint after the preflight.
    import torch

    import gspo.interface.cli as cli

    monkeypatch.setattr(cli, "preflight", lambda args, overrides: None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    if stub:
        monkeypatch.setitem(sys.modules, stub, None)
    argv = ["train", "--preset", "smoke", "--output-dir", str(tmp_path / "run"), *flags]
    assert main(argv) == 2
    assert expected in one_line(capsys.readouterr().err)


def test_directory_as_train_file_is_named_as_such(tmp_path, capsys):
    argv = ["train", "--task", "file", "--train-file", str(tmp_path), "--reward", "exact_match"]
    assert main(argv) == 2
    assert "is a directory" in one_line(capsys.readouterr().err)

    from gspo.envs.tasks import DataError, load_examples  # the data layer says the same

    with pytest.raises(DataError, match="is a directory, not a data file"):
        load_examples(tmp_path)


def test_non_utf8_data_file_names_the_row(tmp_path, capsys):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b'{"prompt": "a", "answer": "1"}\n\n{"prompt": "b\xff", "answer": "2"}\n')
    argv = ["train", "--task", "file", "--train-file", str(path), "--reward", "exact_match",
            "--preset", "smoke", "--device", "cpu", "--output-dir", str(tmp_path / "run")]  # fmt: skip
    assert main(argv) == 2
    line = one_line(capsys.readouterr().err)
    assert "row 1 (line 3): not UTF-8 text" in line and "position" not in line


def _load_in_fresh_process(tmp_path: Path, level: str) -> subprocess.CompletedProcess:
    path = tmp_path / f"rows_{level}.jsonl"
    path.write_text(json.dumps({"prompt": level, "answer": "1"}) + "\n")
    code = (
        "from gspo.interface.logs import set_log_level as _set_log_level\n"
        f"_set_log_level({level!r})\n"
        # datasets itself (gspo reads data files without it): a library's own info lines.
        "import datasets\n"
        f"datasets.load_dataset('json', data_files={{'train': {str(path)!r}}}, split='train')\n"
        "import os; print(os.environ['VLLM_LOGGING_LEVEL'])\n"
    )
    env = {"HF_DATASETS_CACHE": str(tmp_path / "hf_cache")}
    for name in ("VLLM_LOGGING_LEVEL", "HF_DATASETS_DISABLE_PROGRESS_BARS", "DATASETS_VERBOSITY"):
        env[name] = ""  # unset below: the test must not depend on the caller's environment
    code = "import os\nfor k in " + repr(list(env)[1:]) + ": os.environ.pop(k, None)\n" + code
    proc = run_python(code, **env)
    assert proc.returncode == 0, proc.stderr
    return proc


@pytest.mark.slow
def test_quiet_by_default_and_log_level_info_shows_library_lines(tmp_path):
    quiet = _load_in_fresh_process(tmp_path, "error")  # the default
    assert "Generating train split" not in quiet.stderr
    assert quiet.stdout.split() == ["ERROR"]  # vLLM's level, read when vLLM is imported
    verbose = _load_in_fresh_process(tmp_path, "info")
    assert "Generating train split" in verbose.stderr
    assert verbose.stdout.split() == ["INFO"]
    assert _parser_default_log_level() == "error"


def _parser_default_log_level() -> str:
    from gspo.interface.cli import _parser

    return _parser().parse_args(["train"]).log_level


@pytest.mark.parametrize(
    "argv", [["train"], ["sft"], ["eval"], ["demo"], ["compare", "--algos", "gspo"]]
)
def test_log_level_flag_is_accepted(argv):
    from gspo.interface.cli import _parser

    args = _parser().parse_args([*argv, "--log-level", "info"])
    assert args.log_level == "info"
