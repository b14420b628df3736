"""The registries are built from the names gspo.config.names declares (torch-free), failing at
import when they differ, and unknown names get a did-you-mean."""

from __future__ import annotations

import subprocess
import sys

import pytest

from gspo.config import ConfigError, TrainConfig, build
from gspo.config.names import declared, did_you_mean, losses


def test_declared_builds_a_registry_in_the_declared_order():
    assert list(declared(("b", "a"), {"a": 1, "b": 2}, "things")) == ["b", "a"]
    with pytest.raises(RuntimeError) as exc:
        declared(("a", "b"), {"a": 1, "c": 3}, "things")
    text = str(exc.value)
    assert text.startswith("things: declared in gspo.config.names without an implementation:")
    assert "['b']" in text and "implemented but not declared there: ['c']" in text


@pytest.mark.slow  # each case imports torch and a registry in a fresh interpreter
@pytest.mark.parametrize(
    "change, module, message",
    [
        ("names.BUILTIN_REWARDS += ('new_reward',)", "gspo.envs.rewards", "['new_reward']"),
        ("names.BUILTIN_TASKS += ('new_task',)", "gspo.envs", "tasks: declared"),
        ("names.ENVIRONMENT_TASKS = ('guess',)", "gspo.envs", "['calculator', 'code_feedback']"),
        ("names.INTEGRATIONS['new'] = ('x', 'x', True)", "gspo.envs", "['new']"),
    ],
)
def test_a_registry_that_differs_from_its_declaration_fails_its_import(change, module, message):
    # The names are declared once (gspo.config.names) and each registry is built from them:
    # a name on one side only fails the registry's import, so no test need compare copies.
    # (The losses and engines have no copy: each is declared once, in its own place.)
    code = (
        "import importlib\n"
        "from gspo.config import names\n"
        f"{change}\n"
        f"importlib.import_module({module!r})\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode != 0
    assert message in done.stderr, done.stderr[-2000:]


def test_builtin_losses_are_read_from_their_decorators_without_torch():
    code = (
        "import sys\n"
        "from gspo.config.names import builtin_losses\n"
        "info = builtin_losses()['gspo']\n"
        "assert 'torch' not in sys.modules\n"
        "print(info.clip_low, info.aggregations, dict(builtin_losses()['grpo'].options))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[0] == "0.0003 ('seq_mean_token_mean',) {'dual_clip': None}"


def test_a_builtin_loss_declared_with_a_non_literal_fails_by_name(tmp_path, monkeypatch):
    from gspo.config import names

    (tmp_path / "h50_losses.py").write_text(
        "EPS = 0.2\n\n\n"
        "@register_loss('fine', clip_low=0.2, clip_high=0.2, aggregations=('token_mean',),\n"
        "               token_advantages=True)\n"
        "def fine_terms(): ...\n\n\n"
        "@register_loss('computed', clip_low=EPS, clip_high=EPS, aggregations=('token_mean',),\n"
        "               token_advantages=True)\n"
        "def computed_terms(): ...\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(names, "LOSS_MODULES", ("h50_losses",))
    names.builtin_losses.cache_clear()
    try:
        with pytest.raises(
            RuntimeError, match="h50_losses, line 9: a built-in loss's register_loss"
        ):
            names.builtin_losses()
    finally:
        names.builtin_losses.cache_clear()


def test_turn_credit_message_matches_the_runtime_check():
    from gspo.envs.credit import credit_problem

    with pytest.raises(ConfigError) as exc:
        build(TrainConfig, overrides=dict(algo="gspo", credit="turn"))
    assert credit_problem("gspo", "turn") in str(exc.value)


def test_a_loss_registered_at_run_time_is_a_valid_algo(monkeypatch):
    from gspo.core.losses import LOSSES

    monkeypatch.setitem(LOSSES, "test_light_names", LOSSES["gspo"])
    assert "test_light_names" in losses()
    assert (
        build(TrainConfig, overrides=dict(algo="test_light_names")).loss.algo == "test_light_names"
    )


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (dict(algo="gsop"), "unknown algorithm 'gsop' — did you mean 'gspo'?"),
        (dict(task="additon"), "unknown task 'additon' — did you mean 'addition'?"),
        (
            dict(task="file", train_file="x.jsonl", reward="exact_mach"),
            "unknown reward 'exact_mach' — did you mean 'exact_match'?",
        ),
        (dict(rollout_engine="vlm"), "unknown engine 'vlm' — did you mean 'vllm'?"),
        (dict(dtype="bfloat61"), "got 'bfloat61' — did you mean 'bfloat16'?"),
        (dict(backend="rya"), "got 'rya' — did you mean 'ray'?"),
        (dict(kl_estimator="k33"), "did you mean 'k3'?"),
        (dict(advantage_scale="sample-std"), "did you mean 'sample_std'?"),
        (dict(chat_template="alway"), "did you mean 'always'?"),
        (dict(long_prompts="truncated"), "did you mean 'truncate'?"),
        (dict(device="cdua"), "bad device 'cdua' — did you mean 'cuda'?"),
        (dict(clip_lwo=0.1), "unknown config key 'clip_lwo' — did you mean 'clip_low'?"),
    ],
)
def test_unknown_names_get_did_you_mean(overrides, expected):
    with pytest.raises(ConfigError) as exc:
        build(TrainConfig, overrides=overrides)
    assert expected in str(exc.value)


def test_unknown_preset_gets_did_you_mean():
    with pytest.raises(ConfigError, match="did you mean 'smoke'"):
        build(TrainConfig, preset="smok")


def test_no_suggestion_when_nothing_is_close():
    assert did_you_mean("zzzz", ["gspo", "grpo"]) == ""
    with pytest.raises(ConfigError) as exc:
        build(TrainConfig, overrides=dict(algo="ppo"))
    assert "did you mean" not in str(exc.value) and "algo must be one of" in str(exc.value)


def test_every_problem_is_listed_together():
    with pytest.raises(ConfigError) as exc:
        build(
            TrainConfig,
            overrides=dict(
                algo="gsop", steps="x", lr=-1.0, dtype="fp8", backend="rya", async_partial="kep"
            ),
        )
    text = str(exc.value)
    for part in (
        "unknown algorithm 'gsop'",
        "steps: expected int, got 'x'",
        "lr must be positive",
        "dtype must be one of",
        "backend must be one of",
        "async_partial must be one of",
    ):
        assert part in text
    assert text.count("\n  - ") == 6


def test_a_file_task_without_a_reward_lists_every_registered_reward():
    from gspo.envs.rewards import REWARDS

    with pytest.raises(ConfigError) as exc:
        build(TrainConfig, overrides={"task": "file", "train_file": "train.jsonl"})
    assert f"task='file' needs reward, one of {', '.join(REWARDS)}" in str(exc.value)
    assert "code" in REWARDS and "countdown" in REWARDS  # the list once left these out
