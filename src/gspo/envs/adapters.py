"""Environments written for other libraries, trained here.

:class:`FactoryEnv` takes a TRL-style ``environment_factory``: a class (or any callable) whose
instances are one episode each, with ``reset(**row)``, public methods that are the tools, and
an optional ``get_reward()``. Every episode gets a fresh instance; ``reset`` receives the
example's prompt, answer and meta fields (those its signature accepts). Tool calls follow the
run's convention (Qwen ``<tool_call>`` JSON: the arguments become keyword arguments; the plain
``[[name:argument]]`` fallback: one positional string). The final answer is scored by
``get_reward()`` when the instance has it, else by ``reward(text, example)``.

What is not supported: a string returned by ``reset`` (TRL appends it to the prompt) is
ignored, and TRL's tool-schema rendering into the system prompt is not done (the chat template
sees no ``tools=`` list). TRL itself is not needed (or imported): the convention is plain Python.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .tool_env import ToolEnv
from .tools import MalformedCall, Tool

_RESERVED = {"reset", "get_reward"}


@dataclass
class _FactoryState:
    example: Any
    instance: Any
    tools: dict[str, Tool]


def _kwargs_for(fn: Callable, values: dict[str, Any]) -> dict[str, Any]:
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return values
    names = {p.name for p in params}
    return {k: v for k, v in values.items() if k in names}


def _call(method: Callable, args: list, kwargs: dict) -> str:
    """Call a tool method; arguments that do not fit its signature are a malformed call."""
    try:
        inspect.signature(method).bind(*args, **kwargs)
    except TypeError as exc:
        raise MalformedCall(f"bad arguments for {method.__name__}: {exc}") from None
    return str(method(*args, **kwargs))


class FactoryEnv(ToolEnv):
    """A TRL-style ``environment_factory`` class as a gspo environment."""

    def __init__(
        self,
        factory: Callable[[], Any],
        *,
        reward: Callable[[str, Any], float] | None = None,
        plain: bool,
        tool_timeout_s: float = 10.0,
        name: str = "factory",
    ) -> None:
        super().__init__(name, [], reward or (lambda text, example: 0.0), plain=plain,
                         tool_timeout_s=tool_timeout_s)  # fmt: skip
        self.factory = factory

    def _tools(self, instance: Any) -> dict[str, Tool]:
        tools: dict[str, Tool] = {}
        for name, method in inspect.getmembers(instance, callable):
            if name.startswith("_") or name in _RESERVED:
                continue
            if self.plain:
                tools[name] = Tool(name, lambda arg, m=method: _call(m, [arg], {}), "input")
            else:
                tools[name] = Tool(name, lambda js, m=method: _call(m, [], json.loads(js)), "*")
        return tools

    def reset(self, example: Any) -> _FactoryState:
        instance = self.factory()
        if hasattr(instance, "reset"):
            values = {"prompt": example.prompt, "answer": example.answer, **example.meta}
            instance.reset(**_kwargs_for(instance.reset, values))
        return _FactoryState(example, instance, self._tools(instance))

    def tools_of(self, state: _FactoryState) -> dict[str, Tool]:
        return state.tools

    def final_reward(self, state: _FactoryState, text: str) -> float:
        if hasattr(state.instance, "get_reward"):
            return float(state.instance.get_reward())
        return self.reward(text, state.example)
