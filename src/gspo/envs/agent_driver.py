"""The agent driver: agent episodes (:mod:`gspo.envs.agent`) over the run's engine, through the
OpenAI-compatible endpoint (:mod:`gspo.rollout.openai_server`).

For each call the driver starts the endpoint on ``host`` (127.0.0.1, a free port by default),
gives every episode its own base URL (``http://127.0.0.1:PORT/episodes/<id>/v1``), runs the
``n`` episodes of each example concurrently as asyncio tasks, and batches their requests into
``generate`` rounds (:class:`~gspo.rollout.request_batcher.RequestBatcher`). Sampling is the
run's: requests may ask fewer tokens than ``max_tokens_per_turn``, never another temperature.

Every completion an episode requested is recorded as sampled (prompt ids, sampled ids,
log-probs, policy version) and becomes tokens of its trajectory: a call whose prompt extends
the episode's previous prompt + completion continues that trajectory (the tokens between are
environment tokens, no loss); a call that does not starts a new chain (an agent that rewrites
or summarizes its history, or branches).

Which chains train (``all_chains``):
* True (training, where a step's rows need not be ``n`` per example): **every chain is a row**
  with the episode's reward, finish and verdict, marked with its episode
  (``Trajectory.episode``); the episode's advantage is computed over the ``n`` episodes of its
  example and given to each of its rows (:func:`chain_advantages`);
* False (evaluation, and training modes that keep ``n`` rows per example: dynamic sampling,
  rollouts ahead of training, per-turn credit, ``minibatch_grouping='groups'``): an episode is
  ONE row, the chain of its last call; calls on other chains are counted in the row's
  ``info["unchained_calls"]``.
Within a group, the rows' common prompt prefix is the prompt; the rest of each row's prompt is
environment tokens.

Limits: ``max_turns`` completions per episode; ``max_total_tokens`` tokens of the episode's
trajectories after their first prompt (sampled + environment tokens); a request's tokens are
capped by what is left. Past a limit the endpoint answers the episode's request with HTTP 400
(type "episode_limit"), the driver cancels the episode's task, and the episode earns the
environment's ``cut_reward`` (default 0; finish "turns" or "length"). ``episode_timeout_s``:
an episode still running after it is cancelled and cut the same way (finish "timeout"). An
agent that raises fails its episode (reward 0, finish "failed", counted in
``episode/failed``), never the run.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch

from gspo.core.losses import group_advantages
from gspo.envs.tasks.base import Example
from gspo.rollout.base import Rollout
from gspo.rollout.openai_errors import EpisodeLimit
from gspo.rollout.openai_server import OpenAIEndpoint, ServerThread
from gspo.rollout.openai_vllm import protocol_for
from gspo.rollout.request_batcher import RequestBatcher, Sample

from .agent import AgentClient, AgentEpisodes, AgentOutcome, cut_reward
from .episode_request import EpisodeRequest
from .trajectory import Trajectory, to_rollout

logger = logging.getLogger(__name__)

MODEL_NAME = "gspo-policy"
"""The model name the training endpoint answers to (any name is accepted)."""
PATIENCE_S = 5.0
"""Liveness fallback of the round batching (see :mod:`gspo.rollout.request_batcher`)."""


@dataclass
class _Episode:
    example: int
    chains: list[Trajectory] = field(default_factory=list)
    last: Trajectory | None = None
    calls: int = 0
    cut: str = ""
    """"turns" or "length" once a limit refused a request, "timeout" once the episode ran past
    ``episode_timeout_s``."""


class EpisodeBook:
    """The endpoint's hooks for a driver call: checks each request against the limits and
    records each completion into its episode's trajectories (server thread only)."""

    def __init__(self, limits, on_cut: Callable[[str], None] = lambda eid: None) -> None:
        self.limits = limits
        self.on_cut = on_cut
        self.episodes: dict[str, _Episode] = {}
        self.stamped = False

    def open(self, eid: str, example: int) -> None:
        self.episodes[eid] = _Episode(example)

    def _chain(self, ep: _Episode, prompt: list[int]) -> Trajectory | None:
        for t in reversed(ep.chains):
            ctx = t.context()
            if len(prompt) >= len(ctx) and prompt[: len(ctx)] == ctx:
                return t
        return None

    def time_out(self, eid: str) -> None:
        """The episode ran past its time: its later requests are refused as a cut one's."""
        ep = self.episodes[eid]
        ep.cut = ep.cut or "timeout"

    def _refuse(self, eid: str, ep: _Episode, why: str, message: str):
        ep.cut = why
        self.on_cut(eid)
        raise EpisodeLimit(f"episode {eid}: {message}")

    def admit(self, eid: str, prompt: list[int], max_new: int) -> int:
        ep = self.episodes[eid]
        lim = self.limits
        if ep.cut:
            raise EpisodeLimit(f"episode {eid} was cut by a limit ({ep.cut})")
        if ep.calls >= lim.max_turns:
            self._refuse(eid, ep, "turns", f"reached max_turns={lim.max_turns} completions")
        used = sum(len(t.ids) for t in ep.chains)
        chain = self._chain(ep, prompt)
        if chain is not None:
            used += len(prompt) - len(chain.context())
        room = lim.max_total_tokens - used
        if room <= 0:
            msg = f"reached max_total_tokens={lim.max_total_tokens} ({used} tokens)"
            self._refuse(eid, ep, "length", msg)
        ep.calls += 1
        return min(max_new, room)

    def record(self, eid: str, prompt: list[int], sample: Sample) -> None:
        ep = self.episodes[eid]
        chain = self._chain(ep, prompt)
        if chain is None:
            chain = Trajectory(prompt_ids=list(prompt), history=[])
            ep.chains.append(chain)
        else:
            chain.add_env(prompt[len(chain.context()) :])
        self.stamped |= sample.versions is not None
        chain.add_policy(sample.ids, sample.logprobs, sample.versions)
        ep.last = chain


def run_agent_episodes(
    request: EpisodeRequest, version: int = 0, all_chains: bool = False
) -> tuple[Rollout, list[Trajectory]]:
    """The request's agent episodes, returned as :func:`gspo.envs.driver.run_episodes` returns
    them (group after group, ``extras["policy_version"]``): one row per episode, or with
    ``all_chains`` one per chain of calls (see the module doc). The endpoint listens where an
    :class:`~gspo.envs.agent.AgentEpisodes` says (the run's ``endpoint_host``/
    ``endpoint_port``), else on 127.0.0.1 at a free port."""
    engine, env, encoder, examples = request.engine, request.env, request.encoder, request.examples
    n, limits, generator, prompts = request.n, request.limits, request.generator, request.prompts
    host, port = (env.host, env.port) if isinstance(env, AgentEpisodes) else ("127.0.0.1", 0)
    generate = engine.generate if request.generate is None else request.generate
    params = replace(request.params, max_new_tokens=limits.max_tokens_per_turn)
    book = EpisodeBook(limits)
    batcher = RequestBatcher(generate, generator=generator, patience_s=PATIENCE_S)
    endpoint = OpenAIEndpoint(batcher, encoder, MODEL_NAME, params, fixed=True, episodes=book,
                              protocol=protocol_for(engine))  # fmt: skip
    server = ServerThread(endpoint, host, port).start()
    sampling = {
        "temperature": params.temperature,
        "top_p": params.top_p,
        "max_tokens": limits.max_tokens_per_turn,
    }
    try:
        timeout = limits.episode_timeout_s
        results = asyncio.run(_run_all(env, examples, n, server, book, batcher, sampling, timeout))
    finally:
        server.stop()
    if batcher.fallback_rounds:
        logger.warning("%d endpoint rounds ran before every live episode had a request pending "
                       "(liveness fallback after %.0f s)", batcher.fallback_rounds, PATIENCE_S)  # fmt: skip
    trajs, index = [], []
    for k, ((eid, ep), result) in enumerate(zip(book.episodes.items(), results, strict=True)):
        start = prompts[ep.example] if prompts is not None else None
        if start is None:
            start = encoder.start(examples[ep.example].prompt)[0]
        rows = _finish(env, eid, ep, result, start, all_chains)
        for t in rows:
            t.episode = k if all_chains else None
        trajs += rows
        index += [ep.example] * len(rows)
    _share_prompts(trajs, index)
    pad = encoder.tokenizer.pad_token_id
    pad = encoder.tokenizer.eos_token_id if pad is None else pad
    rollout = to_rollout(trajs, index, pad_id=int(pad), versions=book.stamped)
    rollout.extras["policy_version"] = torch.full((len(trajs),), version, dtype=torch.long)
    return rollout, trajs


async def _run_all(env, examples, n, server, book, batcher, sampling, timeout_s) -> list:
    loop = asyncio.get_running_loop()
    tasks: dict[str, asyncio.Task] = {}

    def cancel(eid: str) -> None:  # the server thread: the episode's task stops in this loop
        loop.call_soon_threadsafe(tasks[eid].cancel)

    book.on_cut = cancel

    async def episode(eid: str, example: Example) -> AgentOutcome:
        client = AgentClient(server.url(eid), "gspo", MODEL_NAME, dict(sampling))
        try:
            if not timeout_s:
                return await env.run_episode(example, client)
            try:  # an agent that hangs: cancelled, and cut as a limit cuts it
                return await asyncio.wait_for(env.run_episode(example, client), timeout_s)
            except TimeoutError:
                book.time_out(eid)
                raise
        finally:
            batcher.end(eid)
            server.endpoint.forget(eid)

    for i in range(len(examples)):
        for j in range(n):
            eid = f"{i}-{j}"
            book.open(eid, i)
            batcher.register(eid)
    for eid, ep in book.episodes.items():
        tasks[eid] = asyncio.create_task(episode(eid, examples[ep.example]))
    return await asyncio.gather(*tasks.values(), return_exceptions=True)


def _finish(
    env, eid: str, ep: _Episode, result, start: list[int], all_chains: bool
) -> list[Trajectory]:
    """The episode's training rows (every chain, or the last one) with its reward and finish."""
    if ep.last is None:  # no call: one empty row
        rows = [Trajectory(prompt_ids=list(start), history=[])]
    elif all_chains:
        rows = list(ep.chains)
    else:
        rows = [ep.last]
        if len(ep.chains) > 1:
            ep.last.info["unchained_calls"] = float(ep.calls - ep.last.num_turns)
    info: dict[str, float] = {}
    if ep.cut:  # as the driver's cut episodes: the cut reward and no success
        reward, finish, success = cut_reward(env), ep.cut, False
    elif isinstance(result, AgentOutcome):
        reward, finish, success = float(result.reward), "stop", result.success
        info = result.info
    else:
        why = result if isinstance(result, BaseException) else f"returned {result!r}"
        logger.warning("agent episode %s failed: %s", eid, why)
        reward, finish, success = 0.0, "failed", False
    for t in rows:
        t.done, t.reward, t.finish, t.success = True, reward, finish, success
        t.info.update(info)
    return rows


def chain_advantages(
    returns: torch.Tensor, episodes: list[int], group_size: int, scale: str
) -> torch.Tensor:  # [N]
    """Rows of episodes that train every chain (``all_chains``): each episode's group
    advantage (its return against the ``group_size`` episodes of its example, episodes
    numbered group after group), given to every row of it. ``returns`` [N]: per row, its
    episode's return."""
    first: dict[int, int] = {}
    for row, e in enumerate(episodes):
        first.setdefault(e, row)
    if sorted(first) != list(range(len(first))):
        raise ValueError(f"episodes must be numbered 0..{len(first) - 1}, got {sorted(first)}")
    per_episode = returns[[first[e] for e in range(len(first))]]  # [E]
    adv = group_advantages(per_episode, group_size, scale=scale)  # [E]
    return adv[episodes]  # [N]


def _share_prompts(trajs: list[Trajectory], index: list[int]) -> None:
    """Within a group, make the rows' common prompt prefix their prompt: the rest of each row's
    prompt becomes environment tokens (rows of one ``prompt_index`` share one prompt)."""
    groups: dict[int, list[Trajectory]] = {}
    for t, i in zip(trajs, index, strict=True):
        groups.setdefault(i, []).append(t)
    for rows in groups.values():
        common = min(len(t.prompt_ids) for t in rows)
        for t in rows[1:]:
            a, b = rows[0].prompt_ids, t.prompt_ids
            common = next((k for k in range(common) if a[k] != b[k]), common)
        common = max(common, 1)  # rows that share no token keep their first token as prompt
        for t in rows:
            rest = t.prompt_ids[common:]
            if rest:
                moved = Trajectory(prompt_ids=t.prompt_ids[:common], history=[])
                moved.add_env(rest)
                t.ids, t.policy = moved.ids + t.ids, moved.policy + t.policy
                t.logprobs, t.turn = moved.logprobs + t.logprobs, moved.turn + t.turn
                t.versions = moved.versions + t.versions
                t.prompt_ids = t.prompt_ids[:common]
