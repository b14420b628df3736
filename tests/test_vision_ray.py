"""Image prompts on Ray: pixel inputs travel to rollout workers and FSDP2 ranks by reference (one
object-store copy per step), and a 2-rank + 1-worker run on `shapes` equals the local run."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("PIL")

from gspo.config import TrainConfig, build
from gspo.models.vision import PixelInputs
from gspo.rollout.base import PIXELS, GenerationRequest, SamplingParams

# The tolerance of the text Ray-vs-local test (tests/test_ray_train.py): float64, 2 ranks sum
# their gradients in another order than one process.
METRIC_REL = 1e-6


def _tensor_bytes(obj) -> int:
    """Bytes of every tensor inside ``obj`` (tuples, lists, dicts, dataclasses)."""
    if isinstance(obj, torch.Tensor):
        return obj.nelement() * obj.element_size()
    if isinstance(obj, (tuple, list)):
        return sum(_tensor_bytes(x) for x in obj)
    if isinstance(obj, dict):
        return sum(_tensor_bytes(x) for x in obj.values())
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return sum(_tensor_bytes(getattr(obj, f.name)) for f in dataclasses.fields(obj))
    return 0


def _pixels(prompts: int) -> PixelInputs:
    g = torch.Generator().manual_seed(0)
    return PixelInputs(
        torch.rand(prompts, 1, 3, 56, 56, generator=g), torch.ones(prompts, 1, 56, 56).bool()
    )


def test_pool_payloads_carry_one_ref_and_each_share(monkeypatch):
    """Without Ray: the workers' payloads hold the ObjectRef of one put and their share's
    range, no pixel tensor; the ranks' batch too, from the same put."""
    from gspo.backend import ray_refs
    from gspo.backend.ray_refs import PixelRefs
    from gspo.orchestration.ray_rollout import RolloutPool

    class Ref:  # stands for ray.ObjectRef
        pass

    monkeypatch.setattr(ray_refs, "is_ref", lambda value: isinstance(value, Ref))
    puts = []
    fake_ray = SimpleNamespace(put=lambda obj: puts.append(obj) or Ref())
    pool = RolloutPool.__new__(RolloutPool)
    pool.workers, pool.refs = [object(), object()], PixelRefs(fake_ray)
    pixels = _pixels(5)
    prompts = [[1, 2, 3]] * 5
    requests = pool.requests(
        GenerationRequest(prompts, 4, SamplingParams(), torch.Generator(), pixels)
    )
    assert [r[-1] for r in requests] == [(0, 3), (3, 5)]  # contiguous shares of 5 over 2
    assert all(isinstance(r[-2], Ref) for r in requests) and requests[0][-2] is requests[1][-2]
    assert all(_tensor_bytes(r) < pixels.values[0].nbytes for r in requests)
    rollout = dataclasses.make_dataclass("R", [("extras", dict)])(extras={PIXELS: pixels})
    sent = pool.refs.by_reference(rollout)
    assert sent.extras[PIXELS] is requests[0][-2]  # the ranks read the workers' copy
    assert len(puts) == 1 and puts[0] is pixels
    # Text prompts: the payload is what it always was.
    assert all(
        len(r) == 4 for r in pool.requests(GenerationRequest(prompts, 4, SamplingParams(), None))
    )


def _cfg(tmp_path, name: str, **kw) -> TrainConfig:
    values = dict(
        model="tiny-vl",
        task="shapes",
        output_dir=str(tmp_path / name),
        device="cpu",
        dtype="float64",
        threads=1,
        steps=2,
        prompts_per_step=3,  # 3 prompts over 2 ranks: rows of one prompt on both ranks
        group_size=4,
        eval_every=2,
        n_test=4,
        micro_batch_size=3,
        lr=3e-3,
        max_new_tokens=6,
        overlong_buffer=4,  # rewards that differ within groups (the untrained model scores 0)
        old_logprobs="recompute",  # the ranks' recompute forward takes the pixels too
        kl_coef=0.01,  # and the reference's
    )
    return build(TrainConfig, preset="smoke", overrides={**values, **kw})


def _records(path) -> list[dict]:
    return [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.skipif(
    os.environ.get("GSPO_REQUIRE_RAY") != "1" and importlib.util.find_spec("ray") is None,
    reason="needs Ray: pip install 'gspo[ray]'",
)
@pytest.mark.slow
def test_ray_image_run_equals_local_and_sends_pixels_by_reference(tmp_path, monkeypatch):
    import ray

    from gspo.backend.ray_refs import PixelRefs
    from gspo.compose.train import train
    from gspo.orchestration.ray_rollout import RolloutPool

    local = train(_cfg(tmp_path, "local"))

    payloads, puts, sent = [], [], []
    requests, ref, by_reference = RolloutPool.requests, PixelRefs.ref, PixelRefs.by_reference

    def record_requests(self, *args, **kw):
        out = requests(self, *args, **kw)
        payloads.extend(out)
        return out

    def record_put(self, pixels):
        if self._last is None or self._last[0] is not pixels:
            puts.append(pixels)
        return ref(self, pixels)

    def record_sent(self, rollout):
        out = by_reference(self, rollout)
        sent.append(out)
        return out

    monkeypatch.setattr(RolloutPool, "requests", record_requests)
    monkeypatch.setattr(PixelRefs, "ref", record_put)
    monkeypatch.setattr(PixelRefs, "by_reference", record_sent)
    remote = train(_cfg(tmp_path, "ray", backend="ray", trainer_workers=2, rollout_workers=1))
    assert not ray.is_initialized()

    a, b = _records(local.output_dir), _records(remote.output_dir)
    assert [r["step"] for r in a] == [r["step"] for r in b]
    steps = [r for r in a if "reward/mean" in r]
    assert len(steps) == 2 and any("eval/greedy_accuracy" in r for r in a)  # eval on the worker
    assert any(r["reward/std"] > 0 for r in steps)  # rewards differ in groups: weights move
    for ra, rb in zip(a, b, strict=True):
        keys = {k for k in ra if not k.startswith(("time/", "throughput/"))}
        assert keys == {k for k in rb if not k.startswith(("time/", "throughput/"))}
        for k in keys:
            assert float(rb[k]) == pytest.approx(float(ra[k]), rel=METRIC_REL, abs=1e-9), k
    from safetensors.torch import load_file

    wl, wr = (load_file(str(r.output_dir / "final" / "model.safetensors")) for r in (local, remote))
    assert wl.keys() == wr.keys()
    assert max(float((wl[k] - wr[k]).abs().max()) for k in wl) < 1e-9  # test_ray_train's

    # By reference: every generation's payload carries an ObjectRef and no pixel tensor (a
    # prompt's pixels are 75 KB in float64; a payload's tensors are its generator state).
    one_prompt = 3 * 56 * 56 * 8
    assert payloads and all(isinstance(p[4], ray.ObjectRef) for p in payloads)
    assert max(_tensor_bytes(p) for p in payloads) < one_prompt / 10
    # The ranks' batches (recompute, reference, update) carry the ref too, and no extra put:
    # one object-store copy per generation serves the worker and both ranks.
    pixel_batches = [s for s in sent if PIXELS in s.extras]
    assert pixel_batches
    assert all(isinstance(s.extras[PIXELS], ray.ObjectRef) for s in pixel_batches)
    assert len(puts) == len(payloads)


def test_entropy_of_a_vl_policy_is_finite():
    """The blocked <image> token (p = 0, log p = -inf) adds 0 to the entropy, not NaN: Ray and
    local runs compare every metric, and NaN equals nothing."""
    from gspo.models.logprobs import token_logprobs
    from gspo.models.vision import build_tiny_vl

    model, tok = build_tiny_vl(seed=0)
    prompt = torch.tensor([tok("count red=")["input_ids"]])  # [1, P]
    completion = torch.tensor([tok("2")["input_ids"]])  # [1, L]
    _, entropy = token_logprobs(
        model,
        prompt,
        torch.ones_like(prompt),
        completion,
        torch.ones_like(completion),
        with_entropy=True,
    )  # [1, L]
    assert torch.isfinite(entropy).all() and (entropy > 0).all()


def test_dynamic_sampling_keeps_groups_of_image_prompts():
    """Dynamic sampling drops whole groups of an image rollout; the per-prompt pixels stay
    whole (rows keep their prompt indices) instead of being refused as MoE routing."""
    from gspo.orchestration.dynamic_sampling import select_groups
    from gspo.rollout.base import Rollout, RolloutBatch

    prompts, group = 3, 2
    n = prompts * group
    pixels = _pixels(prompts)
    rollout = Rollout(
        prompt_ids=torch.ones(n, 2, dtype=torch.long),
        prompt_mask=torch.ones(n, 2, dtype=torch.long),
        completion_ids=torch.ones(n, 3, dtype=torch.long),
        completion_mask=torch.ones(n, 3, dtype=torch.long),
        logprobs=torch.zeros(n, 3),
        finish_reasons=["stop"] * n,
        prompt_index=torch.arange(prompts).repeat_interleave(group),  # [N]
        extras={PIXELS: pixels},
    )
    kept = select_groups(
        RolloutBatch(rollout, torch.zeros(n, dtype=torch.float64)), torch.tensor([0, 2]), group
    )
    assert kept.rollout.prompt_index.tolist() == [0, 0, 2, 2]
    assert kept.rollout.extras[PIXELS] is pixels
