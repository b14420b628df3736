"""A multi-turn visual environment: count shapes in a new image every turn.

Over the ``shapes`` task (``--task shapes --env gspo.envs.shapes_turns:shapes_turns``): the
episode opens with the example's image and question (``<image>count red=``); each policy turn
answers the open question, and the environment replies with a new drawing and a new question
(``<image>count blue=``, the image on :attr:`gspo.envs.base.Step.images`) until ``images``
images were shown (default 3: the prompt's and two replies'). The episode's reward is the
fraction of questions answered right (the ``shapes`` reward: the text after the last ``,``), and
it succeeds when all were.

The replies' drawings are a pure function of the example's problem and the turn (a stable hash
seeds them), so two runs with one seed show the same images whatever the policy writes. A
reply's image tokens are environment tokens: no loss, like the rest of the reply.

Needs a vision-language model (``--model tiny-vl``) and Pillow; this environment is what the
tests of images in multi-turn episodes run (tests/test_vision_envs.py).
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from typing import Any

from gspo.envs.tasks.base import Example
from gspo.envs.tasks.shapes import DEFAULT_SHAPES, sample_shapes

from .base import Step

IMAGES = 3
"""Images an episode shows by default: the prompt's and one per reply after it."""


@dataclass
class TurnsState:
    answers: list[str]
    """The right answer of each question shown so far."""
    problem: str
    right: int = 0
    shown: list[Any] = field(default_factory=list)
    """Examples drawn for the replies (their images are what the policy was shown)."""


class ShapesTurnsEnv:
    """Count shapes in ``images`` images, one per turn (see the module doc)."""

    name = "shapes_turns"
    multi_turn = True
    stop_strings: tuple[str, ...] = ()

    def __init__(self, images: int = IMAGES, shapes: int = DEFAULT_SHAPES) -> None:
        if images < 1:
            raise ValueError(f"shapes_turns: images must be >= 1, got {images}")
        self.images, self.shapes = images, shapes

    def reset(self, example: Example) -> TurnsState:
        return TurnsState(answers=[example.answer], problem=str(example.meta.get("problem", "")))

    def step(self, state: TurnsState, text: str, finished: bool) -> Step:
        said = text.split(",")[-1].strip()
        state.right += said == state.answers[-1]
        turn = len(state.answers)
        if turn >= self.images or not finished:
            score = state.right / turn
            return Step(done=True, reward=score, success=state.right == self.images)
        seed = hashlib.sha256(f"{state.problem}|{turn}".encode()).digest()
        drawn = sample_shapes(random.Random(int.from_bytes(seed[:8], "big")), self.shapes)
        state.answers.append(drawn.answer)
        state.shown.append(drawn)
        return Step(
            done=False,
            messages=[{"role": "user", "content": drawn.prompt}],  # "<image>count blue="
            images=list(drawn.images),
        )


def shapes_turns(task: Any, opts: Any, chat: bool) -> ShapesTurnsEnv:
    """The ``--env`` factory: three images per episode, the replies' drawings of
    :data:`~gspo.envs.tasks.shapes.DEFAULT_SHAPES` shapes (whatever the prompt's difficulty)."""
    del task, opts, chat  # the replies are user messages in either prompt format
    return ShapesTurnsEnv()
