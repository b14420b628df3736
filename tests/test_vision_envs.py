"""Images in multi-turn environments and async sampling (issue 37): an environment's replies show
new images, async runs carry the pixels across the buffer, a VL run resumes exactly."""

from __future__ import annotations

import hashlib
import random

import pytest
import torch

pytest.importorskip("PIL")

from transformers.models.idefics3.modeling_idefics3 import Idefics3Model

from gspo.config.train import TrainConfig
from gspo.envs.base import Step
from gspo.envs.driver import Limits, run_episodes
from gspo.envs.shapes_turns import ShapesTurnsEnv
from gspo.envs.tasks.shapes import sample_shapes
from gspo.envs.trajectory import make_encoder
from gspo.models.logprobs import token_logprobs
from gspo.models.policy import build_policy, build_prompt_format
from gspo.rollout.base import PIXEL_INDEX, PIXELS, GenerationRequest, SamplingParams, pixel_rows
from gspo.rollout.torch_engine import TorchEngine


def _digest(t: torch.Tensor) -> str:
    """A tensor's bytes in float64 (the float64 model's forwards get them so)."""
    data = t.detach().cpu().to(torch.float64).contiguous().numpy().tobytes()
    return hashlib.blake2b(data).hexdigest()


@pytest.fixture(scope="module")
def vl64():
    opts = TrainConfig.of(model="tiny-vl", dtype="float64").model
    model, tok = build_policy(opts, torch.device("cpu"), seed=0)
    return model, tok, build_prompt_format(opts, tok, model)


@pytest.fixture
def seen(monkeypatch):
    """Every image (one [3, H, W] tensor each, padding images left out) the vision tower gets,
    by mode: False for the engine (eval mode), True for the update (train mode). Recorded at
    the tower's entry, which the engine's forward and the update's shared-feature path
    (:func:`gspo.models.vision.image_inputs`) both go through."""
    record: dict[bool, list[str]] = {False: [], True: []}
    original = Idefics3Model.get_image_features

    def get_image_features(self, pixel_values, *args, **kwargs):
        flat = pixel_values.reshape(-1, *pixel_values.shape[2:])  # [N * I, 3, H, W]
        record[self.training] += [_digest(im) for im in flat if im.abs().sum() > 0]
        return original(self, pixel_values, *args, **kwargs)

    monkeypatch.setattr(Idefics3Model, "get_image_features", get_image_features)
    return record


def _examples(k: int):
    rng = random.Random(7)
    return [sample_shapes(rng, 4) for _ in range(k)]


def _stops(tok, fmt) -> tuple[int, ...]:
    """Half the vocabulary as stop tokens: the random-init policy then ends its turns itself
    after about two tokens (finish "stop"), so its episodes reach the environment's replies."""
    return tuple(sorted({*fmt.stop_token_ids, *range(0, len(tok), 2)}))


def _episodes(vl64, n=2, seed=0, images=3):
    model, tok, fmt = vl64
    engine = TorchEngine(model, pad_id=tok.pad_token_id, eos_id=tok.eos_token_id, tokenizer=tok)
    params = SamplingParams(max_new_tokens=8, temperature=1.0, stop_token_ids=_stops(tok, fmt))
    limits = Limits(max_turns=images, max_tokens_per_turn=8, max_total_tokens=200)
    env = ShapesTurnsEnv(images=images)
    gen = torch.Generator().manual_seed(seed)
    rollout, trajs = run_episodes(
        engine, env, make_encoder(tok, fmt), _examples(2), n, params, limits, gen
    )
    return rollout, trajs, env


def test_episode_with_images_in_two_replies(vl64, seen):
    model = vl64[0]
    rollout, trajs, _ = _episodes(vl64)
    image_id = model.config.image_token_id
    # Every episode saw the prompt's image and one in each of two replies (none was cut: the
    # environment answers any turn, and the token budget holds three turns).
    assert all(t.num_turns == 3 and t.finish == "stop" for t in trajs), [t.finish for t in trajs]
    ids, mask, loss = rollout.completion_ids, rollout.completion_mask, rollout.policy_mask
    in_replies = (ids == image_id) & mask.bool()  # [N, L]
    assert (in_replies.sum(dim=1) == 2 * 4).all()  # 4 image tokens per image, two replies
    # Image tokens of replies are environment tokens: no loss, no version, no turn.
    assert not (loss.bool() & in_replies).any()
    assert (rollout.extras["turn_ids"][in_replies] == -1).all()
    # Each row carries its own episode's three images, in order.
    pixels = rollout.extras[PIXELS]
    assert pixels.num_prompts == rollout.num_samples and pixels.values.shape[1] == 3
    assert rollout.extras[PIXEL_INDEX].tolist() == list(range(rollout.num_samples))
    # The engine's log-probs equal the training forward's (float64) on the whole episode.
    args = (rollout.prompt_ids, rollout.prompt_mask, ids, mask)
    engine_images = set(seen[False])
    model.train()  # the "training forward" side of the record
    try:
        lp, _ = token_logprobs(
            model, *args, prompt_index=rollout.prompt_index, pixels=pixels,
            pixel_index=pixel_rows(rollout),
        )  # fmt: skip
    finally:
        model.eval()
    assert torch.isfinite(lp).all()
    assert loss.sum() > 0
    torch.testing.assert_close(lp * loss, rollout.logprobs * loss, rtol=0, atol=1e-10)
    assert (lp[in_replies] == 0).all()  # environment image tokens score nothing
    # The training forward saw exactly the images the engine was conditioned on.
    assert set(seen[True]) == engine_images and len(engine_images) >= 2 * 3


def test_reply_pixels_are_the_ones_generation_used(vl64, seen):
    rollout, trajs, _ = _episodes(vl64, seed=1)
    engine_images = set(seen[False])
    # Every reply image the environment drew reached the engine's prefills ...
    drawn = {_digest(t.pixels.values[0, k]) for t in trajs for k in range(3)}
    assert drawn <= engine_images
    # ... and the rollout's pixels for training are those same tensors, row by row.
    pixels = rollout.extras[PIXELS]
    for i, t in enumerate(trajs):
        assert torch.equal(pixels.values[i, :3], t.pixels.values[0])
    assert {_digest(im) for im in pixels.values.reshape(-1, 3, 56, 56)} == drawn


def test_reply_images_need_a_vision_model_and_matching_placeholders(vl64):
    class Bad:
        name, multi_turn, stop_strings = "bad", True, ()

        def __init__(self, images):
            self.images = images

        def reset(self, example):
            return 0

        def step(self, state, text, finished):
            return Step(done=False, messages=[{"role": "user", "content": "see"}],
                        images=self.images)  # fmt: skip

    model, tok, fmt = vl64
    engine = TorchEngine(model, pad_id=tok.pad_token_id, eos_id=tok.eos_token_id, tokenizer=tok)
    params = SamplingParams(
        max_new_tokens=1, temperature=1.0, stop_token_ids=tuple(range(len(tok)))
    )
    limits = Limits(max_turns=2, max_tokens_per_turn=1, max_total_tokens=100)
    image = _examples(1)[0].images[0]
    with pytest.raises(ValueError, match=r"environment 'bad' reply: .*placeholder"):
        run_episodes(engine, Bad([image]), make_encoder(tok, fmt), _examples(1), 1, params,
                     limits, torch.Generator().manual_seed(0))  # fmt: skip


def _cfg(tmp_path, **overrides):
    from gspo.config import build

    base = {"model": "tiny-vl", "task": "shapes", "device": "cpu", "threads": 1,
            "output_dir": str(tmp_path), "max_new_tokens": 4, "eval_every": 0}  # fmt: skip
    return build(TrainConfig, preset="smoke", overrides={**base, **overrides})


HEAD32 = {"num_heads": 2, "num_kv_heads": 1}  # tiny-vl at a head size vLLM's CPU attention takes


@pytest.mark.parametrize(
    ("overrides", "problem"),
    [
        ({"max_staleness": 1}, None),
        ({"max_staleness": 1, "async_partial": "mask"}, None),
        ({"env": "gspo.envs.shapes_turns:shapes_turns"}, None),
        # vLLM (at a head size it serves) and Ray take one-turn image prompts sampled each step.
        ({"max_staleness": 1, "rollout_engine": "vllm", **HEAD32}, "rollout_engine='torch'"),
        (
            {"env": "gspo.envs.shapes_turns:shapes_turns", "rollout_engine": "vllm", **HEAD32},
            "rollout_engine='torch'",
        ),
        ({"max_staleness": 1, "backend": "ray", "rollout_workers": 1}, "Ray"),
        ({"env": "gspo.envs.shapes_turns:shapes_turns", "backend": "ray"}, "backend='local'"),
        ({"backend": "ray", "rollout_workers": 1}, None),
    ],
)
def test_async_and_multi_turn_images_are_accepted(overrides, problem):
    from gspo.config.combinations import vision_combinations

    opts = TrainConfig.of(model="tiny-vl", task="shapes", **overrides)
    got = vision_combinations(opts, multi_turn="env" in overrides)
    assert got == [] if problem is None else (len(got) == 1 and problem in got[0])


def test_async_run_on_shapes_trains_on_the_sampled_pixels(seen, tmp_path):
    from gspo.compose.train import train

    result = train(_cfg(tmp_path / "run", max_staleness=1, steps=2))
    steps = [r for r in result.history if "reward/mean" in r]
    assert len(steps) == 2 and all("async/staleness_mean" in r or "async/trainer_idle_s" in r
                                   for r in steps)  # fmt: skip
    # The update's forwards took exactly the images the rollout thread sampled from.
    assert seen[True] and set(seen[True]) == set(seen[False])


@pytest.mark.parametrize("staleness", [0, 1])
def test_multi_turn_run_with_reply_images_trains(seen, tmp_path, staleness):
    from gspo.compose.train import train

    cfg = _cfg(tmp_path / "mt", env="gspo.envs.shapes_turns:shapes_turns", steps=2,
               max_turns=3, max_tokens_per_turn=2, max_total_tokens=96,
               max_staleness=staleness)  # fmt: skip
    result = train(cfg)
    steps = [r for r in result.history if "reward/mean" in r]
    assert len(steps) == 2 and all("episode/turns_mean" in r for r in steps)
    assert set(seen[True]) <= set(seen[False]) and seen[True]


VARIED_ENV = '''
from gspo.envs.base import Step


class Varied:
    """One turn, a reward that varies with the completion: the advantages are not all zero
    from a random-init policy, so a resumed run's updates are checked, not empty."""

    name, multi_turn, stop_strings = "varied", False, ()

    def reset(self, example):
        return example

    def step(self, state, text, finished):
        return Step(done=True, reward=float(len(text) % 3))


def make(task, opts, chat):
    return Varied()
'''


def test_vl_run_resumed_from_a_checkpoint_reproduces_the_unbroken_run(tmp_path, monkeypatch):
    from trainer_support import train_records, without_timing

    from gspo.compose.train import train

    (tmp_path / "vl_varied.py").write_text(VARIED_ENV)
    monkeypatch.syspath_prepend(str(tmp_path))
    common = {"steps": 3, "lr": 1e-2, "warmup_steps": 0, "env": "vl_varied:make"}
    run_a = train(_cfg(tmp_path / "a", checkpoint_every=1, **common))
    train(_cfg(tmp_path / "b", stop_after=1, **common))
    rest = train(_cfg(tmp_path / "b", **common), resume=True)
    a_late = [without_timing(r) for r in train_records(run_a.history) if r["step"] > 1]
    b_late = [without_timing(r) for r in train_records(rest.history)]
    assert [r["step"] for r in b_late] == [2, 3]
    # Not an empty check: the rewards vary, so the updates moved the weights.
    assert all(r["reward/std"] > 0 for r in a_late) and any(r["loss"] != 0 for r in a_late)
    assert b_late == a_late
    a_state, b_state = run_a.model.state_dict(), rest.model.state_dict()
    assert a_state.keys() == b_state.keys()
    assert all(torch.equal(a_state[k], b_state[k]) for k in a_state)


def test_partial_rollout_pauses_and_keeps_the_pixels(vl64):
    """A partial rollout of image prompts paused mid-generation (new weights would load here)
    re-prefills with the same pixels; its rollout carries them to the update, and the
    training forward on them gives the recorded log-probs."""
    from gspo.models.chat import encode_examples
    from gspo.rollout.partial import partial_generation

    model, tok, fmt = vl64
    engine = TorchEngine(model, pad_id=tok.pad_token_id, eos_id=tok.eos_token_id, tokenizer=tok)
    ids, pixels = encode_examples(fmt, _examples(2))
    params = SamplingParams(max_new_tokens=6, temperature=1.0)
    whole = engine.generate(
        GenerationRequest(ids, 2, params, torch.Generator().manual_seed(3), pixels=pixels)
    )
    g = partial_generation(
        engine, GenerationRequest(ids, 2, params, torch.Generator().manual_seed(3), pixels), chunk=6
    )
    g.run(2, version=0)
    g.pause()
    g.run(None, version=1)
    out = g.result()
    assert out.extras[PIXELS] is pixels
    assert torch.equal(out.completion_ids, whole.completion_ids)
    assert set(out.versions[out.completion_mask.bool()].tolist()) == {0, 1}
    args = (out.prompt_ids, out.prompt_mask, out.completion_ids, out.completion_mask)
    lp, _ = token_logprobs(model, *args, prompt_index=out.prompt_index, pixels=pixels)
    torch.testing.assert_close(lp, out.logprobs, rtol=0, atol=1e-10)


def test_an_opening_with_an_image_starts_the_episode(vl64, seen):
    """An environment's own opening observation (``Opening``) may show an image (a board):
    each episode starts from it, with its pixels, and the replies' images follow."""
    from gspo.envs.base import Opening

    class Opened(ShapesTurnsEnv):
        def reset(self, example):
            state = super().reset(example)
            board = _examples(3)[2]  # another drawing than the example's
            state.answers = [board.answer]
            return Opening(state, [{"role": "user", "content": board.prompt}], list(board.images))

    model, tok, fmt = vl64
    engine = TorchEngine(model, pad_id=tok.pad_token_id, eos_id=tok.eos_token_id, tokenizer=tok)
    params = SamplingParams(max_new_tokens=8, temperature=1.0, stop_token_ids=_stops(tok, fmt))
    limits = Limits(max_turns=3, max_tokens_per_turn=8, max_total_tokens=200)
    rollout, trajs = run_episodes(engine, Opened(), make_encoder(tok, fmt), _examples(1), 2,
                                  params, limits, torch.Generator().manual_seed(2))  # fmt: skip
    image_id = model.config.image_token_id
    assert ((rollout.prompt_ids == image_id).sum(dim=1) == 4).all()  # the opening's image
    # Each episode's first image is the opening's board (not the example's image).
    drawn = _examples(3)[2]
    _, board = fmt.encode_images([drawn.prompt], [drawn.images])
    _, own = fmt.encode_images([_examples(1)[0].prompt], [_examples(1)[0].images])
    assert all(torch.equal(t.pixels.values[0, 0], board.values[0, 0]) for t in trajs)
    assert not torch.equal(board.values[0, 0], own.values[0, 0])
    args = (rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids,
            rollout.completion_mask)  # fmt: skip
    lp, _ = token_logprobs(model, *args, prompt_index=rollout.prompt_index,
                           pixels=rollout.extras[PIXELS], pixel_index=pixel_rows(rollout))  # fmt: skip
    loss = rollout.policy_mask
    assert loss.sum() > 0 and all(t.num_turns >= 2 for t in trajs)
    torch.testing.assert_close(lp * loss, rollout.logprobs * loss, rtol=0, atol=1e-10)


def test_rounds_of_episodes_join_their_pixel_entries(vl64):
    """Dynamic sampling joins rounds of episodes: each row still reads its own episode's
    images (pixel_index offset past the earlier rounds' entries), prompt indices stay apart."""
    from gspo.orchestration.dynamic_sampling import concat
    from gspo.rollout.base import RolloutBatch

    first, trajs1, _ = _episodes(vl64, seed=4)
    first = first.select(torch.tensor([2, 3]))  # only the second group kept
    second, trajs2, _ = _episodes(vl64, seed=5)
    joined = concat(
        [RolloutBatch(r, torch.zeros(r.num_samples, dtype=torch.float64)) for r in (first, second)],
        pad_id=vl64[1].pad_token_id,
    ).rollout
    rows = joined.extras[PIXELS].rows(pixel_rows(joined))["pixel_values"]  # [6, I, 3, H, W]
    own = [trajs1[2], trajs1[3], *trajs2]
    for k, t in enumerate(own):
        assert torch.equal(rows[k, :3], t.pixels.values[0])
    assert joined.prompt_index.tolist() == [1, 1, 2, 2, 3, 3]
