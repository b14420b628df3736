"""tiny-qwen-vl: Qwen2.5-VL's M-RoPE positions in the torch engine and the training forward."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("PIL")
from PIL import Image
from transformers import Qwen2_5_VLForConditionalGeneration

from gspo.config.options import ModelOptions
from gspo.config.train import TrainConfig
from gspo.interface.cli import main
from gspo.models.logprobs import token_logprobs
from gspo.models.model_io import load_model, load_tokenizer, save_model
from gspo.models.policy import build_policy, build_prompt_format
from gspo.models.vision import is_vision_model
from gspo.models.vision_qwen import QwenPixelInputs, QwenVLProcessor, mrope_positions
from gspo.rollout.base import GenerationRequest, SamplingParams
from gspo.rollout.torch_engine import TorchEngine


def _opts(**kw) -> ModelOptions:
    return TrainConfig.of(**{"model": "tiny-qwen-vl", **kw}).model


@pytest.fixture(scope="module")
def qvl64():
    opts = _opts(dtype="float64")
    model, tok = build_policy(opts, torch.device("cpu"), seed=0)
    return model, tok, build_prompt_format(opts, tok, model)


# Two image sizes (56x56: a 4x4 patch grid, 4 image tokens; 84x56: 4x6, 6 tokens, a 2x3 grid of
# merged tokens, so height and width positions differ), two images in one prompt, and a text
# prompt: rows of three widths, left-padded in one batch.
PROMPTS = ["<image>count red=", "look: <image> then <image> blue=", "2+2="]


def _images():
    return [
        (Image.new("RGB", (56, 56), (255, 0, 0)),),
        (Image.new("RGB", (84, 56), (0, 255, 0)), Image.new("RGB", (56, 56), (0, 0, 255))),
        (),
    ]


def _engine(model, tok):
    return TorchEngine(model, pad_id=tok.pad_token_id, eos_id=tok.eos_token_id, tokenizer=tok)


def test_tiny_qwen_vl_builds_with_its_processor(qvl64):
    model, tok, fmt = qvl64
    assert isinstance(model, Qwen2_5_VLForConditionalGeneration) and is_vision_model(model)
    assert isinstance(fmt.processor, QwenVLProcessor) and fmt.chat
    assert tok.convert_tokens_to_ids("<|im_end|>") in fmt.stop_token_ids
    ids, pixels = fmt.encode_images(PROMPTS, _images())
    pad = tok.convert_tokens_to_ids("<|image_pad|>")
    start = tok.convert_tokens_to_ids("<|vision_start|>")
    assert [row.count(pad) for row in ids] == [4, 6 + 4, 0]
    assert [row.count(start) for row in ids] == [1, 2, 0]
    assert isinstance(pixels, QwenPixelInputs)
    assert [g.tolist() for g in pixels.grids] == [[[1, 4, 4]], [[1, 4, 6], [1, 4, 4]], []]
    assert [p.shape[0] for p in pixels.patches] == [16, 24 + 16, 0]  # 14-px patches


def test_positions_are_three_dimensional(qvl64):
    model, _, fmt = qvl64
    ids, pixels = fmt.encode_images(PROMPTS[1:2], _images()[1:2])
    row = torch.tensor(ids)
    pos, deltas = mrope_positions(model, row, torch.ones_like(row), pixels.rows(torch.tensor([0])))
    assert pos.shape == (3, 1, row.shape[1])
    # The 84x56 image's 6 tokens span 3 positions (its widest side); the 56x56 one's 4 span 2:
    # the text after them runs (6 - 3) + (4 - 2) = 5 behind its token count.
    assert deltas.tolist() == [-5]
    assert not torch.equal(pos[1], pos[2])  # height and width differ on the image tokens


def test_engine_logprobs_equal_training_forward_float64(qvl64):
    model, tok, fmt = qvl64
    ids, pixels = fmt.encode_images(PROMPTS, _images())
    assert len({len(r) for r in ids}) == 3  # left padding of three widths
    params = SamplingParams(max_new_tokens=8, temperature=1.0, stop_token_ids=fmt.stop_token_ids)
    for n, seed in ((3, 0), (1, 1)):  # the shared prefill (n > 1) and the per-row one
        out = _engine(model, tok).generate(
            GenerationRequest(ids, n, params, torch.Generator().manual_seed(seed), pixels=pixels)
        )
        assert out.logprobs.dtype == torch.float64 and out.completion_mask.sum() > 3 * n
        args = (out.prompt_ids, out.prompt_mask, out.completion_ids, out.completion_mask)
        lp, _ = token_logprobs(model, *args, prompt_index=out.prompt_index, pixels=pixels)
        torch.testing.assert_close(lp, out.logprobs, rtol=0, atol=1e-10)
    # The positions matter: the same forward with 1-D positions (Qwen's text-only default)
    # scores the image rows differently; other pixels too.
    flat = {"position_ids": None}
    seq = torch.cat([out.prompt_ids, out.completion_ids], 1)
    mask = torch.cat([out.prompt_mask, out.completion_mask], 1)
    vision = pixels.rows(out.prompt_index)
    pos3 = mrope_positions(model, seq, mask, vision)[0]
    with torch.no_grad():
        a = model(input_ids=seq, attention_mask=mask, position_ids=pos3, **vision).logits
        flat["position_ids"] = (mask.cumsum(-1) - 1).clamp(min=0)
        b = model(input_ids=seq, attention_mask=mask, **flat, **vision).logits
    assert (a[:2] - b[:2]).abs().max() > 1e-6
    other = QwenPixelInputs([-p for p in pixels.patches], pixels.grids)
    moved, _ = token_logprobs(model, *args, prompt_index=out.prompt_index, pixels=other)
    assert not torch.allclose(moved[:2], lp[:2])


def test_paused_generation_re_prefills_with_the_positions(qvl64):
    model, tok, fmt = qvl64
    ids, pixels = fmt.encode_images(PROMPTS, _images())
    engine = _engine(model, tok)
    params = SamplingParams(max_new_tokens=6, temperature=1.0)
    whole = engine.generate(
        GenerationRequest(ids, 2, params, torch.Generator().manual_seed(2), pixels=pixels)
    )
    part = engine.partial(
        GenerationRequest(ids, 2, params, torch.Generator().manual_seed(2), pixels=pixels)
    )
    part.run(3, version=0)
    part.pause()
    part.run(None, version=0)
    res = part.result()
    assert torch.equal(res.completion_ids, whole.completion_ids)
    torch.testing.assert_close(res.logprobs, whole.logprobs, rtol=0, atol=1e-10)


def test_rounds_join_qwen_pixels_at_their_prompt_offsets(qvl64):
    from gspo.orchestration.dynamic_sampling import concat
    from gspo.rollout.base import PIXELS, RolloutBatch

    model, tok, fmt = qvl64
    engine = _engine(model, tok)
    params = SamplingParams(max_new_tokens=3, temperature=1.0)
    ids, pixels = fmt.encode_images(PROMPTS[:2], _images()[:2])
    first = engine.generate(
        GenerationRequest(ids, 2, params, torch.Generator().manual_seed(0), pixels=pixels)
    )
    first = first.select(torch.tensor([0, 1]))  # only prompt 0's group kept
    ids2, pixels2 = fmt.encode_images(PROMPTS[1:], _images()[1:])
    second = engine.generate(
        GenerationRequest(ids2, 2, params, torch.Generator().manual_seed(1), pixels=pixels2)
    )
    joined = concat(
        [RolloutBatch(r, torch.zeros(r.num_samples, dtype=torch.float64)) for r in (first, second)],
        pad_id=tok.pad_token_id,
    ).rollout
    rows = joined.extras[PIXELS].rows(joined.prompt_index)
    grids = [pixels.grids[0]] * 2 + [pixels2.grids[0]] * 2
    assert torch.equal(rows["image_grid_thw"], torch.cat(grids))
    want = torch.cat([pixels.patches[0]] * 2 + [pixels2.patches[0]] * 2)
    assert torch.equal(rows["pixel_values"], want)


def test_save_and_load_with_its_processor(qvl64, tmp_path):
    model, tok, fmt = qvl64
    save_model(model, tok, tmp_path / "final")
    assert (tmp_path / "final" / "preprocessor_config.json").is_file()
    loaded = load_model(tmp_path / "final", dtype="float64")
    assert isinstance(loaded, Qwen2_5_VLForConditionalGeneration)
    opts = _opts(model=str(tmp_path / "final"), dtype="float64")
    fmt2 = build_prompt_format(opts, load_tokenizer(tmp_path / "final"), loaded)
    ids, pixels = fmt.encode_images(PROMPTS, _images())
    ids2, pixels2 = fmt2.encode_images(PROMPTS, _images())
    assert ids == ids2 and fmt2.stop_token_ids == fmt.stop_token_ids
    assert all(torch.equal(a, b) for a, b in zip(pixels.patches, pixels2.patches, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(pixels.grids, pixels2.grids, strict=True))
    out = _engine(model, tok).generate(
        GenerationRequest(
            ids,
            2,
            SamplingParams(max_new_tokens=4),
            torch.Generator().manual_seed(0),
            pixels=pixels,
        )
    )
    args = (out.prompt_ids, out.prompt_mask, out.completion_ids, out.completion_mask)
    kw = dict(prompt_index=out.prompt_index, pixels=pixels)
    torch.testing.assert_close(
        token_logprobs(model, *args, **kw)[0],
        token_logprobs(loaded, *args, **kw)[0],
        rtol=0,
        atol=0,
    )
    # A whole processor saved by transformers 5 nests the image processor in
    # processor_config.json: it loads from there too (not the derived default).
    folder = tmp_path / "final"
    nested = json.loads((folder / "preprocessor_config.json").read_text())
    nested["size"]["longest_edge"] = 56 * 56  # a limit the derived processor does not have
    (folder / "preprocessor_config.json").unlink()
    (folder / "processor_config.json").write_text(json.dumps({"image_processor": nested}))
    fmt3 = build_prompt_format(opts, load_tokenizer(folder), loaded)
    ids3, pixels3 = fmt3.encode_images(PROMPTS, _images())
    assert ids3[0] == ids[0] and pixels3.grids[1][0].tolist() == [1, 2, 4]  # 84x56 scaled down


def test_two_step_train_on_shapes(tmp_path):
    run = tmp_path / "run"
    argv = ["train", "--preset", "smoke", "--model", "tiny-qwen-vl", "--task", "shapes"]
    argv += ["--device", "cpu", "--threads", "1", "--max-new-tokens", "6"]
    argv += ["--checkpoint-every", "1", "--output-dir", str(run)]
    assert main(argv) == 0
    metrics = (run / "metrics.jsonl").read_text().splitlines()
    assert sum('"reward/mean"' in line for line in metrics) == 2
    final = load_model(run / "final")
    assert isinstance(final, Qwen2_5_VLForConditionalGeneration)
    saved = [run / "final", *(run / "checkpoints").glob("step_*")]
    assert len(saved) >= 2 and all((p / "preprocessor_config.json").is_file() for p in saved)


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({"rollout_engine": "vllm"}, "not with rollout_engine='vllm'"),
        ({"task": "shapes", "backend": "ray"}, "not with backend='ray'"),
        ({"task": "shapes", "max_staleness": 1}, "not with max_staleness"),
        ({"task": "shapes", "env": "gspo.envs.shapes_turns:shapes_turns"}, "multi-turn"),
        ({"task": "shapes"}, None),
    ],
)
def test_tiny_qwen_vl_refusals_before_torch(overrides, problem):
    from gspo.config.combinations import vision_combinations

    opts = TrainConfig.of(**{"model": "tiny-qwen-vl", **overrides})
    got = vision_combinations(opts, multi_turn="env" in overrides)
    assert got == [] if problem is None else (len(got) == 1 and problem in got[0])
