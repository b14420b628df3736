"""Rewards scored in Ray tasks (``reward_placement``): the same rewards and error counts as the
driver's ``score``, for sandboxed code, a reward that raises, one that returns NaN and one that
times out; a task whose worker dies counts its chunk as errors; an unpicklable reward is refused
when the scorer is built."""

from __future__ import annotations

import os
import threading
import time

import pytest

from gspo.config import ConfigError, TrainConfig, build
from gspo.envs.rewards import code_reward, score, zero_failed
from gspo.orchestration.ray_rewards import RayScorer, chunk_bounds, use_ray_tasks

if os.environ.get("GSPO_REQUIRE_RAY") != "1":
    pytest.importorskip("ray")

pytestmark = pytest.mark.slow  # needs Ray; the fast tier leaves it out (docs/testing.md)

WRONG = "```python\ndef f(x):\n    return x + 1\n```"
LOOP = "```python\nwhile True:\n    pass\n```"


@pytest.fixture(scope="module")
def ray_session():
    from gspo.backend.ray_cluster import start_ray, stop_ray

    ray = start_ray(None, num_cpus=2)
    yield ray
    stop_ray(ray)


def test_chunk_bounds_cover_the_batch_in_order():
    assert chunk_bounds(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert chunk_bounds(2, 8) == [(0, 1), (1, 2)]  # no empty chunks
    assert chunk_bounds(0, 4) == [(0, 0)]
    for n, k in ((128, 8), (7, 2), (5, 5)):
        bounds = chunk_bounds(n, k)
        assert [i for a, b in bounds for i in range(a, b)] == list(range(n))


def _mixed_reward():
    """Sandboxed code reward, except three markers: raise, NaN, and a call past the timeout
    (a closure: cloudpickle sends it by value to the Ray workers)."""

    def reward(completion, example):
        if completion == "RAISE":
            raise RuntimeError("a buggy reward")
        if completion == "NAN":
            return float("nan")
        if completion == "SLEEP":
            time.sleep(60.0)  # far past the timeout whatever the machine's load
            return 1.0
        return code_reward(completion, example, test_timeout_s=0.5)

    return reward


def test_ray_rewards_equal_driver_rewards_with_errors_and_timeouts(ray_session):
    from gspo.envs.tasks import make_task

    task = make_task("code", n_train=4, n_test=1, difficulty=2)
    examples = [task.train[i % 4] for i in range(10)]
    completions = [e.demo for e in examples[:4]] + [WRONG, LOOP, "RAISE", "NAN", "SLEEP", ""]
    reward = _mixed_reward()
    # The timeout is generous: a loaded machine may take seconds to start the sandbox that stops
    # LOOP at its own 0.5 s limit, which must score 0 (wrong), not a timeout error.
    local, local_errors = score(reward, completions, examples, timeout_s=8.0, workers=2)
    scorer = RayScorer(ray_session, 3, (reward,))
    remote, remote_errors = zero_failed(scorer.each(reward, completions, examples, timeout_s=8.0))
    print(f"driver {local} ({local_errors} errors); ray tasks {remote} ({remote_errors})")
    assert local[:4] == [1.0] * 4  # the reference solutions pass: the sandbox ran
    assert local_errors == 3  # raise, NaN, timeout
    assert remote == local and remote_errors == local_errors


def test_a_dead_reward_task_counts_its_chunk_as_errors(ray_session):
    def reward(completion, example):
        if completion == "DIE":
            os._exit(1)  # the Ray worker process dies, not the reward call alone
        return float(len(completion))

    scorer = RayScorer(ray_session, 2)
    rewards, errors = zero_failed(scorer.each(reward, ["a", "bb", "ccc", "DIE"], [None] * 4))
    assert rewards == [1.0, 2.0, 0.0, 0.0] and errors == 2  # chunk 2 of 2 died


def test_unpicklable_reward_is_refused_when_built(ray_session):
    lock = threading.Lock()

    def locked(completion, example):
        with lock:
            return 1.0

    with pytest.raises(ValueError, match="reward locked cannot be sent to Ray tasks"):
        RayScorer(ray_session, 2, (locked,))


def test_reward_placement_config():
    cfg = build(TrainConfig, preset="smoke", overrides={"backend": "ray"})
    assert not use_ray_tasks(cfg, lambda c, e: 0.0)  # auto: cheap rewards stay in the driver
    assert use_ray_tasks(cfg, code_reward)  # auto: sandboxed rewards go to Ray tasks
    forced = build(
        TrainConfig, preset="smoke", overrides={"backend": "ray", "reward_placement": "ray"}
    )
    assert use_ray_tasks(forced, lambda c, e: 0.0)
    off = build(
        TrainConfig, preset="smoke", overrides={"backend": "ray", "reward_placement": "driver"}
    )
    assert not use_ray_tasks(off, code_reward)
    with pytest.raises(ConfigError, match="reward_placement='ray' needs backend='ray'"):
        build(TrainConfig, preset="smoke", overrides={"reward_placement": "ray"})
    with pytest.raises(ConfigError, match="reward_placement must be one of"):
        build(TrainConfig, preset="smoke", overrides={"reward_placement": "cluster"})
