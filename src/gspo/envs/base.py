"""The environment protocol: an episode is a conversation between the policy and an environment.

One episode:

    reset(example) -> state
    loop:  the policy writes a turn (token ids from the engine, decoded to text)
           step(state, turn_text, finished) -> Step
               Step.done False: Step.messages are the environment's reply (a tool result,
                                feedback, a new observation); the policy writes the next turn
               Step.done True:  the episode ends with Step.reward

``Step.turn_reward`` is an optional reward for the turn just taken (per-turn credit, see
:mod:`gspo.envs.credit`); the episode's return is the sum of its turn rewards plus the final
``reward``. A single-turn task is the one-turn case: :class:`SingleTurnEnv` ends every episode
after the first turn with the task's reward.

Environments are plain Python objects; they never see token ids (the driver tokenizes their
messages, :mod:`gspo.envs.trajectory`) and never touch the model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:  # gspo.envs.tasks registers the built-in environments' tasks: no import cycle
    from gspo.envs.tasks.base import Example, RewardFn, Task

Message = dict[str, str]
"""A chat message: ``{"role": "user" | "tool" | ..., "content": str}``."""


@dataclass
class Step:
    """What the environment answers to one policy turn."""

    done: bool
    """True ends the episode (``reward`` is its final reward)."""
    messages: list[Message] = field(default_factory=list)
    """The reply the policy sees before its next turn (empty when ``done``)."""
    reward: float = 0.0
    """Final reward of the episode (read when ``done``)."""
    turn_reward: float = 0.0
    """Reward of the turn just taken (0 for environments without per-turn rewards)."""
    tool_calls: int = 0
    """Tool calls this turn made (for the episode/tool_calls_mean metric)."""
    tool_errors: int = 0
    """Malformed or failed tool calls this turn (episode/tool_errors)."""
    failed: bool = False
    """The episode failed for the environment's own reasons (a tool hung or raised): it ends
    with ``reward``; the driver counts it in episode/failed."""


@runtime_checkable
class Environment(Protocol):
    """Anything that can run episodes over a task's examples."""

    name: str
    multi_turn: bool
    """False: every episode is one turn (the trainer's batched single-turn path applies)."""
    stop_strings: tuple[str, ...]
    """Strings that end a policy turn besides the end-of-turn tokens (a closed tool call)."""

    def reset(self, example: Example) -> Any:
        """Fresh per-episode state for ``example``."""
        ...

    def step(self, state: Any, text: str, finished: bool) -> Step:
        """The environment's answer to the policy turn ``text``. ``finished`` is False when the
        turn was cut by a token limit (the driver ends the episode after this call then)."""
        ...


class SingleTurnEnv:
    """A single-turn task as an environment: one turn, scored by the task's reward.

    A reward that raises scores 0 (as in the trainer's single-turn path).
    """

    multi_turn = False
    stop_strings: tuple[str, ...] = ()

    def __init__(self, reward: RewardFn, name: str = "single_turn") -> None:
        self.reward = reward
        self.name = name

    def reset(self, example: Example) -> Example:
        return example

    def step(self, state: Example, text: str, finished: bool) -> Step:
        try:
            reward = float(self.reward(text, state))
        except Exception:  # a reward that raises scores 0, counted as an error
            return Step(done=True, reward=0.0, failed=True)
        return Step(done=True, reward=reward)


ENVIRONMENTS: dict[str, Any] = {}
"""Multi-turn environments by task name: ``name -> factory(task, cfg, chat) -> Environment``
(``chat``: the run formats prompts with a chat template; else the plain-text conventions)."""


def register_env(name: str):
    """Register a multi-turn environment factory for the built-in task ``name``."""

    def decorator(factory):
        ENVIRONMENTS[name] = factory
        return factory

    return decorator


def env_for(task: Task, cfg: Any = None, chat: bool = False) -> Environment:
    """The environment of ``task``: its registered multi-turn environment, or the task's
    reward as a :class:`SingleTurnEnv`."""
    factory = ENVIRONMENTS.get(task.name)
    if factory is None:
        return SingleTurnEnv(task.reward, name=task.name)
    return factory(task, cfg, chat)
