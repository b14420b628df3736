"""Async multi-turn episodes (orchestration.async_episodes): per-token versions and log-probs
across weight switches at turn boundaries and mid-turn, staleness within K, no loss on
environment tokens, keep/mask/restart, and K = 0 through the thread equal to the sync run."""

from __future__ import annotations

import copy

import pytest
import torch
from async_support import hold_updates_until_the_producer_blocks, new_weights_inside_each_generation

import gspo.compose.train as trainer_module
import gspo.orchestration.steps as steps_module
from gspo.compose.train import train
from gspo.config import TrainConfig
from gspo.envs import Step
from gspo.envs.driver import Limits, run_episodes
from gspo.envs.tasks.base import Example
from gspo.envs.trajectory import PlainEncoder
from gspo.models.char_tokenizer import build_char_tokenizer
from gspo.models.logprobs import token_logprobs
from gspo.models.tiny_model import build_tiny_model
from gspo.orchestration.async_episodes import Restart
from gspo.orchestration.async_local import round_generate
from gspo.orchestration.async_rollout import WeightSync, snapshot
from gspo.orchestration.loop import build_async
from gspo.rollout.base import NO_VERSION, SamplingParams
from gspo.rollout.torch_engine import TorchEngine

TOK = build_char_tokenizer()
EXAMPLES = [Example(prompt="12*34=", answer="408"), Example(prompt="7+8=", answer="15")]
STOPS = tuple("0123456789 ")  # turns of a random char model end after a few tokens


class TurnsEnv:
    """Three turns; replies ' ok '; final reward: the share of even characters of the last turn
    (varied rewards from a random model)."""

    name = "turns"
    multi_turn = True
    stop_strings = STOPS

    def __init__(self, on_step=None) -> None:
        self.on_step = on_step

    def reset(self, example):
        return {"turns": 0}

    def step(self, state, text, finished):
        if self.on_step is not None:
            self.on_step()
        state["turns"] += 1
        share = sum(ord(c) % 2 == 0 for c in text) / max(len(text), 1)
        if state["turns"] >= 3:
            return Step(done=True, reward=share)
        return Step(done=False, messages=[{"role": "user", "content": " ok "}])


def _model(seed: int) -> torch.nn.Module:
    return build_tiny_model(TOK.vocab_size, hidden_size=32, num_layers=2, seed=seed).double()


class CountingSync(WeightSync):
    """Publishes ``weights`` as version 1 on the ``at``-th ``newer()`` call (the producer asks
    before each round and after every sampled token), so the switch lands mid-turn."""

    def __init__(self, load, weights, at: int) -> None:
        super().__init__(load, version=0)
        self.calls, self.at, self.pending = 0, at, weights

    def newer(self) -> bool:
        self.calls += 1
        if self.calls == self.at:
            self.publish(self.pending, 1)
        return super().newer()


def torch_hook(engine, weights, mode, counts):
    """The in-process producer's round hook over the torch engine (a pause at any token)."""
    return round_generate(engine.partial, weights, mode, counts)


def _episodes(weights_for, mode="keep", env=None, hook=torch_hook):
    """Episodes of two prompts x 3 on an engine copy of model 1, with the hook's syncs."""
    old, new = _model(1), _model(2)
    engine = TorchEngine(
        copy.deepcopy(old),
        pad_id=TOK.pad_token_id,
        eos_id=TOK.eos_token_id,
        share_weights=False,
        tokenizer=TOK,
    )

    def load(w):
        engine.model.load_state_dict(w)

    weights = weights_for(load, snapshot(new))
    counts = {"async/turn_boundary_syncs": 0, "async/mid_turn_syncs": 0}
    env = env or TurnsEnv()
    rollout, trajs = run_episodes(
        engine, env, PlainEncoder(TOK), EXAMPLES, 3,
        SamplingParams(stop_token_ids=(TOK.eos_token_id,)),
        Limits(max_turns=3, max_tokens_per_turn=8, max_total_tokens=60),
        torch.Generator().manual_seed(0), generate=hook(engine, weights, mode, counts),
    )  # fmt: skip
    return rollout, trajs, counts, old, new


def _check_versions_and_logprobs(rollout, old, new) -> None:
    """Each policy token's recorded log-prob is the log-prob of its version's weights (float64
    forward over the whole trajectory); env tokens and padding have no version and no loss."""
    pol = rollout.loss_mask.bool()  # [N, L]
    v = rollout.versions  # [N, L]
    assert ((v != NO_VERSION) == pol).all()
    assert ((rollout.extras["turn_ids"] >= 0) == pol).all()
    env = rollout.completion_mask.bool() & ~pol  # [N, L]
    assert env.any()  # the episodes really have environment tokens
    fields = (rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids)
    for model, version in ((old, 0), (new, 1)):
        lp, _ = token_logprobs(model, *fields, rollout.completion_mask)  # [N, L]
        at = v == version  # [N, L]
        assert at.any()
        torch.testing.assert_close(lp[at], rollout.logprobs[at].double(), atol=1e-6, rtol=0)


def test_turns_after_a_turn_boundary_switch_carry_the_new_version_and_its_logprobs():
    box = {}

    def weights_for(load, new_weights):
        box["w"] = WeightSync(load, version=0)
        box["new"] = new_weights
        return box["w"]

    def publish_once():  # the first environment reply: new weights before turn 2
        if "done" not in box:
            box["done"] = True
            box["w"].publish(box["new"], 1)

    rollout, _, counts, old, new = _episodes(weights_for, env=TurnsEnv(publish_once))
    assert counts == {"async/turn_boundary_syncs": 1, "async/mid_turn_syncs": 0}
    turns, v = rollout.extras["turn_ids"], rollout.versions
    assert (v[turns == 0] == 0).all() and (v[turns >= 1] == 1).all()
    assert (turns >= 1).any()
    _check_versions_and_logprobs(rollout, old, new)


def test_a_turn_paused_mid_way_continues_under_the_new_weights_with_their_logprobs():
    rollout, _, counts, old, new = _episodes(lambda load, w: CountingSync(load, w, at=4))
    assert counts["async/mid_turn_syncs"] == 1
    turns, v = rollout.extras["turn_ids"], rollout.versions
    first = turns == 0  # [N, L]
    # Some first turn holds tokens of both versions: the switch landed inside it.
    assert any(((v[i][first[i]] == 0).any() and (v[i][first[i]] == 1).any()) for i in range(6))
    _check_versions_and_logprobs(rollout, old, new)


def test_restart_mode_raises_on_new_weights_inside_an_episode():
    with pytest.raises(Restart):
        _episodes(lambda load, w: CountingSync(load, w, at=4), mode="restart")


def chunked_hook(engine, weights, mode, counts):
    """The Ray producer's round hook (chunks of one token) over a local engine standing in for
    the worker pool: the same ChunkedGeneration calls, no Ray needed."""
    from types import SimpleNamespace

    from gspo.orchestration.ray_async import RayWorkers, chunked_round_generate

    place = RayWorkers(SimpleNamespace(), 1, TOK)
    place.pool = place.engine = engine
    return chunked_round_generate(place, weights, mode, counts)


def test_chunked_rounds_switch_at_turn_boundaries_with_their_versions_and_logprobs():
    box = {}

    def weights_for(load, new_weights):
        box["w"], box["new"] = WeightSync(load, version=0), new_weights
        return box["w"]

    def publish_once():
        if "done" not in box:
            box["done"] = True
            box["w"].publish(box["new"], 1)

    env = TurnsEnv(publish_once)
    rollout, _, counts, old, new = _episodes(weights_for, env=env, hook=chunked_hook)
    assert counts == {"async/turn_boundary_syncs": 1, "async/mid_turn_syncs": 0}
    turns, v = rollout.extras["turn_ids"], rollout.versions
    assert (v[turns == 0] == 0).all() and (v[turns >= 1] == 1).all() and (turns >= 1).any()
    _check_versions_and_logprobs(rollout, old, new)


def test_chunked_rounds_take_new_weights_between_two_chunks_of_a_turn():
    rollout, _, counts, old, new = _episodes(
        lambda load, w: CountingSync(load, w, at=3), hook=chunked_hook
    )
    assert counts["async/mid_turn_syncs"] == 1
    turns, v = rollout.extras["turn_ids"], rollout.versions
    first = turns == 0  # [N, L]
    assert any(((v[i][first[i]] == 0).any() and (v[i][first[i]] == 1).any()) for i in range(6))
    _check_versions_and_logprobs(rollout, old, new)
    with pytest.raises(Restart):
        _episodes(lambda load, w: CountingSync(load, w, at=3), "restart", hook=chunked_hook)


# --- the trainer --------------------------------------------------------------------------


def _cfg(tmp_path, **kw) -> TrainConfig:
    base = dict(
        output_dir=str(tmp_path / "run"), task="calculator", steps=4, prompts_per_step=2,
        group_size=2, max_new_tokens=8, n_train=8, n_test=4, eval_every=0, progress=False,
        device="cpu", threads=1, max_total_tokens=40, num_minibatches=1, algo="gspo_token",
        credit="turn", max_staleness=1, max_turns=3, lr=1e-3, warmup_steps=0,
    )  # fmt: skip
    base.update(kw)
    return TrainConfig.of(**base)


@pytest.fixture
def turns_env(monkeypatch):
    monkeypatch.setattr(trainer_module, "env_for", lambda task, cfg, chat: TurnsEnv())


@pytest.fixture
def batches(monkeypatch):
    """Every batch the trainer updates on."""
    seen = []
    real = steps_module.update

    def spy(parts, state, batch):
        seen.append(batch)
        return real(parts, state, batch)

    monkeypatch.setattr(steps_module, "update", spy)
    return seen


def records(result) -> list[dict]:
    return [r for r in result.history if "reward/mean" in r]


def test_k1_on_the_calculator_task_logs_episode_and_async_metrics(tmp_path):
    result = train(_cfg(tmp_path))
    rs = records(result)
    assert [r["step"] for r in rs] == [1, 2, 3, 4]
    for r in rs:
        for key in ("episode/turns_mean", "episode/tool_calls_mean", "episode/env_tokens_mean",
                    "reward/final_mean", "async/staleness_max", "async/partial_fraction",
                    "async/mid_turn_syncs", "async/turn_boundary_syncs"):  # fmt: skip
            assert key in r
        assert 0 <= r["async/staleness_max"] <= 1


@pytest.mark.parametrize("mode", ["keep", "mask", "restart"])
def test_slow_producer_switches_weights_inside_episodes_within_k(
    tmp_path, monkeypatch, turns_env, batches, mode
):
    """New weights arrive inside every episode step after the first (see
    new_weights_inside_each_generation; no sleeps): staleness stays <= K, no env token is in
    the loss, and each mode does what it says."""
    waited = new_weights_inside_each_generation(monkeypatch)
    rs = records(train(_cfg(tmp_path, steps=5, async_partial=mode)))
    assert waited == [1, 2, 3, 4]
    assert all(r["async/staleness_max"] <= 1 and r["async/dropped_samples"] == 0 for r in rs)
    switches = sum(r["async/mid_turn_syncs"] + r["async/turn_boundary_syncs"] for r in rs)
    if mode == "restart":
        assert switches == 0 and sum(r["async/restarts"] for r in rs) > 0
        assert all(r["async/partial_fraction"] == 0 for r in rs)
    else:
        assert switches > 0 and any(r["async/partial_fraction"] > 0 for r in rs)
    masked = 0  # policy tokens taken out of the loss
    for b in batches:
        r = b.rollout
        masked += int(((r.versions != NO_VERSION) & (r.loss_mask == 0)).sum())
        env = r.completion_mask.bool() & (r.extras["turn_ids"] < 0)  # [N, L]
        assert env.any() and (r.loss_mask[env] == 0).all()
        assert (r.versions[env] == NO_VERSION).all()
        assert b.advantages.shape == r.completion_ids.shape  # credit='turn': [N, L]
        if mode == "mask":  # only the episode's newest version is trained on
            newest = r.versions.max(dim=1).values[:, None]  # [N, 1]
            assert (r.versions[r.loss_mask.bool()] == newest.expand_as(r.versions)[
                r.loss_mask.bool()]).all()  # fmt: skip
    assert (masked > 0) == (mode == "mask")  # keep/restart train on every policy token


@pytest.mark.parametrize("k", [1, 2])
def test_slow_trainer_keeps_async_episodes_at_the_bound(tmp_path, monkeypatch, turns_env, k):
    """Each update waits until the thread is blocked at the bound (no sleeps): every step from
    K on trains on episodes made K versions earlier, and the thread blocked once per update
    that had a step left to admit after it."""
    probe = hold_updates_until_the_producer_blocks(monkeypatch)
    rs = records(train(_cfg(tmp_path, steps=5, max_staleness=k)))
    assert [r["async/staleness_max"] for r in rs] == [min(s, k) for s in range(5)]
    assert probe.blocked == 5 - k - 1  # updates 0 .. 3 - k; the later ones find the thread done
    assert sum(r["async/rollout_idle_s"] for r in rs) > 0  # its blocked waits were timed


def test_k0_episodes_through_the_thread_equal_the_sync_run(tmp_path, monkeypatch, turns_env):
    """K = 0 builds no thread (the sync loop, unchanged); forced through the episode producer
    (at K = 0 it waits for the newest weights) metrics and weights are bit for bit the same."""
    sync = train(_cfg(tmp_path / "sync", max_staleness=0))
    monkeypatch.setattr(trainer_module, "build_source", build_async)
    thread = train(_cfg(tmp_path / "thread", max_staleness=0))
    drop = ("time/", "throughput/", "async/")
    a = [{k: v for k, v in r.items() if not k.startswith(drop)} for r in records(sync)]
    b = [{k: v for k, v in r.items() if not k.startswith(drop)} for r in records(thread)]
    assert a == b and a[0]["episode/env_tokens_mean"] > 0
    sd_a, sd_b = sync.model.state_dict(), thread.model.state_dict()
    assert all(torch.equal(sd_a[k], sd_b[k]) for k in sd_a)


def test_async_episodes_resume_trains_every_step_once(tmp_path, turns_env):
    from gspo.orchestration.logging import read_metrics

    first = train(_cfg(tmp_path, max_staleness=2, stop_after=2))
    assert [r["step"] for r in records(first)] == [1, 2]
    rest = train(_cfg(tmp_path, max_staleness=2), resume=True)
    assert [r["step"] for r in records(rest)] == [3, 4]
    assert records(rest)[0]["async/staleness_max"] == 0  # from the checkpoint's weights
    logged = [r["step"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")]
    assert [s for s in logged if s > 0] == [1, 2, 3, 4]
