"""A tool-using environment: the policy calls tools until it writes a final answer.

Each policy turn either holds tool calls (each is run and its result is the reply) or is the
final answer, scored by the task's reward. A malformed call (or an unknown tool) is answered
with an error message and costs ``error_penalty`` as a turn reward; a tool that raises or hangs
ends the episode as failed (reward 0).
"""

from __future__ import annotations

from dataclasses import dataclass

from gspo.core.metrics import CORRECT
from gspo.envs.tasks.base import Example, RewardFn

from .base import Step
from .tools import (
    PLAIN_STOP,
    QWEN_STOP,
    Call,
    MalformedCall,
    Tool,
    ToolFailure,
    argument_of,
    parse_calls,
    run_tool,
)


@dataclass
class _State:
    example: Example


class ToolEnv:
    """Tools + a final-answer reward, in the Qwen convention (chat) or the plain fallback."""

    multi_turn = True

    def __init__(
        self,
        name: str,
        tools: list[Tool],
        reward: RewardFn,
        *,
        plain: bool,
        tool_timeout_s: float = 10.0,
        error_penalty: float = 0.0,
    ) -> None:
        self.name = name
        self.tools = {t.name: t for t in tools}
        self.reward = reward
        self.plain = plain
        self.tool_timeout_s = tool_timeout_s
        self.error_penalty = error_penalty
        self.stop_strings = (PLAIN_STOP,) if plain else (QWEN_STOP,)

    def reset(self, example: Example) -> _State:
        return _State(example)

    def _reply(self, content: str) -> dict[str, str]:
        if self.plain:
            return {"role": "tool", "content": f" => {content} "}
        return {"role": "tool", "content": content}

    def tools_of(self, state) -> dict[str, Tool]:
        """The tools this episode can call (the same for every episode here)."""
        return self.tools

    def final_reward(self, state, text: str) -> float:
        """The reward of a final answer ``text``."""
        return self.reward(text, state.example)

    def step(self, state: _State, text: str, finished: bool) -> Step:
        calls = parse_calls(text, self.plain)
        if not calls:  # a final answer
            try:
                reward = float(self.final_reward(state, text))
            except Exception:  # a reward that raises scores 0
                return Step(done=True, reward=0.0, failed=True, success=False)
            # success: the final answer is right (the task's reward reaches CORRECT)
            return Step(done=True, reward=reward, success=reward >= CORRECT)
        messages: list[dict[str, str]] = []
        errors = 0
        for call in calls:
            try:
                if isinstance(call, MalformedCall):
                    raise call
                assert isinstance(call, Call)
                tools = self.tools_of(state)
                tool = tools.get(call.name)
                if tool is None:
                    raise MalformedCall(
                        f"unknown tool {call.name!r}; tools: {', '.join(sorted(tools))}"
                    )
                result = run_tool(tool, argument_of(tool, call, self.plain), self.tool_timeout_s)
            except MalformedCall as exc:
                errors += 1
                result = f"error: {exc}"
            except ToolFailure:
                return Step(done=True, failed=True, tool_calls=len(calls), tool_errors=errors + 1)
            messages.append(self._reply(result))
        return Step(
            done=False,
            messages=messages,
            turn_reward=-self.error_penalty * errors,
            tool_calls=len(calls),
            tool_errors=errors,
        )
