"""Images in multi-turn episodes: the prompt's images, then those of environment replies.

An episode of a vision-language policy starts with its example's images (``Example.images``,
one ``<image>`` each in the prompt) and may see more in the environment's replies
(:attr:`gspo.envs.base.Step.images`, one ``<image>`` each in the reply's text). The processor
expands each placeholder into the model's image tokens and makes the pixel inputs of each image
once; the episode's pixel inputs (:attr:`gspo.envs.trajectory.Trajectory.pixels`) grow reply
by reply, all of its images in the order their tokens appear in its sequence. So every round's
generation and the training forward see the same tensors:

- a round of the driver gives the engine each active episode's pixels so far (one entry per
  context), the prefill of its whole context takes them;
- the packed rollout carries every episode's pixels on ``extras["pixels"]`` (one entry per row:
  the episodes of a group see different replies) and ``extras["pixel_index"]`` [N] (row i reads
  entry i; :func:`gspo.rollout.base.pixel_rows`), which the training forward, the reference
  and the recompute pass read.

A reply's image tokens are environment tokens: loss mask 0 like the rest of the reply, and
``token_logprobs`` gives them log-prob 0 (the policy never samples an image token).
"""

from __future__ import annotations

from typing import Any

import torch

from gspo.models.chat import encode_examples
from gspo.models.vision import PixelInputs, encode_vision_prompts
from gspo.rollout.base import PIXEL_INDEX, PIXELS, Rollout

from .base import Message, Step
from .trajectory import Trajectory

PLACEHOLDER = "<image>"  # gspo.models.vision.IMAGE_PLACEHOLDER (that module imports torch only)


def prompt_pixels(encoder: Any, examples: list) -> tuple[list[list[int]] | None, Any]:
    """(prompt ids, their per-example pixel inputs) when an example has images, else
    (None, None): the text path, untouched."""
    if not any(getattr(e, "images", None) for e in examples):
        return None, None
    ids, pixels = encode_examples(encoder.fmt, examples)
    return ids, pixels


def start_pixels(pixels: Any, i: int, example: Any) -> Any:
    """Episode pixels of example ``i`` (its own images only, no padding), None without any."""
    count = len(getattr(example, "images", None) or ())
    return pixels.entry(i, count) if pixels is not None and count else None


def opening_ids(
    encoder: Any, env_name: str, messages: list[Message], images: tuple
) -> tuple[list[int], list[Message], Any]:
    """(prompt ids, history, pixel inputs or None) of an environment's opening observation
    (:class:`gspo.envs.base.Opening`), its images expanded by the processor."""
    processor = getattr(encoder.fmt, "processor", None)
    shown = "".join(m["content"] for m in messages)
    if processor is None and images:
        raise ValueError(
            f"environment {env_name!r} opened with images, which need a vision-language "
            "model (--model tiny-vl or a local vision-language checkpoint)"
        )
    if processor is None or (not images and PLACEHOLDER not in shown):
        ids, history = encoder.start_messages(messages)
        return ids, history, None
    text, history, special = encoder.start_text(messages)
    try:
        ids, pixels = encode_vision_prompts(processor, [text], [images], special=special)
    except ValueError as exc:
        raise ValueError(f"environment {env_name!r} opening: {exc}") from None
    return ids[0], history, pixels


def reply_ids(
    encoder: Any, env_name: str, history: list[Message], last_turn: list[int], step: Step
) -> tuple[list[int], Any]:
    """(token ids of the environment's reply ``step``, the pixel inputs of its images or
    None). A reply without images or placeholders takes the encoder's text path unchanged."""
    processor = getattr(encoder.fmt, "processor", None)
    images = tuple(step.images or ())
    if images and processor is None:
        raise ValueError(
            f"environment {env_name!r} replied with images, which need a vision-language "
            "model (--model tiny-vl or a local vision-language checkpoint)"
        )
    shown = "".join(m["content"] for m in step.messages)
    if processor is None or (not images and PLACEHOLDER not in shown):
        return encoder.reply_ids(history, last_turn, step.messages), None
    text = encoder.reply_text(history, last_turn, step.messages)
    try:
        ids, pixels = encode_vision_prompts(processor, [text], [images], special=False)
    except ValueError as exc:  # e.g. placeholders that do not match the images
        raise ValueError(f"environment {env_name!r} reply: {exc}") from None
    return ids[0], pixels


def add_reply_pixels(t: Trajectory, pixels: Any) -> None:
    """The episode ``t`` saw a reply with images: its pixel inputs grow by them."""
    if pixels is not None:
        t.pixels = pixels if t.pixels is None else t.pixels.extend(pixels)


def episode_pixels(trajs: list[Trajectory]) -> Any:
    """One pixel entry per episode of ``trajs`` (an episode without images gets none: all-zero
    padding the model drops), or None when no episode has an image."""
    have = [t.pixels for t in trajs if t.pixels is not None]
    if not have:
        return None
    like = have[0]
    empty = PixelInputs(like.values[:, :0], like.mask[:, :0])  # [1, 0, ...]
    return PixelInputs.cat([empty if t.pixels is None else t.pixels for t in trajs])


def attach_pixels(rollout: Rollout, trajs: list[Trajectory]) -> None:
    """Put the episodes' pixel inputs on their packed rollout (row i: entry i)."""
    pixels = episode_pixels(trajs)
    if pixels is not None:
        rollout.extras[PIXELS] = pixels
        rollout.extras[PIXEL_INDEX] = torch.arange(len(trajs), dtype=torch.long)  # [N]
