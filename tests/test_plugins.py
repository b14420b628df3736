"""User code by name (gspo.config.plugins): ``module:attribute`` references for --reward, --task
and --env, checked without importing the module; --plugin modules, imported at validation so the
names they register validate; task builders receiving the file arguments."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gspo.config import ConfigError, EvalConfig, SFTConfig, TrainConfig, build, to_dict
from gspo.config.plugins import PluginError, ref_problem, resolve
from gspo.envs.tasks.base import Example, Task, call_builder

SRC = str(Path(__file__).resolve().parents[1] / "src")

# A user's module, as a user writes it: a reward, a task builder, a plugin registration.
MODULE = """
from gspo import Example, Task, register_reward, register_task


def score(completion, example):
    return float(completion.strip() == example.answer)


@register_reward("{name}_reward")
def registered_score(completion, example):
    return score(completion, example)


@register_task("{name}_task")
def build(*, n_train, n_test, seed=0, difficulty=None, train_file=None):
    ex = Example("1+1=", "2", demo="2", meta={{"train_file": train_file}})
    return Task("{name}_task", [ex] * n_train, [ex] * n_test, score)
"""


def write_module(folder: Path, name: str, text: str = MODULE) -> Path:
    path = folder / f"{name}.py"
    path.write_text(textwrap.dedent(text.format(name=name)))
    return path


@pytest.fixture
def cwd(tmp_path, monkeypatch):
    """The working directory a user runs gspo from (on sys.path, as `python -m` puts it). The
    registries and sys.modules are restored afterwards: other tests compare the registries
    with the docs, and each test's modules are its own."""
    from gspo.envs.base import ENVIRONMENTS
    from gspo.envs.rewards import REWARDS
    from gspo.envs.tasks import TASKS

    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    saved = [(r, dict(r)) for r in (TASKS, REWARDS, ENVIRONMENTS)]
    modules = set(sys.modules)
    yield tmp_path
    for registry, before in saved:
        registry.clear()
        registry.update(before)
    for name in set(sys.modules) - modules:
        if name.startswith("plug_"):
            del sys.modules[name]


def test_a_misspelt_function_is_named_with_the_closest_one(cwd):
    write_module(cwd, "plug_attr")
    assert ref_problem("reward", "plug_attr:scroe") == (
        "--reward plug_attr:scroe: module 'plug_attr' (./plug_attr.py) has no function "
        "'scroe'; did you mean 'score'?"
    )
    assert "has no builder 'biuld'; did you mean 'build'?" in ref_problem("task", "plug_attr:biuld")
    assert ref_problem("reward", "plug_attr:score") is None
    assert "plug_attr" not in sys.modules  # checked from the source, not imported


def test_a_misspelt_module_is_named_with_the_closest_file_of_the_working_directory(cwd):
    write_module(cwd, "plug_mod")
    problem = ref_problem("reward", "plug_mdo:score")
    assert problem == (
        "--reward plug_mdo:score: no module 'plug_mdo' in the working directory or installed; "
        "did you mean 'plug_mod'?"
    )
    (cwd / "plug_pkg").mkdir()
    (cwd / "plug_pkg" / "__init__.py").write_text("")
    write_module(cwd / "plug_pkg", "rewards")
    assert ref_problem("reward", "plug_pkg.rewards:score") is None
    assert ref_problem("reward", "plug_pkg.rewrds:score").endswith(
        "did you mean 'plug_pkg.rewards'?"
    )
    assert "expected module:function" in ref_problem("reward", "plug_mod:")
    assert "expected module:factory" in ref_problem("env", ":make")


def test_names_the_source_cannot_show_are_left_to_the_import(cwd):
    # A star import or a module __getattr__ may bind any name: no false alarm before importing.
    (cwd / "plug_star.py").write_text("from math import *\n")
    (cwd / "plug_lazy.py").write_text("def __getattr__(name):\n    return len\n")
    (cwd / "plug_cond.py").write_text(
        "try:\n    import json as fast\nexcept ImportError:\n    fast = None\n"
    )
    assert ref_problem("reward", "plug_star:anything") is None
    assert ref_problem("reward", "plug_lazy:anything") is None
    assert ref_problem("reward", "plug_cond:fast") is None
    assert ref_problem("reward", "json:loads") is None  # an installed module
    assert "has no function 'lods'; did you mean 'loads'?" in ref_problem("reward", "json:lods")


def test_an_error_inside_the_users_module_is_one_line_naming_it(cwd):
    (cwd / "plug_broken.py").write_text("def score(c, e):\n    return 1.0\n\nundefined_name\n")
    with pytest.raises(PluginError) as caught:
        resolve("reward", "plug_broken:score")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("--reward plug_broken:score: importing module 'plug_broken'")
    assert "NameError: name 'undefined_name' is not defined" in message
    (cwd / "plug_value.py").write_text("score = 3\n")
    with pytest.raises(PluginError, match="'score' is a int, not a callable"):
        resolve("reward", "plug_value:score")


def test_references_resolve_to_the_users_functions(cwd):
    write_module(cwd, "plug_resolve")
    from gspo.envs.rewards import get_reward
    from gspo.envs.tasks import make_task

    reward = get_reward("plug_resolve:score")
    assert reward(" 2", Example("1+1=", "2")) == 1.0
    task = make_task("plug_resolve:build", n_train=3, n_test=1, train_file="rows.jsonl")
    assert (task.name, len(task.train), task.train[0].meta) == (
        "plug_resolve_task",
        3,
        {"train_file": "rows.jsonl"},
    )


def test_a_builder_gets_the_keywords_its_signature_takes():
    ex = Example("p", "a")

    def old(*, n_train, n_test, seed=0, difficulty=None):  # written before the file arguments
        return Task("old", [ex] * n_train, [ex] * n_test, lambda c, e: 0.0)

    def new(*, n_train, n_test, train_file=None, test_file=None):
        return Task("new", [ex] * n_train, [Example(str(train_file), str(test_file))], len)

    def every(**kwargs):
        return Task("every", [], [], len, description=json.dumps(kwargs, sort_keys=True))

    files = dict(train_file="a.jsonl", test_file="b.jsonl", prompt_key="q")
    assert len(call_builder(old, n_train=2, n_test=1, seed=0, difficulty=None, **files).train) == 2
    got = call_builder(new, n_train=1, n_test=1, seed=0, difficulty=None, **files).test[0]
    assert (got.prompt, got.answer) == ("a.jsonl", "b.jsonl")
    described = json.loads(call_builder(every, n_train=1, n_test=1, **files).description)
    assert described == {"n_train": 1, "n_test": 1, **files}


def test_plugins_register_names_that_then_validate(cwd):
    write_module(cwd, "plug_reg")
    with pytest.raises(ConfigError, match="unknown task 'plug_reg_task'"):
        build(TrainConfig, overrides={"task": "plug_reg_task"})
    cfg = build(TrainConfig, overrides={"task": "plug_reg_task", "plugins": ["plug_reg"]})
    assert cfg.task.plugins == ("plug_reg",)
    sft = build(SFTConfig, overrides={"task": "plug_reg_task", "plugins": "plug_reg"})
    assert sft.plugins == ("plug_reg",)
    ev = build(EvalConfig, overrides={"data": "x.jsonl", "reward": "plug_reg_reward"})
    assert ev.reward == "plug_reg_reward"  # registered by the import above


def test_config_files_take_a_list_of_plugins_and_runs_save_it(cwd):
    write_module(cwd, "plug_file")
    (cwd / "run.yaml").write_text("plugins: [plug_file]\ntask: plug_file_task\n")
    cfg = build(TrainConfig, file=cwd / "run.yaml")
    assert (cfg.task.plugins, cfg.task.task) == (("plug_file",), "plug_file_task")
    saved = json.loads(json.dumps(to_dict(cfg)))  # what config.json holds
    assert saved["plugins"] == ["plug_file"]
    assert build(TrainConfig, overrides=saved) == cfg
    with pytest.raises(ConfigError, match="plugins: expected a list of names"):
        build(TrainConfig, overrides={"plugins": [1, 2]})


def test_a_named_environment_is_multi_turn_for_the_config_checks(cwd):
    (cwd / "plug_env.py").write_text("def make_env(task, opts, chat):\n    return None\n")
    with pytest.raises(ConfigError, match="has its own environment"):
        build(TrainConfig, overrides={"env": "plug_env:make_env", "format_reward_weight": 0.1})
    with pytest.raises(ConfigError, match="overlong_buffer applies to single-turn tasks only"):
        build(TrainConfig, overrides={"env": "plug_env:make_env", "overlong_buffer": 4})
    with pytest.raises(ConfigError, match="env must be module:factory"):
        build(TrainConfig, overrides={"env": "make_env"})
    with pytest.raises(ConfigError, match="has no factory 'make_nev'; did you mean 'make_env'"):
        build(EvalConfig, overrides={"env": "plug_env:make_nev"})


def run_main(argv: list[str], cwd: Path) -> tuple[int, str, list[str]]:
    """(exit code, stderr, heavy modules imported) of ``main(argv)`` run from ``cwd`` in a fresh
    interpreter that, like the ``gspo`` script, has no working directory on its path."""
    code = (
        "import json, sys\nfrom gspo.interface.cli import main\n"
        f"rc = main({argv!r})\n"
        "heavy = [m for m in ('torch', 'transformers', 'datasets') if m in sys.modules]\n"
        "print(json.dumps([rc, heavy]))\n"
    )
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [sys.executable, "-c", "import sys; del sys.path[0]\n" + code],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
    )
    assert proc.stdout.strip(), proc.stderr
    rc, heavy = json.loads(proc.stdout.strip().splitlines()[-1])
    return rc, proc.stderr, heavy


def one_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def test_cli_errors_name_module_and_attribute_before_torch_loads(tmp_path):
    write_module(tmp_path, "mymod")
    (tmp_path / "broken.py").write_text("raise RuntimeError('no licence key')\n")
    out = str(tmp_path / "out")
    rc, err, heavy = run_main(["train", "--reward", "mymod:scroe", "--output-dir", out], tmp_path)
    assert rc == 2 and heavy == []
    assert one_line(err) == (
        "gspo train: invalid config: --reward mymod:scroe: module 'mymod' (./mymod.py) has no "
        "function 'scroe'; did you mean 'score'?"
    )
    rc, err, heavy = run_main(["eval", "--task", "mymdo:build", "--output", "none"], tmp_path)
    assert rc == 2 and heavy == []
    assert "no module 'mymdo' in the working directory or installed; did you mean 'mymod'?" in (
        one_line(err)
    )
    rc, err, heavy = run_main(["sft", "--plugin", "broken", "--output-dir", out], tmp_path)
    assert rc == 2 and heavy == []
    assert (
        "--plugin broken: importing module 'broken' (./broken.py) failed: RuntimeError: no "
        "licence key (--log-level debug shows the traceback)"
    ) in one_line(err)
    rc, err, heavy = run_main(
        ["train", "--plugin", "mymod", "--task", "mymod_tsak", "--output-dir", out], tmp_path
    )
    assert rc == 2 and heavy == []
    assert "unknown task 'mymod_tsak' — did you mean 'mymod_task'?" in one_line(err)
    rc, err, heavy = run_main(
        ["compare", "--algos", "gspo", "--env", "mymod:make", "--output-dir", out], tmp_path
    )
    assert rc == 2 and heavy == [] and "has no factory 'make'" in one_line(err)


LOSS_PLUGIN = """
from gspo import register_loss


@register_loss("plug_loss", clip_low=0.2, clip_high=0.2, aggregations=("token_mean",),
               token_advantages=True)
def terms(logprobs, old_logprobs, advantages, mask, clip_low, clip_high):
    raise NotImplementedError  # only its name is checked here
"""


@pytest.mark.slow
def test_a_loss_a_plugin_registers_validates_before_the_loss_module_loads(tmp_path):
    # The plugin imports only the registry's module (gspo.core.objectives), not gspo.core.losses
    # where the config's check used to look: a fresh interpreter, so neither is loaded before.
    (tmp_path / "plug_loss.py").write_text(LOSS_PLUGIN)
    code = (
        "import sys\nfrom gspo.config import TrainConfig, build\n"
        "cfg = build(TrainConfig, overrides={'plugins': ['plug_loss'], 'algo': 'plug_loss'})\n"
        "print(cfg.loss.algo, 'gspo.core.losses' in sys.modules)\n"
    )
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [sys.executable, "-c", "import sys; del sys.path[0]\n" + code],
        capture_output=True, text=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["plug_loss", "False"]


def test_debug_log_level_adds_the_traceback_of_an_import_error(tmp_path):
    (tmp_path / "broken.py").write_text("def helper():\n    raise KeyError('deep')\n\nhelper()\n")
    argv = ["sft", "--plugin", "broken", "--output-dir", str(tmp_path / "out")]
    rc, err, _ = run_main(argv, tmp_path)
    assert rc == 2 and "Traceback" not in err
    rc, err, _ = run_main([*argv, "--log-level", "debug"], tmp_path)
    assert rc == 2 and "Traceback" in err and "in helper" in err
    assert err.strip().splitlines()[-1].endswith("failed: KeyError: 'deep' (--log-level debug "
                                                  "shows the traceback)")  # fmt: skip
