"""The staleness-bounded buffer (orchestration.async_buffer) and the rollout thread's bound
(orchestration.async_rollout) under a deliberately slow trainer and a deliberately slow producer."""

from __future__ import annotations

import threading

import pytest
from async_support import HANG_S, hold_updates_until_the_producer_blocks

from gspo.orchestration.async_buffer import StalenessBuffer, batch_metrics
from gspo.orchestration.async_rollout import Produced, RolloutThread, WeightSync


def test_fresh_complete_groups_are_taken_with_their_staleness():
    b = StalenessBuffer(group_size=2, max_staleness=1)
    b.put_group((5, 0), [4, 4], [4, 5])  # one sample continued under version 5
    b.put_group((5, 1), [5, 5], [5, 5])
    assert b.take(5, trainer_version=5) is None  # the producer has not closed step 5
    b.close(5)
    groups = b.take(5, trainer_version=5)
    assert [g.key for g in groups] == [(5, 0), (5, 1)]
    m = batch_metrics(groups, trainer_version=5)
    assert m == {
        "async/staleness_mean": 0.5,
        "async/staleness_max": 1,
        "async/partial_fraction": 0.25,
    }
    assert b.accounted() and b.counters.taken == 4


def test_stale_groups_are_dropped_and_counted():
    b = StalenessBuffer(group_size=2, max_staleness=1)
    b.put_group((7, 0), [5, 6], [6, 6])  # oldest token 2 versions behind step 7
    b.put_group((7, 1), [6, 6], [6, 7])
    b.close(7)
    groups = b.take(7, trainer_version=7)
    assert [g.key for g in groups] == [(7, 1)]
    assert b.counters.dropped_stale == 2
    assert all(g.staleness(7) <= 1 for g in groups)
    assert b.accounted()


def test_partial_groups_never_reach_a_batch():
    b = StalenessBuffer(group_size=3, max_staleness=2)
    b.put((1, 0), 0, oldest=1, newest=1)
    b.put((1, 0), 2, oldest=1, newest=1)  # sample 1 never arrives
    b.put_group((1, 1), [1, 1, 1], [1, 1, 1])
    b.close(1)
    groups = b.take(1, trainer_version=1)
    assert [g.key for g in groups] == [(1, 1)]
    assert b.counters.dropped_partial == 2
    assert b.accounted()


def test_partial_group_that_became_stale_is_evicted():
    b = StalenessBuffer(group_size=2, max_staleness=1)
    b.put((3, 0), 0, oldest=1, newest=1)
    b.evict(trainer_version=2)
    assert (3, 0) in b.groups  # 1 version behind: may still complete
    b.evict(trainer_version=3)
    assert not b.groups and b.counters.dropped_partial == 1


def test_no_sample_twice():
    b = StalenessBuffer(group_size=2, max_staleness=1)
    b.put((0, 0), 0, 0, 0)
    with pytest.raises(ValueError, match="put twice"):
        b.put((0, 0), 0, 0, 0)
    b.put((0, 0), 1, 0, 0)
    b.close(0)
    b.take(0, 0)
    with pytest.raises(ValueError, match="already taken"):
        b.take(0, 0)
    with pytest.raises(ValueError, match="counted twice"):
        b.put((0, 1), 0, 0, 0)
    with pytest.raises(ValueError, match="max_staleness"):
        StalenessBuffer(2, -1)


def test_drop_all_counts_what_is_left():
    b = StalenessBuffer(group_size=2, max_staleness=1)
    b.put_group((4, 0), [3, 3], [3, 3])
    b.put((4, 1), 0, 3, 3)
    assert b.drop_all() == 3
    assert b.accounted() and not b.groups


# --- the rollout thread with a fake engine ---------------------------------------------------

GROUPS, SIZE, TOKENS = 2, 3, 6


def _run(k: int, slow: str, monkeypatch, steps: int = 8):
    """A fake producer (``TOKENS`` tokens, new weights picked up between tokens, as the torch
    producer does) and a fake trainer, one of them slow by construction rather than by sleeps:

    - ``slow="trainer"``: each update waits until the producer is blocked at the bound (or
      done), so it is always K versions ahead;
    - ``slow="producer"``: after its first token of a step ahead of the trainer the producer
      waits for new weights, and the trainer publishes them only once that token is sampled,
      so every step after the first spans two versions.
    """
    loaded: list[int] = []
    probe = hold_updates_until_the_producer_blocks(monkeypatch) if slow == "trainer" else None
    cond = threading.Condition()
    started = [-1]  # the last step whose first token the producer sampled

    def produce(step: int, w: WeightSync) -> Produced:
        versions = []
        for i in range(TOKENS):
            versions.append(w.version)
            if slow == "producer" and i == 0:
                with cond:
                    started[0] = step
                    cond.notify_all()
                if w.version < step:  # ahead of the trainer: wait for its next weights
                    w.wait_for(w.version + 1)
            w.sync()
        lo, hi = min(versions), max(versions)
        return Produced([[lo] * SIZE] * GROUPS, [[hi] * SIZE] * GROUPS, step, 0.0)

    t = RolloutThread(produce, loaded.append, start=0, end=steps, group_size=SIZE, max_staleness=k)
    t.start()
    records = []
    for step in range(steps):
        groups, m = t.take(step)
        assert len(groups) == GROUPS and groups[0].payload == step
        records.append(m)
        if probe is not None:  # the update
            probe.wait()
        elif step + 1 < steps:
            with cond:
                assert cond.wait_for(lambda s=step: started[0] > s, timeout=HANG_S)
        t.publish(object(), step + 1)
    assert t.close() == 0
    assert t.buffer.accounted()
    assert threading.active_count() >= 1
    return records, loaded, probe


@pytest.mark.parametrize("k", [1, 2])
def test_staleness_bounded_under_a_slow_trainer(k, monkeypatch):
    records, _, probe = _run(k, "trainer", monkeypatch)
    # The producer runs ahead as far as allowed, and then waits for the trainer.
    assert [m["async/staleness_max"] for m in records] == [min(s, k) for s in range(8)]
    assert probe.blocked == 8 - k - 1  # once per update with a step left to admit after it
    assert sum(m["async/rollout_idle_s"] for m in records) > 0  # its blocked waits were timed
    assert sum(m["async/dropped_samples"] for m in records) == 0


@pytest.mark.parametrize("k", [1, 2])
def test_staleness_bounded_under_a_slow_producer(k, monkeypatch):
    records, loaded, _ = _run(k, "producer", monkeypatch)
    # Weights arrive mid-generation, so every step after the first spans two versions.
    assert [m["async/staleness_max"] for m in records] == [0] + [1] * 7
    assert [m["async/partial_fraction"] > 0 for m in records] == [False] + [True] * 7
    assert loaded  # the producer loaded new weights


def test_producer_errors_reach_the_trainer():
    def produce(step, w):
        raise RuntimeError("engine broke")

    t = RolloutThread(produce, lambda w: None, start=0, end=2, group_size=1, max_staleness=1)
    t.start()
    with pytest.raises(RuntimeError, match="rollout thread failed"):
        t.take(0)
    t.close()
