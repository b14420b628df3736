"""The environment protocol: an episode is a conversation between the policy and an environment.

One episode:

    reset(example) -> state, or Opening(state, messages)
    loop:  the policy writes a turn (token ids from the engine, decoded to text)
           step(state, turn_text, finished) -> Step
               Step.done False: Step.messages are the environment's reply (a tool result,
                                feedback, a new observation); the policy writes the next turn
               Step.done True:  the episode ends with Step.reward and Step.success

``reset`` may return :class:`Opening`: its ``messages`` are the episode's opening observation,
which the policy sees as its prompt (after the task's system prompt, if any) instead of the
example's prompt, so a game is created once, in ``reset``. Any other return value is the state.

``success`` is the environment's verdict on a finished episode (a won game, all tests passed):
``eval/success`` counts the episodes that reported True, never a positive reward. An episode the
driver cuts (the turn limit, or a token limit) earns the environment's ``cut_reward`` (an
optional attribute; absent: 0.0) and is not a success, whatever its last step said.

``Step.turn_reward`` is an optional reward for the turn just taken (per-turn credit, see
:mod:`gspo.envs.credit`); the episode's return is the sum of its turn rewards plus the final
``reward``. A single-turn task is the one-turn case: :class:`SingleTurnEnv` ends every episode
after the first turn with the task's reward. Every task, single- or multi-turn, trains through
these environments and one driver (:mod:`gspo.envs.driver`).

Optional: ``step_batch(states, texts, finished) -> list[Step]`` answers a whole round of turns
at once (the driver calls it when an environment has it; else ``step`` per episode, each with
the driver's timeout). :class:`SingleTurnEnv` implements it with the reward workers and the
reward timeout of :func:`gspo.envs.rewards.score`. :func:`step_round` is the environment's
side of a round for both the multi-turn and the one-turn driver: its answers to every episode's
turn, each call bounded by a timeout.

Environments are plain Python objects; they never see token ids (the driver tokenizes their
messages, :mod:`gspo.envs.trajectory`) and never touch the model.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from gspo.config.names import format_bonus_refusal, integration_of
from gspo.config.plugins import resolve
from gspo.core.metrics import CORRECT
from gspo.envs.rewards import score_each

if TYPE_CHECKING:  # annotations only: the task modules import the rewards, which import this
    from gspo.config.options_task import TaskOptions
    from gspo.envs.tasks.base import Example, RewardFn, Task
import threading

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
    info: dict[str, float] = field(default_factory=dict)
    """Per-episode values besides the reward, kept on the trajectory (``"task"``: the task's
    own reward when the training reward adds a format bonus, logged as ``reward/task``)."""
    success: bool | None = None
    """Read when ``done``: the environment's verdict on the episode (True: solved; None: the
    environment says nothing, counted as no success)."""
    images: list[Any] = field(default_factory=list)
    """Images the reply shows (paths, bytes or PIL images), one per ``<image>`` placeholder in
    its messages' text, in order (vision-language models only: the driver expands each with
    the processor; image tokens are environment tokens, masked out of the loss)."""


@dataclass
class Opening:
    """What :meth:`Environment.reset` may return instead of a bare state: the episode's state
    and its opening observation ``messages``, the policy's prompt (after the task's system
    prompt, if any) in place of the example's prompt."""

    state: Any
    messages: list[Message]
    images: list[Any] = field(default_factory=list)
    """Images the opening shows (a board), one ``<image>`` placeholder each in its messages'
    text, in order (vision-language models only, as :attr:`Step.images`)."""


def opening_of(env: Environment, example: Example) -> tuple[Any, list[Message] | None]:
    """``env.reset(example)`` as (state, opening messages or None: the example's prompt)."""
    state, messages, _ = opening_with_images(env, example)
    return state, messages


def opening_with_images(
    env: Environment, example: Example
) -> tuple[Any, list[Message] | None, tuple[Any, ...]]:
    """``env.reset(example)`` as (state, opening messages or None, the opening's images)."""
    state = env.reset(example)
    if isinstance(state, Opening):
        return state.state, [dict(m) for m in state.messages], tuple(state.images or ())
    return state, None, ()


def cut_reward(env: Environment) -> float:
    """What an episode of ``env`` that the driver cut (turn or token limit) earns: the
    environment's ``cut_reward`` attribute, 0.0 without one."""
    return float(getattr(env, "cut_reward", 0.0))


@runtime_checkable
class Environment(Protocol):
    """Anything that can run episodes over a task's examples."""

    name: str
    multi_turn: bool
    """False: every episode is one turn; the driver samples one batched round and returns the
    engine's rollout as it is (MoE routing included), with ``finished`` as the engine said."""
    stop_strings: tuple[str, ...]
    """Strings that end a policy turn besides the end-of-turn tokens (a closed tool call)."""

    def reset(self, example: Example) -> Any:
        """Fresh per-episode state for ``example`` (or an :class:`Opening`: the state and the
        episode's opening messages)."""
        ...

    def step(self, state: Any, text: str, finished: bool) -> Step:
        """The environment's answer to the policy turn ``text``. ``finished`` is False when the
        turn was cut by a token limit (the driver ends the episode after this call then)."""
        ...


class SingleTurnEnv:
    """A single-turn task as an environment: one turn, scored by the task's reward.

    A round is scored at once (:meth:`step_batch`): ``workers`` reward calls in parallel, each
    bounded by ``timeout_s`` seconds (None: no bound), in this process or by ``scorer``. A reward that raises, returns no finite
    number or runs out of time scores 0 and fails its episode (a reward error). With
    ``task_reward`` (the task's own reward, when ``reward`` adds a format bonus to it), each
    step's ``info["task"]`` holds it too.

    A step's ``success`` is the task's correctness: its reward (the task's own, without a format
    bonus) is at least ``CORRECT`` (1 for the built-in tasks' 0/1 rewards); a failed reward is
    no success.
    """

    multi_turn = False
    stop_strings: tuple[str, ...] = ()

    def __init__(
        self,
        reward: RewardFn,
        name: str = "single_turn",
        *,
        task_reward: RewardFn | None = None,
        timeout_s: float | None = None,
        workers: int = 1,
        scorer: Any = None,
    ) -> None:
        self.reward = reward
        self.name = name
        self.task_reward = task_reward
        self.timeout_s = timeout_s
        self.workers = workers
        self.scorer = scorer
        """Scores a round with :func:`gspo.envs.rewards.score_each`'s signature (Ray tasks:
        ``RayScorer.each``); None: ``score_each`` in this process."""

    def reset(self, example: Example) -> Example:
        return example

    def step(self, state: Example, text: str, finished: bool) -> Step:
        return self.step_batch([state], [text], [finished])[0]

    def step_batch(
        self, states: list[Example], texts: list[str], finished: list[bool]
    ) -> list[Step]:

        each = self.scorer or score_each
        values = each(self.reward, texts, states, timeout_s=self.timeout_s, workers=self.workers)
        out = [
            Step(done=True, failed=True, success=False)
            if v is None
            else Step(done=True, reward=v, success=v >= CORRECT)
            for v in values
        ]
        if self.task_reward is not None:  # errors of the task reward alone are not counted
            task = each(self.task_reward, texts, states, workers=self.workers)
            for step, value in zip(out, task, strict=True):
                step.info["task"] = 0.0 if value is None else value
                step.success = not step.failed and step.info["task"] >= CORRECT
        return out


ENVIRONMENTS: dict[str, Any] = {}
"""Multi-turn environments by task name: ``name -> factory(task, opts, chat) -> Environment``
(``opts``: the run's :class:`~gspo.config.options.TaskOptions`;
``chat``: the run formats prompts with a chat template; else the plain-text conventions)."""


def register_env(name: str):
    """Register a multi-turn environment factory for the built-in task ``name``."""

    def decorator(factory):
        ENVIRONMENTS[name] = factory
        return factory

    return decorator


INTEGRATION_ENVS: dict[str, Any] = {}
"""The environment factories of outside packages' tasks by prefix (gspo.envs.integrations fills
it): the task ``textarena:GuessTheNumber-v0`` runs in ``INTEGRATION_ENVS["textarena"]``'s."""


def registered_env(name: str) -> Any:
    """The environment factory registered for the task ``name`` (or its integration), or None."""
    factory = ENVIRONMENTS.get(name)
    return factory if factory is not None else INTEGRATION_ENVS.get(integration_of(name))


def format_bonus_problem(task: str, weight: float) -> str | None:
    """Why ``format_reward_weight`` cannot apply to ``task``, or None: a task with a registered
    environment is scored by that environment alone, so a format bonus would be ignored."""
    return (
        format_bonus_refusal(task, weight) if weight and registered_env(task) is not None else None
    )


def env_factory(task: Task, opts: TaskOptions) -> Any:
    """The environment factory of ``task``: the one ``opts.env`` names (``module:factory``,
    imported now), else the one registered for the task's name, else None (single-turn)."""
    if opts.env is not None:
        return resolve("env", opts.env)
    return registered_env(task.name)


def env_for(task: Task, opts: TaskOptions, chat: bool = False) -> Environment:
    """The environment of ``task``: ``--env module:factory`` or its registered multi-turn
    environment (with the run's task options, e.g. tool_timeout_s), or the task's reward as a
    :class:`SingleTurnEnv`."""
    factory = env_factory(task, opts)
    if factory is None:
        return SingleTurnEnv(task.reward, name=task.name)
    return factory(task, opts, chat)


def _step(env: Environment, state: Any, text: str, finished: bool, timeout_s: float) -> Step:
    """``env.step`` with a timeout; a hang or an exception is a failed step with reward 0."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["step"] = env.step(state, text, finished)
        except BaseException as exc:  # the environment failing fails the episode
            box["err"] = exc

    thread = threading.Thread(target=target, daemon=True, name="gspo-env-step")
    thread.start()
    thread.join(timeout_s if timeout_s > 0 else None)
    if thread.is_alive() or "err" in box:
        return Step(done=True, failed=True, tool_errors=1)
    return box["step"]


def step_round(
    env: Environment, states: list, texts: list[str], finished: list[bool], timeout_s: float
) -> list[Step]:
    """The environment's answers to a round of turns: its ``step_batch`` when it has one (the
    whole round at once: parallel reward workers), else ``step`` per episode, each bounded by
    ``timeout_s`` (a hang or a raise fails that episode)."""
    batched = getattr(env, "step_batch", None)
    if batched is None:
        return [_step(env, *a, timeout_s) for a in zip(states, texts, finished, strict=True)]
    steps = list(batched(states, texts, finished))
    if len(steps) != len(states):
        raise ValueError(f"{env.name}: step_batch answered {len(steps)} steps for {len(states)}")
    return steps
