"""The torch-free copies of the registry names (gspo.config.names) equal the registries, and
unknown names get a did-you-mean."""

from __future__ import annotations

from dataclasses import fields

import pytest

from gspo.config import ConfigError, TrainConfig, build
from gspo.config.names import (
    ADVANTAGE_SCALES,
    BUILTIN_LOSSES,
    CHAT_MODES,
    COMPARE_MODES,
    CREDITS,
    KL_ESTIMATORS,
    MISMATCH_LEVELS,
    ROUTING_REPLAY,
    LossInfo,
    did_you_mean,
    losses,
)


def test_builtin_loss_table_equals_the_registry():
    from gspo.core.losses import LOSSES

    registered = {name: spec for name, spec in LOSSES.items() if not name.startswith("test_")}
    assert set(BUILTIN_LOSSES) == set(registered)
    for name, spec in registered.items():
        for f in fields(LossInfo):
            assert getattr(BUILTIN_LOSSES[name], f.name) == getattr(spec, f.name), (name, f.name)
        assert BUILTIN_LOSSES[name].default_aggregation == spec.default_aggregation


def test_name_tuples_equal_their_registries():
    from gspo.core.advantages import SCALES
    from gspo.core.correction import LEVELS
    from gspo.core.kl import KL_ESTIMATORS as KL
    from gspo.envs.credit import CREDITS as ENV_CREDITS
    from gspo.models.chat import CHAT_MODES as CHAT
    from gspo.models.moe import ROUTING_REPLAY as REPLAY
    from gspo.sandbox.compare import COMPARE_MODES as SANDBOX_COMPARE

    assert CHAT_MODES == CHAT
    assert ROUTING_REPLAY == REPLAY
    assert ADVANTAGE_SCALES == SCALES
    assert KL_ESTIMATORS == KL
    assert MISMATCH_LEVELS == LEVELS
    assert CREDITS == ENV_CREDITS
    assert COMPARE_MODES == SANDBOX_COMPARE


def test_engine_names_equal_the_engine_registry():
    from gspo.config.fields import ROLLOUT_ENGINES
    from gspo.rollout.engines import ENGINES

    assert tuple(ENGINES) == ROLLOUT_ENGINES


def test_turn_credit_message_matches_the_runtime_check():
    from gspo.envs.credit import credit_problem

    with pytest.raises(ConfigError) as exc:
        build(TrainConfig, overrides=dict(algo="gspo", credit="turn"))
    assert credit_problem("gspo", "turn") in str(exc.value)


def test_a_loss_registered_at_run_time_is_a_valid_algo(monkeypatch):
    from gspo.core.losses import LOSSES

    monkeypatch.setitem(LOSSES, "test_light_names", LOSSES["gspo"])
    assert "test_light_names" in losses()
    assert build(TrainConfig, overrides=dict(algo="test_light_names")).algo == "test_light_names"


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
