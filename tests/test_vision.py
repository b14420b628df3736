"""Vision-language pipeline: tiny-vl, its processor, engine and training forward on image prompts."""

from __future__ import annotations

import io

import pytest
import torch

pytest.importorskip("PIL")
from PIL import Image

from gspo.config.options import ModelOptions
from gspo.config.train import TrainConfig
from gspo.models.logprobs import token_logprobs
from gspo.models.model_io import load_model, load_tokenizer, save_model
from gspo.models.policy import build_policy, build_prompt_format
from gspo.models.vision import PixelInputs, is_vision_model, load_image
from gspo.rollout.base import GenerationRequest, SamplingParams
from gspo.rollout.torch_engine import TorchEngine


def _opts(**kw) -> ModelOptions:
    return TrainConfig.of(**{"model": "tiny-vl", **kw}).model


def _png(size, colour) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def vl64():
    model, tok = build_policy(_opts(dtype="float64"), torch.device("cpu"), seed=0)
    fmt = build_prompt_format(_opts(dtype="float64"), tok, model)
    return model, tok, fmt


def _images():
    # Three sizes and both orientations; one prompt with two images, one text-only prompt.
    return [
        (Image.new("RGB", (40, 20), (255, 0, 0)),),
        (_png((16, 30), (0, 255, 0)), Image.new("RGB", (64, 64), (0, 0, 255))),
        (),
    ]


PROMPTS = ["How many red? <image>", "<image> left, <image> right: same?", "2+2="]


def test_tiny_vl_builds_with_a_processor(vl64):
    model, tok, fmt = vl64
    assert is_vision_model(model)
    assert fmt.processor is not None and fmt.chat
    # The template's end of turn is a stop token.
    assert tok.convert_tokens_to_ids("<end_of_utterance>") in fmt.stop_token_ids


def test_processor_round_trip_several_sizes(vl64):
    _, tok, fmt = vl64
    ids, pixels = fmt.encode_images(PROMPTS, _images())
    image_id = tok.convert_tokens_to_ids("<image>")
    per_image = 4  # (56 / 14)^2 / 2^2 at tiny-vl's defaults
    assert [sum(t == image_id for t in row) for row in ids] == [per_image, 2 * per_image, 0]
    assert pixels.values.shape[:2] == (3, 2) and pixels.values.shape[2:] == (3, 56, 56)
    # Without image splitting every image is resized to the tower's 56x56 input: all real.
    assert pixels.mask[0, 0].all() and pixels.mask[1].all()
    assert pixels.mask[0, 1].sum().item() == 0 and pixels.values[2].abs().sum() == 0
    # Text decodes back (image tokens are special and drop out).
    text = tok.decode(ids[0], skip_special_tokens=True)
    assert "How many red?" in text and "Assistant:" in text


def test_placeholder_count_must_match(vl64):
    _, _, fmt = vl64
    with pytest.raises(ValueError, match="placeholder"):
        fmt.encode_images(["no placeholder"], [(Image.new("RGB", (8, 8)),)])


def test_bad_images_are_named():
    with pytest.raises(ValueError, match=r"row 3.*no image file"):
        load_image("/nonexistent/x.png", where="row 3")
    with pytest.raises(ValueError, match=r"row 4.*not a readable image"):
        load_image(b"not a png", where="row 4")
    truncated = _png((20, 20), (1, 2, 3))[:40]
    with pytest.raises(ValueError, match="not a readable image"):
        load_image(truncated)


def test_engine_logprobs_equal_training_forward_float64(vl64):
    model, tok, fmt = vl64
    ids, pixels = fmt.encode_images(PROMPTS, _images())
    engine = TorchEngine(model, pad_id=tok.pad_token_id, eos_id=tok.eos_token_id, tokenizer=tok)
    params = SamplingParams(max_new_tokens=8, temperature=1.0, stop_token_ids=fmt.stop_token_ids)
    gen = torch.Generator().manual_seed(0)
    out = engine.generate(GenerationRequest(ids, 2, params, gen, pixels=pixels))
    assert out.logprobs.dtype == torch.float64
    args = (out.prompt_ids, out.prompt_mask, out.completion_ids, out.completion_mask)
    lp, _ = token_logprobs(model, *args, prompt_index=out.prompt_index, pixels=pixels)
    assert out.completion_mask.sum() > 0
    torch.testing.assert_close(lp, out.logprobs, rtol=0, atol=1e-10)
    # The images matter: other pixels give other log-probs; none at all is refused.
    other = PixelInputs(-pixels.values, pixels.mask)
    moved, _ = token_logprobs(model, *args, prompt_index=out.prompt_index, pixels=other)
    assert not torch.allclose(moved[:4], lp[:4])
    with pytest.raises(ValueError, match="no pixel inputs"):
        token_logprobs(model, *args)


def test_resumable_generation_takes_the_pixels(vl64):
    model, tok, fmt = vl64
    ids, pixels = fmt.encode_images(PROMPTS, _images())
    engine = TorchEngine(model, pad_id=tok.pad_token_id, eos_id=tok.eos_token_id, tokenizer=tok)
    params = SamplingParams(max_new_tokens=6, temperature=1.0)
    whole = engine.generate(
        GenerationRequest(ids, 2, params, torch.Generator().manual_seed(1), pixels=pixels)
    )
    part = engine.partial(
        GenerationRequest(ids, 2, params, torch.Generator().manual_seed(1), pixels=pixels)
    )
    part.run(3, version=0)
    part.pause()  # the re-prefill must take the images again
    part.run(None, version=0)
    res = part.result()
    assert torch.equal(res.completion_ids, whole.completion_ids)
    torch.testing.assert_close(res.logprobs, whole.logprobs, rtol=0, atol=1e-10)


def test_pixel_inputs_cat_offsets_like_rollouts(vl64):
    _, _, fmt = vl64
    _, a = fmt.encode_images(PROMPTS[:1], _images()[:1])
    _, b = fmt.encode_images(PROMPTS[1:2], _images()[1:2])
    both = PixelInputs.cat([a, b])
    assert both.values.shape[:2] == (2, 2)
    rows = both.rows(torch.tensor([1, 0]))
    assert torch.equal(rows["pixel_values"][1, :1], a.values[0])
    assert torch.equal(rows["pixel_values"][0], b.values[0])


def test_save_and_load_vl_checkpoint(vl64, tmp_path):
    model, tok, fmt = vl64
    save_model(model, tok, tmp_path / "final")
    loaded = load_model(tmp_path / "final", dtype="float64")
    tok2 = load_tokenizer(tmp_path / "final")
    assert is_vision_model(loaded)
    opts = _opts(model=str(tmp_path / "final"), dtype="float64")
    fmt2 = build_prompt_format(opts, tok2, loaded)
    ids, pixels = fmt.encode_images(PROMPTS, _images())
    ids2, pixels2 = fmt2.encode_images(PROMPTS, _images())
    assert ids == ids2
    assert torch.equal(pixels.values, pixels2.values)
    pid = torch.tensor(ids[0]).unsqueeze(0)
    args = (pid, torch.ones_like(pid), pid[:, -3:], torch.ones_like(pid[:, -3:]))
    kw = dict(prompt_index=torch.tensor([0]), pixels=pixels)
    a, _ = token_logprobs(model, *args, **kw)
    b, _ = token_logprobs(loaded, *args, **kw)
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_rounds_join_pixels_at_their_prompt_offsets(vl64):
    """Dynamic sampling joins rounds: a round that kept only its first prompt's group still
    shifts the next round's prompt indices past all of its prompts' pixels."""
    from gspo.orchestration.dynamic_sampling import concat
    from gspo.rollout.base import PIXELS, RolloutBatch

    model, tok, fmt = vl64
    engine = TorchEngine(model, pad_id=tok.pad_token_id, eos_id=tok.eos_token_id, tokenizer=tok)
    params = SamplingParams(max_new_tokens=3, temperature=1.0)
    images = _images()
    ids, pixels = fmt.encode_images(PROMPTS[:2], images[:2])
    first = engine.generate(
        GenerationRequest(ids, 2, params, torch.Generator().manual_seed(0), pixels=pixels)
    )
    first = first.select(torch.tensor([0, 1]))  # only prompt 0's group kept
    ids2, pixels2 = fmt.encode_images(PROMPTS[1:], images[1:])
    second = engine.generate(
        GenerationRequest(ids2, 2, params, torch.Generator().manual_seed(1), pixels=pixels2)
    )
    joined = concat(
        [RolloutBatch(r, torch.zeros(r.num_samples, dtype=torch.float64)) for r in (first, second)],
        pad_id=tok.pad_token_id,
    ).rollout
    rows = joined.extras[PIXELS].rows(joined.prompt_index)["pixel_values"]
    assert torch.equal(rows[0], pixels.values[0])
    assert torch.equal(rows[2, :2], pixels2.values[0]) and torch.equal(rows[4], pixels2.values[1])


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({"model": "tiny", "task": "shapes"}, "cannot see"),
        ({"task": "shapes", "rollout_engine": "vllm"}, "head size 16"),  # vLLM: head size 32
        ({"task": "shapes", "rollout_engine": "vllm", "num_heads": 2, "num_kv_heads": 1}, None),
        ({"task": "shapes", "backend": "ray"}, None),  # by reference (tests/test_vision_ray.py)
        (
            {
                **{"task": "shapes", "backend": "ray", "rollout_workers": 1},
                **{"rollout_engine": "vllm", "num_heads": 2, "num_kv_heads": 1},
            },
            "rollout_engine='torch'",
        ),
        ({"task": "file", "image_key": "image", "train_file": "x.jsonl"}, None),
    ],
)
def test_image_runs_refused_before_torch(overrides, problem):
    from gspo.config.combinations import vision_combinations

    got = vision_combinations(TrainConfig.of(**{"model": "tiny-vl", **overrides}))
    if problem is None:
        assert got == []
    else:
        assert len(got) == 1 and problem in got[0]


def test_compare_cold_starts_tiny_vl(tmp_path):
    from gspo.interface.compare import plan

    cfgs, sfts = plan(
        ["gspo", "luspo"],
        [0],
        tmp_path,
        overrides={"model": "tiny-vl", "task": "shapes"},
        sft_steps=3,
    )
    assert sfts[0].model == "tiny-vl" and sfts[0].task == "shapes"
    assert {c.model.model for c in cfgs} == {str(tmp_path / "sft" / "seed0")}
