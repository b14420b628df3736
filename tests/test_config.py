"""Tests for gspo.config: unknown keys, validation, type coercion, precedence and presets."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest

from gspo.config import (
    PRESETS,
    ConfigError,
    SFTConfig,
    TrainConfig,
    build,
    coerce,
    from_dict,
    to_dict,
)
from gspo.config.fields import flat_fields
from gspo.core.losses import LOSSES

# --- unknown keys ------------------------------------------------------------------------------


def test_unknown_override_key_is_named():
    with pytest.raises(ConfigError, match="unknown config key 'learning_rate'"):
        build(TrainConfig, overrides={"learning_rate": 1e-3})


def test_unknown_key_in_yaml_file_is_named(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("steps: 3\nmax-new-tokens: 5\nbatchsize: 7\n")
    with pytest.raises(ConfigError, match="unknown config key 'batchsize'"):
        build(TrainConfig, file=path)


def test_unknown_key_in_json_file_is_named(tmp_path):
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"steps": 3, "algorithm": "gspo"}))
    with pytest.raises(ConfigError, match="'algorithm'"):
        build(TrainConfig, file=path)


def test_sft_may_skip_its_final_eval_but_rl_may_not():
    assert build(SFTConfig, overrides={"n_test": 0}).n_test == 0
    with pytest.raises(ConfigError, match="n_test must be >= 0, got -1"):
        build(SFTConfig, overrides={"n_test": -1})
    with pytest.raises(ConfigError, match="n_test must be positive, got 0"):
        build(TrainConfig, overrides={"n_test": 0})


def test_sft_rejects_rl_only_keys():
    with pytest.raises(ConfigError, match="'clip_low'"):
        build(SFTConfig, overrides={"clip_low": 0.2})


def test_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        build(TrainConfig, file=tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("steps: [1, 2\n")
    with pytest.raises(ConfigError, match="cannot parse"):
        build(TrainConfig, file=bad)
    listing = tmp_path / "list.yaml"
    listing.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping"):
        build(TrainConfig, file=listing)
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert build(TrainConfig, file=empty) == TrainConfig()


def test_unknown_preset():
    with pytest.raises(ConfigError, match="unknown preset 'fast'"):
        build(TrainConfig, preset="fast")


# --- validation --------------------------------------------------------------------------------


def test_all_problems_are_listed_at_once():
    bad = {
        "steps": -1,
        "clip_low": 1.5,
        "algo": "ppo",
        "prompts_per_step": 3,
        "group_size": 3,
        "num_minibatches": 2,
        "temperature": -0.5,
    }
    with pytest.raises(ConfigError) as info:
        build(TrainConfig, overrides=bad)
    message = str(info.value)
    for needle in (
        "steps must be positive, got -1",
        "clip_low must be in [0, 1], got 1.5",
        "algo must be one of",
        "'ppo'",
        "= 9 must be divisible by num_minibatches=2",
        "temperature must be >= 0, got -0.5",
    ):
        assert needle in message, f"{needle!r} not in {message!r}"
    assert message.count("\n  - ") == 5


def test_unknown_aggregation_for_gspo_is_named_with_the_valid_ones():
    with pytest.raises(ConfigError) as info:
        build(TrainConfig, overrides={"algo": "gspo", "aggregation": "token_mean", "top_p": 0})
    message = str(info.value)
    assert "algo gspo supports aggregation seq_mean_token_mean, got 'token_mean'" in message
    assert "top_p must be in (0, 1], got 0" in message
    # The same aggregation is fine for GRPO (DAPO's token mean).
    cfg = build(TrainConfig, overrides={"algo": "grpo", "aggregation": "token_mean"})
    assert (cfg.loss.algo, cfg.loss.aggregation) == ("grpo", "token_mean")


@pytest.mark.parametrize(
    ("key", "value", "needle"),
    [
        ("old_logprobs", "trainer", "old_logprobs"),
        ("engine_dtype", "int8", "engine_dtype"),
        ("dtype", "fp8", "dtype must be one of"),
        ("device", "tpu", "bad device 'tpu'"),
        ("keep_checkpoints", 0, "keep_checkpoints"),
        ("stop_after", 0, "stop_after"),
        ("advantage_scale", "mad", "advantage_scale"),
        ("kl_coef", -0.1, "kl_coef"),
        ("lr", 0, "lr must be positive"),
        ("num_kv_heads", 3, "num_heads must be divisible by num_kv_heads"),
        ("overlong_buffer", 100, "overlong_buffer"),
    ],
)
def test_single_bad_values(key, value, needle):
    with pytest.raises(ConfigError) as info:
        build(TrainConfig, overrides={key: value})
    assert needle in str(info.value)


def test_file_task_needs_data_and_reward():
    with pytest.raises(ConfigError) as info:
        build(TrainConfig, overrides={"task": "file"})
    assert "train_file" in str(info.value) and "reward" in str(info.value)


# --- coercion ----------------------------------------------------------------------------------


def test_string_coercion():
    cfg = build(
        TrainConfig,
        overrides={
            "steps": "3",
            "difficulty": "none",
            "clip_high": "null",
            "progress": "false",
            "tensorboard": "no",
            "lr": "1e-3",
            "stop_after": "2",
            "engine_dtype": "bfloat16",
        },
    )
    assert cfg.run.steps == 3 and isinstance(cfg.run.steps, int)
    assert cfg.task.difficulty is None and cfg.loss.clip_high is None
    assert cfg.run.progress is False and cfg.run.tensorboard is False
    assert cfg.optim.lr == 1e-3 and isinstance(cfg.optim.lr, float)
    assert cfg.run.stop_after == 2
    assert cfg.engine.engine_dtype == "bfloat16"
    assert coerce(TrainConfig, "wandb", "true") is True
    assert coerce(TrainConfig, "wandb", "1") is True
    assert coerce(TrainConfig, "difficulty", "4") == 4
    assert coerce(TrainConfig, "steps", 5.0) == 5
    assert coerce(TrainConfig, "kl_coef", 1) == 1.0 and isinstance(
        coerce(TrainConfig, "kl_coef", 1), float
    )


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("steps", "abc"),
        ("steps", "2.5"),
        ("steps", 2.5),
        ("steps", True),
        ("lr", "fast"),
        ("lr", False),
        ("progress", "maybe"),
    ],
)
def test_bad_coercion_names_key_and_value(key, value):
    with pytest.raises(ConfigError, match=f"{key}: expected") as info:
        build(TrainConfig, overrides={key: value})
    assert repr(value) in str(info.value)


def test_none_for_a_required_field():
    with pytest.raises(ConfigError, match="steps cannot be None"):
        build(TrainConfig, overrides={"steps": "none"})


def test_yaml_values_are_coerced_too(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("steps: '7'\nlr: 1e-4\ndifficulty: null\nprogress: 'off'\n")
    cfg = build(TrainConfig, file=path)
    assert cfg.run.steps == 7 and cfg.optim.lr == 1e-4 and cfg.task.difficulty is None
    assert cfg.run.progress is False


# --- precedence --------------------------------------------------------------------------------


def test_precedence_defaults_preset_file_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("steps: 7\ngroup_size: 2\n")
    default = build(TrainConfig)
    preset = build(TrainConfig, preset="smoke")
    filed = build(TrainConfig, preset="smoke", file=path)
    final = build(TrainConfig, preset="smoke", file=path, overrides={"steps": "9"})

    assert (
        default.run.steps == 200
        and default.model.hidden_size == 64
        and default.rollout.group_size == 8
    )
    assert (
        preset.run.steps == 2 and preset.model.hidden_size == 32 and preset.rollout.group_size == 4
    )
    assert filed.run.steps == 7 and filed.rollout.group_size == 2 and filed.model.hidden_size == 32
    assert final.run.steps == 9 and final.rollout.group_size == 2 and final.model.hidden_size == 32
    # Untouched fields keep their defaults all the way through.
    assert final.run.seed == default.run.seed == 0


def test_validation_runs_on_the_merged_config(tmp_path):
    # A file fixing what the preset alone would make invalid is fine: validation is of the result.
    path = tmp_path / "run.yaml"
    path.write_text("prompts_per_step: 3\ngroup_size: 4\nnum_minibatches: 3\n")
    cfg = build(TrainConfig, preset="smoke", file=path)
    assert cfg.rollout.prompts_per_step * cfg.rollout.group_size % cfg.optim.num_minibatches == 0


def test_round_trip_through_dict():
    cfg = build(TrainConfig, preset="gspo-paper", overrides={"steps": 3, "difficulty": 2})
    assert from_dict(TrainConfig, to_dict(cfg)) == cfg
    assert from_dict(TrainConfig, json.loads(json.dumps(to_dict(cfg)))) == cfg


# --- presets -----------------------------------------------------------------------------------


def test_presets_exist_and_validate():
    assert {"demo", "smoke", "gspo-paper", "grpo-paper", "luspo-paper"} <= set(PRESETS)
    train_keys = set(flat_fields(TrainConfig))
    for name, values in PRESETS.items():
        assert set(values) <= train_keys, name
        cfg = to_dict(build(TrainConfig, preset=name))
        for key, value in values.items():
            assert cfg[key] == value, (name, key)
        build(SFTConfig, preset=name)  # RL-only keys are dropped for SFT


@pytest.mark.parametrize(
    ("preset", "algo", "low", "high"),
    [
        ("gspo-paper", "gspo", 3e-4, 4e-4),
        ("grpo-paper", "grpo", 0.2, 0.27),
        ("luspo-paper", "luspo", 2e-3, 2.5e-3),
    ],
)
def test_paper_presets_have_paper_clip_values(preset, algo, low, high):
    cfg = build(TrainConfig, preset=preset)
    assert (cfg.loss.algo, cfg.loss.clip_low, cfg.loss.clip_high) == (algo, low, high)
    assert cfg.optim.num_minibatches == 4 and cfg.loss.kl_coef == 0.0
    # A preset can be combined with a smaller run without losing its clip values.
    small = build(TrainConfig, preset=preset, overrides={"steps": 5})
    assert (small.loss.clip_low, small.loss.clip_high) == (low, high)


def test_loss_registry_defaults_match_the_papers():
    assert (LOSSES["gspo"].clip_low, LOSSES["gspo"].clip_high) == (3e-4, 4e-4)
    assert (LOSSES["luspo"].clip_low, LOSSES["luspo"].clip_high) == (2e-3, 2.5e-3)
    assert LOSSES["gspo"].default_aggregation == "seq_mean_token_mean"
    assert LOSSES["luspo"].default_aggregation == "seq_mean_token_sum"


def test_smoke_preset_is_small_and_quiet():
    cfg = build(TrainConfig, preset="smoke")
    assert cfg.run.progress is False and cfg.run.eval_every == 0 and cfg.run.checkpoint_every == 0
    assert (
        cfg.rollout.prompts_per_step * cfg.rollout.group_size <= 16 and cfg.model.hidden_size <= 32
    )


def test_the_episode_limits_are_declared_once_and_eval_and_sft_take_them():
    import ast
    from pathlib import Path

    import gspo.config as config
    from gspo.config.eval_config import EvalConfig
    from gspo.config.train import EPISODE_LIMITS

    declared = [
        node.target.id
        for path in Path(config.__file__).parent.glob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value
    ]
    assert {name: declared.count(name) for name in EPISODE_LIMITS} == dict.fromkeys(
        EPISODE_LIMITS, 1
    )
    train = {n: (f.default, f.metadata["doc"]) for n, f in flat_fields(TrainConfig).items()}
    for cls in (EvalConfig, SFTConfig):
        taken = {f.name: (f.default, f.metadata["doc"]) for f in fields(cls)}
        assert {name: taken[name] for name in EPISODE_LIMITS} == {
            name: train[name] for name in EPISODE_LIMITS
        }


def test_config_files_take_nested_keys_by_part_as_well_as_flat_ones(tmp_path):
    nested, flat = tmp_path / "nested.yaml", tmp_path / "flat.yaml"
    nested.write_text("loss:\n  algo: grpo\nrollout:\n  group-size: 4\nsteps: 3\nmodel: tiny\n")
    flat.write_text("algo: grpo\ngroup_size: 4\nsteps: 3\nmodel: tiny\n")
    cfg = build(TrainConfig, file=nested)
    assert cfg == build(TrainConfig, file=flat)
    assert (cfg.loss.algo, cfg.rollout.group_size, cfg.run.steps) == ("grpo", 4, 3)
    # What runs save (config.json, checkpoints) stays the flat dict, keyed as the flags.
    assert to_dict(cfg)["group_size"] == 4 and "rollout" not in to_dict(cfg)
    with pytest.raises(ConfigError, match=r"unknown config key loss\.bogus"):
        build(TrainConfig, overrides={"loss": {"bogus": 1}})
