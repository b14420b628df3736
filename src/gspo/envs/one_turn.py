"""One-turn episodes: the driver's round for environments whose every episode is one turn
(``multi_turn = False``: single-turn tasks as :class:`gspo.envs.base.SingleTurnEnv`, or a
user's own one-turn environment).

One batched round: ``n`` samples of each prompt from the engine in one ``generate`` call (with
the engine's MoE routing in ``extras["routing"]`` when the engine holds a torch model,
:func:`gspo.models.moe.generate_with_routing`), the completions decoded together, and the
environment's answers to the whole round (its ``step_batch``, or ``step`` per episode with the
driver's timeout). Every episode ends there, whatever its step says. The rollout is the
engine's own, not repacked (no ``turn_ids``, ``loss_mask`` or policy version): a one-turn
episode's tokens are exactly its completion.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gspo.envs.tasks.base import Example
from gspo.models import moe
from gspo.models.chat import encode_examples
from gspo.models.text import decode_completions
from gspo.rollout.base import GenerationRequest, Rollout

from .base import Environment, opening_of
from .env_round import step_round
from .episode_request import EpisodeRequest
from .trajectory import Trajectory


def run_one_turn(
    request: EpisodeRequest, *, routing: bool = True
) -> tuple[Rollout, list[Trajectory]]:
    """The request's one-turn episodes (see the module doc); its ``prompts`` when the caller
    has them (the trainer's prompt cache), else the encoder's. ``routing`` False: plain
    ``engine.generate``, no MoE routing record (evaluation); the request's ``generate`` runs
    the round instead (a caller's hook, as in the multi-turn driver)."""
    engine, env, encoder, examples = request.engine, request.env, request.encoder, request.examples
    prompts, generate, limits = request.prompts, request.generate, request.limits
    pixels = None
    if any(e.images for e in examples):
        # Image prompts: the processor expands each <image> and makes the pixel inputs, once
        # per prompt for its whole group; the engine's rollout carries them to the update.
        ids, pixels = encode_examples(encoder.fmt, examples)
        prompts = ids if prompts is None else prompts
        if generate is not None:
            raise ValueError(
                "image prompts need an engine that takes pixel inputs: the torch engine (in this "
                "process or on Ray rollout workers) or vLLM in this process"
            )
    if prompts is None:
        prompts = [encoder.start(e.prompt)[0] for e in examples]
    params = replace(
        request.params,
        max_new_tokens=min(limits.max_tokens_per_turn, limits.max_total_tokens),
        stop_strings=tuple(request.params.stop_strings) + tuple(env.stop_strings),
    )
    turn = GenerationRequest(prompts, request.n, params, request.generator, pixels)
    if pixels is not None:
        rollout = engine.generate(turn)
    elif generate is not None:
        rollout = generate(turn)
    elif routing:
        rollout = moe.generate_with_routing(engine, turn)
    else:
        rollout = engine.generate(turn)
    trajs = answer_round(env, encoder.tokenizer, rollout, examples, limits.env_timeout_s, prompts)
    return rollout, trajs


def answer_round(
    env: Environment,
    tokenizer: Any,
    rollout: Rollout,
    examples: list[Example],
    timeout_s: float,
    prompts: list[list[int]] | None = None,
) -> list[Trajectory]:
    """Every row of a one-turn ``rollout`` (row i*n + j: sample j of ``examples[i]``) as a
    finished trajectory with the environment's reward for it (``history``: the prompt and the
    decoded completion; ``prompt_ids``: ``prompts``' when given, else empty)."""
    texts = decode_completions(tokenizer, rollout.completion_ids, rollout.completion_mask)
    rows = rollout.prompt_index.tolist()
    states = [_state(env, examples[i]) for i in rows]
    finished = [f == "stop" for f in rollout.finish_reasons]
    steps = step_round(env, states, texts, finished, timeout_s)
    # Plain lists, one host copy each: per-row tensor indexing costs several ops per row.
    ids = rollout.completion_ids.cpu().tolist()  # [N][L]
    mask = rollout.completion_mask.cpu().bool().tolist()  # [N][L]
    logprobs = rollout.logprobs.cpu().tolist()  # [N][L]
    trajs = []
    for k, (i, step) in enumerate(zip(rows, steps, strict=True)):
        history = [{"role": "user", "content": examples[i].prompt}]
        history.append({"role": "assistant", "content": texts[k]})
        t = Trajectory(prompt_ids=list(prompts[i]) if prompts is not None else [], history=history)
        keep = mask[k]
        t.add_policy(
            [x for x, m in zip(ids[k], keep, strict=True) if m],
            [x for x, m in zip(logprobs[k], keep, strict=True) if m],
        )
        t.turn_rewards[-1] = step.turn_reward
        t.tool_calls, t.tool_errors, t.info = step.tool_calls, step.tool_errors, step.info
        t.done, t.reward, t.success = True, step.reward, False if step.failed else step.success
        t.finish = "failed" if step.failed else rollout.finish_reasons[k]
        trajs.append(t)
    return trajs


def _state(env: Environment, example: Example) -> Any:
    """The state of a one-turn episode. Its prompt is the example's (the round samples every
    group from one prompt), so an opening observation is refused rather than ignored."""
    state, opening = opening_of(env, example)
    if opening is not None:
        raise ValueError(
            f"{env.name}: reset returned an Opening, but a one-turn environment (multi_turn "
            "False) is prompted with the example's prompt; set multi_turn = True to use openings"
        )
    return state
