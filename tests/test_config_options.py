"""Each component's options (gspo.config.options): the parts TrainConfig is composed of, each
field declared once there (flat flags and config keys are generated from them), each class
listing its own problems; every refused combination across components in
gspo.config.combinations."""

import subprocess
import sys
from dataclasses import fields

import pytest

from gspo.compose.train import train
from gspo.config import ConfigError, TrainConfig, build, field_docs, to_dict
from gspo.config.combinations import combination_problems
from gspo.config.fields import flat_fields
from gspo.config.options import ModelOptions
from gspo.config.options_task import RewardOptions
from gspo.config.options_train import AsyncOptions, BackendOptions, RolloutOptions


def test_every_flat_field_is_in_exactly_one_component():
    owners: dict[str, list[str]] = {}
    for part in TrainConfig().parts():
        for f in fields(part):
            owners.setdefault(f.name, []).append(type(part).__name__)
    assert sorted(owners) == sorted(flat_fields(TrainConfig))
    assert {name: o for name, o in owners.items() if len(o) > 1} == {}
    assert len(flat_fields(TrainConfig)) == 125  # 124 + compile


def test_flat_and_nested_values_make_the_same_config_with_the_parts_docs():
    cfg = TrainConfig.of(lora_rank=4, reward_workers=3, max_staleness=1, top_p=0.5)
    nested = TrainConfig.of(
        model={"lora_rank": 4},
        reward={"reward_workers": 3},
        asynchronous={"max_staleness": 1},
        rollout={"top_p": 0.5},
    )
    assert cfg == nested
    assert (cfg.model.lora_rank, cfg.reward.reward_workers, cfg.rollout.top_p) == (4, 3, 0.5)
    flat = to_dict(cfg)
    assert TrainConfig.of(**flat) == cfg and len(flat) == 125
    for part in cfg.parts():
        docs = field_docs(type(part))
        for f in fields(part):
            assert docs[f.name] == field_docs(TrainConfig)[f.name] != ""
    assert ModelOptions() == TrainConfig().model


def test_each_component_lists_its_own_problems():
    assert ModelOptions(num_heads=3, num_kv_heads=1).problems() == [
        "hidden_size must be divisible by num_heads"
    ]
    assert RewardOptions(code_memory_mb=8).problems() == ["code_memory_mb must be >= 64, got 8"]
    assert RolloutOptions(group_size=1, top_p=0).problems() == [
        "group_size must be >= 2 (group-normalized advantages compare responses to the same "
        "prompt), got 1",
        "top_p must be in (0, 1], got 0",
    ]
    assert BackendOptions(rollout_workers=2).problems() == ["rollout_workers=2 needs backend='ray'"]
    assert AsyncOptions(max_staleness=-1).problems() == [
        "max_staleness must be an integer >= 0, got -1"
    ]
    assert all(not part.problems() for part in TrainConfig().parts())


def test_combinations_are_refused_in_one_place_all_together():
    cfg = TrainConfig.of(
        backend="ray", rollout_workers=0, max_staleness=1, lora_rank=4, dynamic_sampling=True
    )
    assert combination_problems(cfg) == [
        "backend='ray' does not support LoRA (lora_rank > 0) yet",
        "max_staleness >= 1 does not support dynamic_sampling yet",
        "max_staleness >= 1 with backend='ray' needs rollout_workers >= 1 (the workers "
        "generate while the ranks train)",
    ]
    with pytest.raises(ConfigError) as info:
        build(TrainConfig, overrides={"rollout_engine": "vllm", "top_p": 0.9, "group_size": 1})
    text = str(info.value)
    assert "rollout_engine='vllm' with top_p=0.9" in text and "group_size must be >= 2" in text


def test_a_config_made_in_python_is_refused_before_any_work(tmp_path):
    # No __post_init__ checks any more: the composition root refuses the same problems.
    cfg = TrainConfig.of(backend="local", rollout_workers=2, output_dir=str(tmp_path / "run"))
    with pytest.raises(ConfigError, match="rollout_workers=2 needs backend='ray'"):
        train(cfg)
    assert not (tmp_path / "run").exists()


def test_options_import_no_torch():
    code = (
        "import sys; import gspo.config.combinations, gspo.config.validation; "
        "assert 'torch' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_task_registered_at_run_time_is_a_valid_name():
    from gspo.envs import tasks

    tasks.TASKS["my_task"] = tasks.TASKS["addition"]
    try:
        assert build(TrainConfig, overrides={"task": "my_task"}).task.task == "my_task"
    finally:
        del tasks.TASKS["my_task"]


def test_multi_turn_refusals_come_from_the_one_place_at_build_and_at_run_time():
    # A task with a registered environment: refused when the config is built, every problem
    # together (before, the run found them one at a time once it built its episodes).
    with pytest.raises(ConfigError) as built:
        build(TrainConfig, overrides={"task": "calculator", "overlong_buffer": 4, "kl_coef": 0.1,
                                      "kl_in_reward": True})  # fmt: skip
    assert "overlong_buffer applies to single-turn tasks only" in str(built.value)
    assert "kl_in_reward applies to single-turn tasks only" in str(built.value)
    # A single-turn task with the same values has no multi-turn problem.
    opts = TrainConfig.of(task="addition", overlong_buffer=4)
    assert not any("single-turn tasks only" in p for p in combination_problems(opts))
    # The run's own check (for an environment the config cannot know) says the same.
    from gspo.envs.episodes import check_multi_turn

    with pytest.raises(ValueError, match="overlong_buffer applies to single-turn tasks only"):
        check_multi_turn(TrainConfig.of(task="calculator", overlong_buffer=4))
