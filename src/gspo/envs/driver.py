"""The rollout driver: runs episodes of an environment over any rollout engine. Every task
trains through it; a single-turn task is the one-turn case (:func:`run_one_turn`: one
batched round, the engine's rollout kept as it is).

Each round, every unfinished episode's whole context (prompt + turns + replies so far) goes to
``engine.generate`` as one batch; the first round samples ``n`` episodes per prompt at once,
as a one-turn round samples ``n`` completions. The engine's output tokens and
log-probs are appended to the trajectory as they are (token-in, token-out); the environment's
reply is tokenized incrementally (:mod:`gspo.envs.trajectory`).

Openings: an environment whose ``reset`` returns :class:`gspo.envs.base.Opening` gives each
episode its own prompt (the opening messages); the first round then samples each episode from
its own prompt, unless every episode of a group has the same one.

Limits: ``max_turns`` policy turns, ``max_tokens_per_turn`` per turn, ``max_total_tokens``
after the prompt (policy + environment tokens; the turn that crosses it is cut), and
``env_timeout_s`` per environment call (a call that hangs or raises fails the episode, which
is counted in ``episode/failed``; the run goes on). An episode cut by the turn or a token limit
earns the environment's ``cut_reward`` (0.0 without one), not its last step's reward, and is no
success. An environment with ``step_batch`` answers
each round's turns at once (:func:`gspo.envs.base.step_round`) and bounds its own calls.

Engines: anything with the rollout protocol's ``generate(request)``, the
torch engine and the vLLM engine alike (vLLM applies the environment's stop strings on token
ids after the turn is sampled, so a turn can be sampled past its closing ``]]`` and is then
cut there: correct, some wasted tokens). Not cached across turns: every round re-prefills its
context (the torch engine keeps no KV cache between calls).

Async and partial rollouts (``max_staleness`` >= 1, :mod:`gspo.orchestration.async_episodes`)
plug in through ``generate``: a function with ``engine.generate``'s signature that runs each
round. The async producer's hook loads new weights before a round (a turn boundary) and
pauses and continues a turn under new weights (:mod:`gspo.rollout.partial`); when its output
carries ``Rollout.versions``, every policy token keeps its version and the packed rollout has
``versions`` [N, L] (NO_VERSION on environment tokens and padding). On the Ray backend the hook
runs each round on the rollout workers (torch or vLLM) chunk by chunk, new weights entering at
chunk boundaries (:func:`gspo.orchestration.ray_async.chunked_round_generate`); a local vLLM
engine has no such hook (async runs on the local backend need the torch engine).

One-turn episodes (``multi_turn = False``: single-turn tasks as
:class:`gspo.envs.base.SingleTurnEnv`, or a user's own one-turn environment) take one batched
round (:func:`run_one_turn`): ``n`` samples of each prompt from the engine in one ``generate``
call (an MoE policy's routing in ``extras["routing"]``, when the engine holds the torch model),
the completions decoded together (:func:`decode_completions`), and the environment's answers
to the whole round. Every episode ends there, whatever its step says. The rollout is the
engine's own, not repacked (no ``turn_ids``, ``loss_mask`` or policy version): a one-turn
episode's tokens are exactly its completion.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from gspo.envs.tasks.base import Example
from gspo.models import moe
from gspo.models.chat import encode_examples
from gspo.models.logprobs import model_kind
from gspo.rollout.base import PIXELS, GenerationRequest, Rollout, SamplingParams

from .agent import AgentEnvironment
from .agent_driver import run_agent_episodes
from .base import Environment, Step, cut_reward, opening_of, opening_with_images, step_round
from .episode_images import (
    add_reply_pixels,
    attach_pixels,
    episode_pixels,
    opening_ids,
    prompt_pixels,
    reply_ids,
    start_pixels,
)
from .episode_request import EpisodeRequest
from .trajectory import Trajectory, to_rollout


@dataclass(frozen=True)
class Limits:
    """Episode limits."""

    max_turns: int = 4
    """Policy turns per episode; an episode still open after them ends (finish "turns")."""
    max_tokens_per_turn: int = 32
    """Tokens the engine may sample in one turn (finish "length" when a turn is cut)."""
    max_total_tokens: int = 128
    """Policy + environment tokens after the prompt; the episode ends at this budget."""
    env_timeout_s: float = 10.0
    """Seconds one ``env.step`` call may take (0: no limit); past it the episode fails."""
    episode_timeout_s: float = 0.0
    """Agent environments: seconds one whole episode may take (0: no limit); past it the
    episode is cut like a turn limit (finish "timeout", the environment's ``cut_reward``)."""


def run_episodes(
    engine,
    env: Environment,
    encoder,
    examples: list[Example],
    n: int,
    params: SamplingParams,
    limits: Limits,
    generator: torch.Generator | None = None,
    version: int = 0,
    generate: Callable[[GenerationRequest], Rollout] | None = None,
    prompts: list[list[int]] | None = None,
    all_chains: bool = False,
) -> tuple[Rollout, list[Trajectory]]:
    """``n`` episodes per example; returns them packed as a Rollout (rows laid out group after
    group, ``loss_mask`` on policy tokens, ``extras["turn_ids"]`` and
    ``extras["policy_version"]``) and as :class:`Trajectory` records (rewards, turns, tools).

    ``generate(request)`` runs each round (default ``engine.generate``); when its rollouts
    carry per-token ``versions``, so does the result. ``prompts``: the examples' prompt ids when
    the caller has them (the trainer's prompt cache), else the encoder's. One-turn environments (``multi_turn`` False) take one batched round and keep
    the engine's rollout as it is (:mod:`gspo.envs.driver`). ``all_chains``: agent episodes
    train every chain of calls, one row each (:mod:`gspo.envs.agent_driver`)."""
    request = EpisodeRequest(
        engine, env, encoder, examples, n, params, limits, generator, prompts, generate
    )
    if isinstance(env, AgentEnvironment):  # the agent calls the model over HTTP itself
        if any(e.images for e in examples):
            raise ValueError(f"{env.name}: agent environments do not take image prompts")
        return run_agent_episodes(request, version, all_chains)
    if not env.multi_turn:
        return run_one_turn(request)
    generate = engine.generate if generate is None else generate
    tokenizer = encoder.tokenizer
    params = replace(
        params,
        max_new_tokens=limits.max_tokens_per_turn,
        stop_strings=tuple(params.stop_strings) + tuple(env.stop_strings),
    )
    trajs: list[Trajectory] = []
    states: list[Any] = []
    prompt_index: list[int] = []
    starts: list[list[int]] = []
    shared = True  # every episode of a group starts from one prompt
    # Image prompts: ids with the image tokens expanded, pixel inputs once per example.
    image_ids, pixels = prompt_pixels(encoder, examples)
    for i, example in enumerate(examples):
        ids, history = encoder.start(example.prompt)
        if prompts is not None or image_ids is not None:
            ids = list((prompts or image_ids)[i])
        for j in range(n):
            state, opening, shown = opening_with_images(env, example)
            own_ids, own_history, own_pixels = (
                (ids, history, start_pixels(pixels, i, example))
                if opening is None  # (an opening replaces the example's prompt and images)
                else opening_ids(encoder, env.name, opening, shown)
            )
            if j == 0:
                starts.append(own_ids)
            # (Openings with images: each episode from its own, even where the texts agree.)
            shared = shared and own_ids == starts[-1] and not shown
            trajs.append(
                Trajectory(prompt_ids=list(own_ids), history=[dict(m) for m in own_history])
            )
            trajs[-1].pixels = own_pixels
            states.append(state)
            prompt_index.append(i)
    first, stamped, cut = True, False, cut_reward(env)
    # Episodes with images keep a float64 engine's log-probs in float64; text episodes pack
    # them in float32, as they always did (the fixed-seed metrics pin that).
    dtype = torch.float32
    while True:
        active = [k for k, t in enumerate(trajs) if not t.done]
        if not active:
            break
        if first and shared:  # every group starts from one prompt: n samples of each, as one-turn
            out = generate(GenerationRequest(starts, n, params, generator, pixels))
        elif first:  # openings of their own (Opening): one sample of each episode's prompt
            ctx = [t.prompt_ids for t in trajs]
            out = generate(GenerationRequest(ctx, 1, params, generator, episode_pixels(trajs)))
        else:  # each context with its episode's images so far
            ctx, now = [trajs[k].context() for k in active], [trajs[k] for k in active]
            out = generate(GenerationRequest(ctx, 1, params, generator, episode_pixels(now)))
        stamped = out.versions is not None
        if out.logprobs.dtype == torch.float64 and PIXELS in out.extras:
            dtype = torch.float64
        first = False
        turns = [_take_turn(trajs[k], tokenizer, out, row, limits) for row, k in enumerate(active)]
        texts, finished = [x[1] for x in turns], [x[2] for x in turns]
        steps = step_round(env, [states[k] for k in active], texts, finished, limits.env_timeout_s)
        for k, (ids, _, done), step in zip(active, turns, steps, strict=True):
            _advance(trajs[k], step, ids, done, encoder, limits, cut, env.name)
    rollout = to_rollout(
        trajs, prompt_index, pad_id=_pad_id(tokenizer), versions=stamped, logprob_dtype=dtype
    )
    attach_pixels(rollout, trajs)  # episodes with images: each row its own pixel entry
    rollout.extras["policy_version"] = torch.full((len(trajs),), version, dtype=torch.long)
    return rollout, trajs


def _pad_id(tokenizer) -> int:
    pad = tokenizer.pad_token_id
    return int(pad if pad is not None else tokenizer.eos_token_id)


def _take_turn(
    t: Trajectory, tokenizer, out: Rollout, row: int, limits: Limits
) -> tuple[list[int], str, bool]:
    """Append one sampled turn (row ``row`` of ``out``) to ``t``: (its ids, text, finished)."""
    keep = out.completion_mask[row].bool()  # [L]
    ids = out.completion_ids[row][keep].tolist()
    logprobs = out.logprobs[row][keep].tolist()
    versions = None if out.versions is None else out.versions[row][keep].tolist()
    finished = out.finish_reasons[row] == "stop"
    room = limits.max_total_tokens - len(t.ids)
    if len(ids) > room:  # the total budget cuts this turn
        ids, logprobs, finished = ids[:room], logprobs[:room], False
        versions = None if versions is None else versions[:room]
    t.add_policy(ids, logprobs, versions)
    text = tokenizer.decode(ids, skip_special_tokens=True)
    t.history.append({"role": "assistant", "content": text})
    return ids, text, finished


def _advance(
    t: Trajectory,
    step: Step,
    ids: list[int],
    finished: bool,
    encoder,
    limits: Limits,
    cut: float,
    env_name: str = "",
) -> None:
    """The environment's answer ``step`` to the turn ``ids``: append its reply or end ``t``.
    An episode the environment ends earns its step's reward and success; one the driver cuts
    (turn or token limit) earns ``cut`` (the environment's ``cut_reward``) and no success."""
    t.turn_rewards[-1] += step.turn_reward
    t.tool_calls += step.tool_calls
    t.tool_errors += step.tool_errors
    t.info.update(step.info)
    if step.done or step.failed:
        t.done, t.reward, t.success = True, step.reward, False if step.failed else step.success
        t.finish = "failed" if step.failed else ("stop" if finished else "length")
        return
    if not finished:
        _cut(t, cut, "length")
        return
    if t.num_turns >= limits.max_turns:
        _cut(t, cut, "turns")
        return
    # (A reply with images: its image tokens expanded, their pixel inputs made once.)
    reply, shown = reply_ids(encoder, env_name, t.history, ids, step)
    t.history.extend(step.messages)
    if len(t.ids) + len(reply) >= limits.max_total_tokens:  # no room for the reply and a turn
        _cut(t, cut, "length")
        return
    t.add_env(reply)
    add_reply_pixels(t, shown)


def _cut(t: Trajectory, reward: float, finish: str) -> None:
    """End ``t`` at a limit: the step's reward is not final (it is read when done), so the
    episode earns the environment's cut reward, and it is no success."""
    t.done, t.reward, t.success, t.finish = True, reward, False, finish


def episode_metrics(trajs: list[Trajectory]) -> dict[str, float]:
    """episode/* metrics of a batch of episodes (means over episodes; tool_errors and failed
    are totals), and the mean of each namespaced ``Trajectory.info`` value (``vf/correct``)."""
    n = max(len(trajs), 1)
    out = {
        "episode/turns_mean": sum(t.num_turns for t in trajs) / n,
        "episode/tool_calls_mean": sum(t.tool_calls for t in trajs) / n,
        "episode/tool_errors": float(sum(t.tool_errors for t in trajs)),
        "episode/failed": float(sum(t.finish == "failed" for t in trajs)),
        "episode/env_tokens_mean": sum(t.env_tokens for t in trajs) / n,
        "episode/policy_tokens_mean": sum(t.policy_tokens for t in trajs) / n,
        "episode/turn_limit_fraction": sum(t.finish == "turns" for t in trajs) / n,
        "episode/timeout_fraction": sum(t.finish == "timeout" for t in trajs) / n,
    }
    rewards = [r for t in trajs for r in t.turn_rewards]
    if any(rewards):  # environments with per-turn rewards: overall, and per turn index
        out["episode/turn_reward_mean"] = sum(rewards) / len(rewards)
        for k in range(max(t.num_turns for t in trajs)):
            at_k = [t.turn_rewards[k] for t in trajs if t.num_turns > k]
            out[f"episode/turn{k + 1}_reward_mean"] = sum(at_k) / len(at_k)
    # namespaced per-episode values of an environment (a verifiers rubric's "vf/<name>"): their
    # mean over the episodes that carry them, logged under their own name
    for key in sorted({k for t in trajs for k in t.info if "/" in k}):
        values = [t.info[key] for t in trajs if key in t.info]
        out[key] = sum(values) / len(values)
    return out


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
    elif routing and _routes(engine):
        rollout = moe.generate_with_routing(engine, turn)
    else:
        rollout = engine.generate(turn)
    trajs = answer_round(env, encoder.tokenizer, rollout, examples, limits.env_timeout_s, prompts)
    return rollout, trajs


def _routes(engine: Any) -> bool:
    """Whether the engine runs an MoE torch model in this process (whose routing R3 replays)."""
    model = getattr(engine, "model", None)
    return model is not None and model_kind(model).moe


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


def decode_completions(
    tokenizer, completion_ids: torch.Tensor, completion_mask: torch.Tensor
) -> list[str]:
    """Completion texts without padding and special tokens (EOS is not part of the answer)."""
    # One host copy of each tensor, then plain lists: indexing every row as a tensor costs
    # several ops per row (~1k ops per 128-row rollout).
    keep = completion_mask.cpu().bool().tolist()  # [N][L]
    rows = [
        [t for t, k in zip(ids, m, strict=True) if k]
        for ids, m in zip(completion_ids.cpu().tolist(), keep, strict=True)
    ]
    return tokenizer.batch_decode(rows, skip_special_tokens=True)


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
