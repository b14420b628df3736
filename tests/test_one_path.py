"""One path through the trainer: a single-turn task is the one-turn case of the environment
protocol (issue 21). The collect step runs every task through the episode driver, the rollout
of a single-turn task is exactly the engine's, and a one-turn environment written against the
protocol alone trains like the built-in task."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import gspo.compose.train as trainer_module
import gspo.envs.episodes as episodes_module
from gspo.config import ConfigError, TrainConfig, build, to_dict
from gspo.core.seeding import prompt_indices
from gspo.envs import ENVIRONMENTS, SingleTurnEnv, Step
from gspo.envs.driver import decode_completions
from gspo.envs.rewards import score
from gspo.envs.tasks.base import Example, Task
from gspo.models import moe
from gspo.orchestration import steps
from gspo.orchestration.steps import StepState
from gspo.rollout.base import GenerationRequest


def even_share(text: str, example: Example) -> float:
    return sum(ord(c) % 2 == 0 for c in text) / len(text) if text else 0.0


def even_task() -> Task:
    examples = [Example(prompt=f"{i}+{7 * i % 10}=", answer="") for i in range(16)]
    return Task("even", train=examples[:12], test=examples[12:], reward=even_share)


class Parity:
    """A one-turn environment written against the protocol only (no base class, no
    step_batch): the driver calls ``step`` once per episode."""

    name, multi_turn, stop_strings = "parity", False, ()

    def reset(self, example: Example) -> Example:
        return example

    def step(self, state: Example, text: str, finished: bool) -> Step:
        return Step(done=True, reward=even_share(text, state))


class Flaky(Parity):
    """Raises on every completion that starts with an odd character: those episodes fail."""

    def step(self, state: Example, text: str, finished: bool) -> Step:
        if text and ord(text[0]) % 2:
            raise RuntimeError("the environment broke")
        return super().step(state, text, finished)


def make_cfg(tmp_path: Path, **overrides) -> TrainConfig:
    base = {"device": "cpu", "threads": 0, "output_dir": str(tmp_path)}
    return build(TrainConfig, preset="smoke", overrides={**base, **overrides})


@pytest.fixture
def even(monkeypatch):
    monkeypatch.setattr(trainer_module, "build_task", lambda cfg: even_task())


def test_single_turn_collect_goes_through_the_driver_and_keeps_the_engine_rollout(
    tmp_path, even, monkeypatch
):
    parts = trainer_module.build_parts(make_cfg(tmp_path), Path(tmp_path))
    calls = []
    inner = episodes_module.run_episodes

    def spy(engine, env, *args, **kwargs):
        calls.append(env)
        return inner(engine, env, *args, **kwargs)

    monkeypatch.setattr(episodes_module, "run_episodes", spy)
    state = StepState(seed=parts.cfg.run.seed, step=3)
    batch = steps.collect(parts, state)
    assert len(calls) == 1 and isinstance(calls[0], SingleTurnEnv)
    assert calls[0].reward is parts.train_reward
    # What the single-turn trainer sampled and scored before the one path: the same engine
    # call on the cached prompt ids with the step's generator, scored by the training reward.
    cfg, engine = parts.cfg, parts.engine
    idx = prompt_indices(
        len(parts.train_set), state.step, cfg.rollout.prompts_per_step, cfg.run.seed
    )
    gen = state.generator(0, engine.device)
    ref = moe.generate_with_routing(
        engine,
        GenerationRequest(
            [parts.prompt_cache[i] for i in idx], cfg.rollout.group_size, parts.params, gen
        ),
    )
    texts = decode_completions(parts.tokenizer, ref.completion_ids, ref.completion_mask)
    examples = [parts.train_set[i] for i in idx for _ in range(cfg.rollout.group_size)]
    rewards, errors = score(parts.train_reward, texts, examples)
    got = batch.rollout
    for name in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "logprobs"):
        assert torch.equal(getattr(got, name), getattr(ref, name)), name
    assert got.finish_reasons == ref.finish_reasons and got.extras == ref.extras == {}
    assert got.loss_mask is None and got.versions is None  # the engine's layout, not repacked
    assert torch.equal(batch.rewards, torch.tensor(rewards, dtype=torch.float64))
    assert batch.reward_errors == errors == 0 and batch.advantages is None
    assert not any(k.startswith("episode/") for k in batch.metrics)


def _run(tmp_path: Path, **overrides) -> list[dict]:
    cfg = make_cfg(tmp_path, **{"steps": 3, "eval_every": 2, **overrides})
    drop = ("time/", "throughput/")
    return [
        {k: v for k, v in record.items() if not k.startswith(drop)}
        for record in trainer_module.train(cfg).history
    ]


@pytest.mark.slow
def test_a_users_one_turn_environment_trains_like_the_built_in_task(tmp_path, even, monkeypatch):
    built_in = _run(tmp_path / "built_in")
    monkeypatch.setitem(ENVIRONMENTS, "even", lambda task, cfg, chat: Parity())
    mine = _run(tmp_path / "mine")
    # Same samples, same rewards, same updates, same held-out scores (the user's environment
    # scores the evaluation too): the run is the same record for record.
    assert mine == built_in
    steps_logged = [r for r in mine if "reward/mean" in r]
    assert len(steps_logged) == 3 and any(r["reward/mean"] > 0 for r in steps_logged)
    assert any("eval/greedy_accuracy" in r for r in mine)


def test_a_failing_one_turn_environment_fails_only_its_episodes(tmp_path, even, monkeypatch):
    monkeypatch.setitem(ENVIRONMENTS, "even", lambda task, cfg, chat: Flaky())
    parts = trainer_module.build_parts(make_cfg(tmp_path), Path(tmp_path))
    batch = steps.collect(parts, StepState(seed=parts.cfg.run.seed, step=0))
    texts = decode_completions(
        parts.tokenizer, batch.rollout.completion_ids, batch.rollout.completion_mask
    )
    odd = [bool(t) and ord(t[0]) % 2 == 1 for t in texts]
    assert batch.reward_errors == sum(odd) > 0
    assert all(float(r) == 0.0 for r, o in zip(batch.rewards, odd, strict=True) if o)


def test_single_turn_env_scores_a_round_at_once_with_the_task_reward_beside():
    def bonus(text: str, example: Example) -> float:
        if text == "boom":
            raise ValueError("a broken reward")
        return even_share(text, example) + 0.5

    env = SingleTurnEnv(bonus, task_reward=even_share, timeout_s=5.0, workers=3)
    ex = Example(prompt="1+1=", answer="2")
    out = env.step_batch([ex] * 3, ["24", "boom", "13"], [True, True, False])
    assert [s.done for s in out] == [True] * 3
    assert [s.failed for s in out] == [False, True, False]
    assert [s.reward for s in out] == [1.5, 0.0, 0.5]
    assert [s.info["task"] for s in out] == [1.0, 0.25, 0.0]  # "boom": b even, o o m odd
    assert env.step(ex, "2", True).reward == 1.5  # step is the one-episode round


def test_dynamic_sampling_rounds_of_episodes_keep_their_masks_and_turns():
    from gspo.orchestration.dynamic_sampling import concat, select_groups
    from gspo.rollout.base import Rollout, RolloutBatch

    def episodes(width: int, version: int) -> RolloutBatch:
        n = 4  # 2 groups of 2
        ids = torch.arange(n * width).view(n, width)  # [N, L]
        loss = (ids % 3 != 0).long()  # [N, L] environment tokens at every third column
        rollout = Rollout(
            prompt_ids=torch.ones(n, 2, dtype=torch.long),
            prompt_mask=torch.ones(n, 2, dtype=torch.long),
            completion_ids=ids,
            completion_mask=torch.ones(n, width, dtype=torch.long),
            logprobs=torch.zeros(n, width),
            finish_reasons=["stop"] * n,
            prompt_index=torch.tensor([0, 0, 1, 1]),
            extras={
                "turn_ids": torch.where(loss.bool(), 0, -1),
                "policy_version": torch.full((n,), version),
            },
            loss_mask=loss,
        )
        return RolloutBatch(
            rollout, torch.tensor([0.0, 1.0, 2.0, 3.0], dtype=torch.float64), 0, None
        )

    a = select_groups(episodes(3, 7), torch.tensor([1]), 2)
    assert torch.equal(a.rollout.loss_mask, episodes(3, 7).rollout.loss_mask[2:])
    assert a.rollout.extras["policy_version"].tolist() == [7, 7]
    both = concat([a, episodes(5, 8)], pad_id=0).rollout
    assert both.completion_ids.shape == both.loss_mask.shape == (6, 5)
    assert both.loss_mask[:2, 3:].sum() == 0  # padding of the narrower round: no loss
    assert (both.extras["turn_ids"][:2, 3:] == -1).all()
    assert both.extras["policy_version"].tolist() == [7, 7, 8, 8, 8, 8]


@pytest.mark.slow
def test_multi_turn_episodes_train_with_dynamic_sampling_and_the_off_policy_mask(tmp_path):
    cfg = make_cfg(
        tmp_path, task="guess", max_new_tokens=12, max_total_tokens=40, max_turns=3,
        prompts_per_step=4, dynamic_sampling=True, off_policy_mask=True,
    )  # fmt: skip
    records = [r for r in trainer_module.train(cfg).history if "reward/mean" in r]
    assert len(records) == 2
    for r in records:  # guess: -0.1 per invalid guess, so the groups' returns differ
        assert "data/oversample_rounds" in r and "episode/turns_mean" in r
        assert r["grad_norm"] > 0


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"kl_in_reward": True, "kl_coef": 0.1}, "kl_in_reward"),
        ({"dynamic_sampling": True, "algo": "gspo_token", "credit": "turn"}, "credit='episode'"),
        ({"overlong_buffer": 2}, "overlong_buffer"),
    ],
)
def test_multi_turn_episodes_refuse_what_they_cannot_do_yet(tmp_path, overrides, match):
    shape = dict(task="guess", max_new_tokens=12, max_total_tokens=40)
    with pytest.raises(ConfigError, match=match):  # a built config: refused when built
        make_cfg(tmp_path, **shape, **overrides)
    # Made in Python without validation: the run refuses it when it builds its episodes.
    cfg = TrainConfig.of(**{**to_dict(make_cfg(tmp_path, **shape)), **overrides})
    with pytest.raises(ValueError, match=match):
        trainer_module.build_parts(cfg, Path(tmp_path))


def test_a_registered_single_turn_env_keeps_its_own_reward(tmp_path, even, monkeypatch):
    def always(text: str, example: Example) -> float:
        return 1.0

    monkeypatch.setitem(
        ENVIRONMENTS, "even", lambda task, cfg, chat: SingleTurnEnv(always, name="even")
    )
    episodes = trainer_module.build_parts(make_cfg(tmp_path), Path(tmp_path)).episodes
    assert episodes.env.reward is always and episodes.eval_env is episodes.env
    # Its environment gives the rewards: a format bonus would be ignored, so it is refused.
    cfg = make_cfg(tmp_path, format_reward_weight=0.5)
    with pytest.raises(ValueError, match=r"format_reward_weight=0\.5 applies to tasks scored by"):
        trainer_module.build_parts(cfg, Path(tmp_path))
    # The config check names the field before any work (built-in environments: guess, ...).
    with pytest.raises(ConfigError, match="task 'guess' has its own environment"):
        make_cfg(tmp_path, task="guess", format_reward_weight=0.5)
    # Without a registered environment: the training reward (format bonus) trains, the task's
    # reward evaluates.
    monkeypatch.delitem(ENVIRONMENTS, "even")
    parts = trainer_module.build_parts(cfg, Path(tmp_path))
    assert parts.episodes.env.reward is parts.train_reward is not even_share
    assert parts.episodes.env.task_reward is even_share is parts.episodes.eval_env.reward


class RoundCounter:
    """A multi-turn environment with ``step_batch``: the driver hands it each round at once."""

    def __init__(self, inner) -> None:
        self.inner, self.rounds = inner, []
        self.name, self.multi_turn, self.stop_strings = inner.name, True, inner.stop_strings

    def reset(self, example):
        return self.inner.reset(example)

    def step(self, state, text, finished):
        raise AssertionError("the driver must call step_batch")

    def step_batch(self, states, texts, finished):
        self.rounds.append(len(states))
        return [self.inner.step(*a) for a in zip(states, texts, finished, strict=True)]


@pytest.mark.slow
def test_multi_turn_rounds_go_to_step_batch_and_train_the_same(tmp_path, monkeypatch):
    kw = dict(task="guess", max_new_tokens=6, max_total_tokens=40, max_turns=3, eval_every=0)
    plain = _run(tmp_path / "plain", **kw)
    made = []
    factory = ENVIRONMENTS["guess"]

    def batched(task, cfg, chat):
        made.append(RoundCounter(factory(task, cfg, chat)))
        return made[-1]

    monkeypatch.setitem(ENVIRONMENTS, "guess", batched)
    assert _run(tmp_path / "batched", **kw) == plain
    rounds = made[0].rounds
    assert rounds[0] == 2 * 4 and len(rounds) > 3  # prompts x group_size, then later turns
