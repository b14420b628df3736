"""Agent environments: the agent drives the model itself, through an OpenAI-compatible endpoint.

A passive environment (:mod:`gspo.envs.base`) answers turns the driver samples. An *agent*
environment is the other way round: its ``run_episode(example, client)`` runs the agent's own
loop (tools, sub-processes, a framework such as verifiers 0.4) and calls the model over HTTP
at ``client.base_url`` whenever it wants a completion. The driver
(:func:`gspo.envs.agent_driver.run_agent_episodes`) serves the run's engine there, records
every completion an episode requested (token ids, log-probs, policy version) and trains on
exactly those tokens (token-in, token-out). See docs/endpoint.md.

``cut_reward`` (optional attribute, absent: 0.0): what an episode cut by a limit
(``max_turns`` completions, ``max_total_tokens``) earns. An agent's exception fails its
episode (reward 0, counted in ``episode/failed``), never the run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:  # annotations only
    from gspo.envs.tasks.base import Example


@dataclass(frozen=True)
class AgentClient:
    """Where and how an episode's agent reaches the model."""

    base_url: str
    """OpenAI-compatible base URL of THIS episode, ending in "/v1"."""
    api_key: str
    """Any non-empty string (clients require one; the endpoint ignores it)."""
    model: str
    """The model name the endpoint answers to."""
    sampling: dict[str, Any]
    """The run's sampling defaults: ``temperature``, ``top_p``, ``max_tokens``."""


@dataclass
class AgentOutcome:
    """What an agent episode earned."""

    reward: float
    success: bool | None = None
    """The environment's own verdict (None: not stated)."""
    info: dict[str, float] = field(default_factory=dict)
    """Extra per-episode metrics (rubric parts...), kept on the trajectory."""


@runtime_checkable
class AgentEnvironment(Protocol):
    """An environment whose episodes are agent programs calling the model themselves."""

    name: str

    async def run_episode(self, example: Example, client: AgentClient) -> AgentOutcome:
        """Run one episode of ``example``, calling the model through ``client``."""
        ...


def cut_reward(env: Any) -> float:
    """What an episode of ``env`` cut by a limit earns (its ``cut_reward``, default 0.0)."""
    return float(getattr(env, "cut_reward", 0.0))


class AgentEpisodes:
    """An agent environment as the trainer's episodes see environments: multi-turn, no stop
    strings of its own (the run's parts ask ``env.multi_turn``), with the address its
    episodes' endpoint listens on (``port`` 0: a free one); episodes still go to the agent
    driver (it is an :class:`AgentEnvironment`)."""

    multi_turn = True
    stop_strings: tuple[str, ...] = ()

    def __init__(self, agent: AgentEnvironment, host: str = "127.0.0.1", port: int = 0) -> None:
        self.agent = agent
        self.name = agent.name
        self.cut_reward = cut_reward(agent)
        self.host = host
        self.port = port

    async def run_episode(self, example: Example, client: AgentClient) -> AgentOutcome:
        return await self.agent.run_episode(example, client)


def episode_env(env: Any, host: str = "127.0.0.1", port: int = 0) -> Any:
    """``env`` as the trainer's episodes take it: an agent environment (the protocol alone is
    enough) wrapped in :class:`AgentEpisodes` with its endpoint's address; others as they are."""
    if isinstance(env, AgentEnvironment) and not isinstance(env, AgentEpisodes):
        return AgentEpisodes(env, host, port)
    return env
