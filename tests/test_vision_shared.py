"""The training forward runs the vision tower once per prompt and shares its features by rows."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("PIL")

from PIL import Image

import gspo.models.vision as vision
from gspo.config.train import TrainConfig
from gspo.models.logprobs import token_logprobs
from gspo.models.policy import build_policy, build_prompt_format
from gspo.rollout.base import GenerationRequest, SamplingParams
from gspo.rollout.torch_engine import TorchEngine

# One image, two images, none (padding images), and the first image again in another prompt.
PROMPTS = ["How many red? <image>", "<image> left, <image> right: same?", "2+2=", "<image> = ?"]
GROUP = 3


def _images():
    red = Image.new("RGB", (40, 20), (255, 0, 0))
    return [
        (red,),
        (Image.new("RGB", (16, 30), (0, 255, 0)), Image.new("RGB", (64, 64), (0, 0, 255))),
        (),
        (red,),
    ]


@pytest.fixture(scope="module")
def rollout():
    opts = TrainConfig.of(model="tiny-vl", dtype="float64").model
    model, tok = build_policy(opts, torch.device("cpu"), seed=0)
    fmt = build_prompt_format(opts, tok, model)
    ids, pixels = fmt.encode_images(PROMPTS, _images())
    engine = TorchEngine(model, pad_id=tok.pad_token_id, eos_id=tok.eos_token_id, tokenizer=tok)
    params = SamplingParams(max_new_tokens=6, temperature=1.0, stop_token_ids=fmt.stop_token_ids)
    out = engine.generate(
        GenerationRequest(ids, GROUP, params, torch.Generator().manual_seed(0), pixels=pixels)
    )
    # Rows out of prompt order, as a shuffled micro-batch holds them.
    order = torch.randperm(out.num_samples, generator=torch.Generator().manual_seed(1))
    rows = tuple(
        t.index_select(0, order)
        for t in (
            out.prompt_ids,
            out.prompt_mask,
            out.completion_ids,
            out.completion_mask,
            out.prompt_index,
            out.logprobs,
        )
    )
    return model, pixels, rows


def _logprobs(model, pixels, rows):
    *args, index, _ = rows
    lp, _ = token_logprobs(model, *args, prompt_index=index, pixels=pixels)  # [N, L]
    return lp


def test_vision_tower_runs_once_per_prompt(rollout, monkeypatch):
    model, pixels, rows = rollout
    seen: list[int] = []  # images per vision-tower call
    hook = model.model.vision_model.register_forward_hook(
        lambda _m, _args, kwargs, _out: seen.append(kwargs["pixel_values"].shape[0]),
        with_kwargs=True,
    )
    try:
        _logprobs(model, pixels, rows)
        # 4 prompts with 1 + 2 + 0 + 1 real images: the tower sees each once, not GROUP times.
        assert seen == [4]
        seen.clear()
        monkeypatch.setattr(vision, "image_inputs", vision.per_row_image_inputs)
        _logprobs(model, pixels, rows)
        assert seen == [4 * GROUP]
    finally:
        hook.remove()


def test_shared_logprobs_equal_engine_and_per_row_float64(rollout, monkeypatch):
    model, pixels, rows = rollout
    shared = _logprobs(model, pixels, rows)
    assert rows[3].sum() > 0 and shared.dtype == torch.float64
    torch.testing.assert_close(shared, rows[-1], rtol=0, atol=1e-10)  # the engine's
    monkeypatch.setattr(vision, "image_inputs", vision.per_row_image_inputs)
    torch.testing.assert_close(_logprobs(model, pixels, rows), shared, rtol=0, atol=1e-12)


def _grads(model, pixels, rows) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    lp = _logprobs(model, pixels, rows)  # [N, L]
    # Rows weighted differently, so each row's share of the tower's gradient counts.
    weights = torch.arange(1, lp.shape[0] + 1, dtype=lp.dtype).unsqueeze(1)  # [N, 1]
    (lp * weights).sum().backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_shared_features_gradients_equal_per_row(rollout, monkeypatch):
    model, pixels, rows = rollout
    shared = _grads(model, pixels, rows)
    monkeypatch.setattr(vision, "image_inputs", vision.per_row_image_inputs)
    per_row = _grads(model, pixels, rows)
    model.zero_grad(set_to_none=True)
    assert shared.keys() == per_row.keys()
    tower = [n for n in shared if "vision_model" in n]
    connector = [n for n in shared if "connector" in n]
    assert tower and connector
    assert all(shared[n].abs().sum() > 0 for n in tower + connector)
    for name in shared:
        torch.testing.assert_close(shared[name], per_row[name], rtol=1e-9, atol=1e-12)


def test_image_token_count_must_match_features(rollout):
    model, pixels, rows = rollout
    ids = rows[0].clone()
    ids[ids == model.config.image_token_id] = 5  # drop every image token
    with pytest.raises(ValueError, match="image tokens in the rows"):
        vision.image_inputs(model, ids, pixels, rows[4])
