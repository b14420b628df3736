"""The environment's side of a round: its answers to every episode's turn, each call bounded by a
timeout. Shared by the multi-turn driver (:mod:`gspo.envs.driver`) and the one-turn round
(:mod:`gspo.envs.one_turn`), which the driver calls, so it lives in neither."""

from __future__ import annotations

import threading
from typing import Any

from .base import Environment, Step


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
