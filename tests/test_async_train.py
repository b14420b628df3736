"""Asynchronous RL end to end (max_staleness, orchestration.async_source) on the smoke preset,
CPU only, with the even-character task of test_trainer (a random model earns varied reward)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from async_support import hold_updates_until_the_producer_blocks, new_weights_inside_each_generation

import gspo.compose.train as trainer_module
from gspo.compose.train import train
from gspo.config import ConfigError, TrainConfig, build
from gspo.core.checkpoint_paths import latest_checkpoint
from gspo.envs.tasks.base import Example, Task
from gspo.orchestration.logging import read_metrics
from gspo.orchestration.loop import build_async

TIMING_PREFIXES = ("time/", "throughput/", "async/")


def even_share(text: str, example: Example) -> float:
    return sum(ord(c) % 2 == 0 for c in text) / len(text) if text else 0.0


def even_task() -> Task:
    examples = [Example(prompt=f"{i}+{7 * i % 10}=", answer="") for i in range(16)]
    return Task("even", train=examples[:12], test=examples[12:], reward=even_share)


@pytest.fixture(autouse=True)
def _even_task(monkeypatch):
    monkeypatch.setattr(trainer_module, "build_task", lambda cfg: even_task())


def make_cfg(out: Path, **overrides) -> TrainConfig:
    base = {"device": "cpu", "threads": 1, "output_dir": str(out), "lr": 1e-3}
    return build(TrainConfig, preset="smoke", overrides={**base, **overrides})


def train_records(history: list[dict]) -> list[dict]:
    return [r for r in history if "reward/mean" in r]


def without_timing(record: dict) -> dict:
    return {k: v for k, v in record.items() if not k.startswith(TIMING_PREFIXES)}


def test_k0_is_the_synchronous_loop_and_the_thread_at_k0_matches_it(tmp_path, monkeypatch):
    """K = 0 builds no async part; and even forced through the rollout thread (which at K = 0
    waits for the newest weights before every step), metrics and weights are bit for bit those
    of the synchronous run: the thread's engine copy, the resumable generation and the weight
    snapshots change nothing."""
    common = {"steps": 3, "warmup_steps": 0, "eval_every": 0}
    sync = train(make_cfg(tmp_path / "sync", **common))
    k0 = train(make_cfg(tmp_path / "k0", max_staleness=0, **common))
    built = []

    def forced(parts, model):
        built.append(build_async(parts, model))
        return built[-1]

    monkeypatch.setattr(trainer_module, "build_source", forced)
    thread = train(make_cfg(tmp_path / "thread", max_staleness=0, **common))
    assert built and built[0].unused == 0
    a = [without_timing(r) for r in train_records(sync.history)]
    assert [without_timing(r) for r in train_records(k0.history)] == a
    records = train_records(thread.history)
    assert [without_timing(r) for r in records] == a
    assert all(r["async/staleness_max"] == 0 for r in records)
    for other in (k0, thread):
        sd_a, sd_b = sync.model.state_dict(), other.model.state_dict()
        assert all(torch.equal(sd_a[k], sd_b[k]) for k in sd_a)


@pytest.mark.parametrize("mode", ["keep", "mask", "restart"])
def test_async_run_bounds_staleness_and_logs_async_metrics(tmp_path, mode):
    cfg = make_cfg(tmp_path, steps=6, max_staleness=1, async_partial=mode, eval_every=0)
    result = train(cfg)
    records = train_records(result.history)
    assert [r["step"] for r in records] == list(range(1, 7))
    for r in records:
        assert 0 <= r["async/staleness_max"] <= 1
        assert r["async/dropped_samples"] == 0
        assert 0 <= r["async/partial_fraction"] <= 1
        assert r["async/trainer_idle_s"] >= 0 and r["async/rollout_idle_s"] >= 0
        if mode == "restart":
            assert r["async/partial_fraction"] == 0
    # The first batch comes from the initial weights; later ones may be one version behind.
    assert records[0]["async/staleness_max"] == 0


def test_async_resume_trains_every_step_once(tmp_path):
    common = {"steps": 4, "max_staleness": 2, "eval_every": 0}
    first = train(make_cfg(tmp_path, stop_after=2, **common))
    assert [r["step"] for r in train_records(first.history)] == [1, 2]
    assert latest_checkpoint(tmp_path).name == "step_000002"
    rest = train(make_cfg(tmp_path, **common), resume=True)
    assert [r["step"] for r in train_records(rest.history)] == [3, 4]
    # The resumed thread starts from the checkpoint's weights: its first batch is fresh.
    assert train_records(rest.history)[0]["async/staleness_max"] == 0
    steps = [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl") if "reward/mean" in r]
    assert steps == [1, 2, 3, 4]  # every step once: nothing trained twice, nothing skipped


def test_bad_async_fields_fail_before_work(tmp_path):
    with pytest.raises(ConfigError, match="max_staleness"):
        make_cfg(tmp_path, max_staleness=-1)
    with pytest.raises(ConfigError, match="async_partial"):
        make_cfg(tmp_path, max_staleness=1, async_partial="drop")
    with pytest.raises(ConfigError, match="dynamic_sampling"):
        make_cfg(tmp_path, max_staleness=1, dynamic_sampling=True)


@pytest.mark.slow
def test_async_run_learns(tmp_path, monkeypatch):
    """K = 2 on the even-character task: the reward rises as much as in the synchronous run.
    The thread is held exactly K versions ahead (no sleeps), so which weights made which sample,
    and the run's numbers, do not depend on the machine's load."""
    hold_updates_until_the_producer_blocks(monkeypatch)  # K = 0 builds no thread: unaffected
    results = {}
    for k in (0, 2):
        cfg = make_cfg(
            tmp_path / f"k{k}", steps=40, lr=3e-3, warmup_steps=0, eval_every=0, max_staleness=k
        )
        rewards = [r["reward/mean"] for r in train_records(train(cfg).history)]
        results[k] = (sum(rewards[:8]) / 8, sum(rewards[-8:]) / 8)
    print(results)
    for first, last in results.values():
        assert last > first + 0.1


@pytest.mark.parametrize("k", [1, 2])
def test_slow_engine_in_the_loop_continues_partial_rollouts_within_k(tmp_path, monkeypatch, k):
    """New weights arrive mid-generation (see new_weights_inside_each_generation; no sleeps),
    generations are continued under them, and no sample is more than K versions behind."""
    waited = new_weights_inside_each_generation(monkeypatch)
    result = train(make_cfg(tmp_path, steps=6, max_staleness=k, eval_every=0, max_new_tokens=8))
    records = train_records(result.history)
    assert waited == [1, 2, 3, 4, 5]  # every step after the first got new weights inside
    assert max(r["async/staleness_max"] for r in records) <= k
    assert [r["async/partial_fraction"] > 0 for r in records] == [False] + [True] * 5
    assert all(r["async/dropped_samples"] == 0 for r in records)


@pytest.mark.parametrize("k", [1, 2])
def test_slow_trainer_in_the_loop_keeps_the_thread_at_the_bound(tmp_path, monkeypatch, k):
    """Each update waits until the thread is blocked at the bound (no sleeps): the thread runs
    ahead exactly K versions and waits, once per update that had a step left to admit."""
    probe = hold_updates_until_the_producer_blocks(monkeypatch)
    result = train(make_cfg(tmp_path, steps=6, max_staleness=k, eval_every=0))
    records = train_records(result.history)
    assert [r["async/staleness_max"] for r in records] == [min(s, k) for s in range(6)]
    assert probe.blocked == 6 - k - 1
    assert sum(r["async/rollout_idle_s"] for r in records) > 0  # its blocked waits were timed


def test_mask_mode_drops_tokens_older_than_the_rows_newest_version():
    from gspo.orchestration.async_source import mask_older_tokens
    from gspo.rollout.base import Rollout

    versions = torch.tensor([[3, 3, 4, 4], [3, 3, 3, -1], [4, -1, -1, -1]])  # [N, L]
    cmask = (versions >= 0).long()
    r = Rollout(
        prompt_ids=torch.ones(3, 1, dtype=torch.long),
        prompt_mask=torch.ones(3, 1, dtype=torch.long),
        completion_ids=torch.ones(3, 4, dtype=torch.long),
        completion_mask=cmask,
        logprobs=torch.zeros(3, 4),
        finish_reasons=["stop"] * 3,
        prompt_index=torch.arange(3),
        versions=versions,
    )
    out = mask_older_tokens(r)
    assert out.loss_mask.tolist() == [[0, 0, 1, 1], [1, 1, 1, 0], [1, 0, 0, 0]]
    assert out.completion_mask.tolist() == cmask.tolist()  # still attended to


def test_forced_thread_at_k0_resumes_exactly(tmp_path, monkeypatch):
    """Through the rollout thread at K = 0 (deterministic: it waits for the newest weights), a
    run stopped and resumed equals the unbroken run: the thread's engine starts from the
    checkpoint's weights, not from the freshly built model."""
    monkeypatch.setattr(trainer_module, "build_source", build_async)
    common = {"steps": 4, "warmup_steps": 0, "eval_every": 0}
    whole = train(make_cfg(tmp_path / "a", **common))
    train(make_cfg(tmp_path / "b", stop_after=2, **common))
    rest = train(make_cfg(tmp_path / "b", **common), resume=True)
    a_late = [without_timing(r) for r in train_records(whole.history) if r["step"] > 2]
    assert [without_timing(r) for r in train_records(rest.history)] == a_late
    sd_a, sd_b = whole.model.state_dict(), rest.model.state_dict()
    assert all(torch.equal(sd_a[k], sd_b[k]) for k in sd_a)


def test_the_loop_pulls_every_batch_from_its_source(tmp_path, monkeypatch):
    """One BatchSource for sync and async: K = 0 builds the synchronous source, and the loop
    takes each step's batch from the run's source and publishes version step + 1 to it."""
    from gspo.orchestration.loop import BatchSource, SyncSource, build_source

    calls = []

    class Spy(SyncSource):
        def collect(self, parts, state):
            calls.append(("collect", state.step))
            return super().collect(parts, state)

        def publish(self, model, version):
            calls.append(("publish", version))

    def spy(parts, model):
        built = build_source(parts, model)
        assert type(built) is SyncSource and isinstance(built, BatchSource)
        return Spy()

    monkeypatch.setattr(trainer_module, "build_source", spy)
    train(make_cfg(tmp_path, steps=2, eval_every=0))
    assert calls == [("collect", 0), ("publish", 1), ("collect", 1), ("publish", 2)]
