"""Multi-turn environments and their tools: the guessing game, a TRL-style environment
factory, the Python tool running in the sandbox, code with execution feedback, and the
verifiers adapter naming its install command.
"""

from __future__ import annotations

import pytest
from envs_support import TOK, ScriptedEngine

from gspo.envs.driver import Limits, run_episodes
from gspo.envs.tasks import make_task
from gspo.envs.tasks.base import Example
from gspo.envs.tool_env import ToolEnv
from gspo.envs.trajectory import PlainEncoder
from gspo.rollout.base import SamplingParams


def test_guessing_game():
    from gspo.envs.guess import GuessEnv, binary_search

    task = make_task("guess", n_train=20, n_test=10, difficulty=4)
    assert not {e.answer for e in task.train} & {e.answer for e in task.test}
    ex = task.test[0]
    turns = [f"{g} " for g, _ in binary_search(int(ex.answer), 15)]
    turns[-1] = turns[-1].strip()  # the winning guess ends the turn with EOS
    _, (t,) = run_episodes(
        ScriptedEngine(turns), GuessEnv(plain=True), PlainEncoder(TOK), [ex], 1,
        SamplingParams(stop_strings=(" ",)), Limits(max_turns=6),
    )  # fmt: skip
    assert t.reward == pytest.approx(1.0 - 0.1 * (len(turns) - 1)) and t.num_turns == len(turns)
    assert t.turn_rewards == [0.0] * len(turns)
    assert TOK.decode(t.ids, skip_special_tokens=True) == ex.demo
    # Never guessing right: the turn limit ends it, each wrong guess costs 0.1.
    _, (t,) = run_episodes(
        ScriptedEngine(["0 "]), GuessEnv(plain=True), PlainEncoder(TOK), [ex], 1,
        SamplingParams(), Limits(max_turns=3),
    )  # fmt: skip
    assert t.finish == "turns" and t.reward == 0.0 and t.turn_rewards == [0.0] * 3
    # Invalid guesses (the cut one too) cost 0.1 each as turn rewards; quitting scores 0.
    _, (t,) = run_episodes(
        ScriptedEngine(["x ", "a long turn"]), GuessEnv(plain=True), PlainEncoder(TOK), [ex], 1,
        SamplingParams(), Limits(max_turns=3, max_tokens_per_turn=4),
    )  # fmt: skip
    assert t.turn_rewards == [-0.1, -0.1] and t.reward == 0.0 and t.finish == "length"


class CounterEnv:
    """A TRL-style environment_factory class: reset(**row), tools as methods, get_reward()."""

    def reset(self, answer: str) -> None:
        self.target = int(answer)
        self.total = 0

    def add(self, n: str) -> str:
        """Add n to the counter."""
        self.total += int(n)
        return str(self.total)

    def get_reward(self) -> float:
        return float(self.total == self.target)


def test_trl_style_environment_factory():
    from gspo.envs.adapters import FactoryEnv

    env = FactoryEnv(CounterEnv, plain=True)
    ex = Example(prompt="make 7:", answer="7")
    _, (t,) = run_episodes(
        ScriptedEngine(["[[add:3]]", "[[add:4]]", "done"]), env, PlainEncoder(TOK), [ex], 1,
        SamplingParams(), Limits(),
    )  # fmt: skip
    assert t.reward == 1.0 and t.tool_calls == 2 and t.num_turns == 3
    assert TOK.decode(t.ids, skip_special_tokens=True) == "[[add:3]] => 3 [[add:4]] => 7 done"
    # Qwen-style: JSON arguments become keyword arguments; wrong ones are a malformed call.
    env = FactoryEnv(CounterEnv, plain=False)
    state = env.reset(ex)
    ok = env.step(state, '<tool_call>{"name": "add", "arguments": {"n": "5"}}</tool_call>', True)
    assert ok.messages == [{"role": "tool", "content": "5"}]
    bad = env.step(state, '<tool_call>{"name": "add", "arguments": {"x": 1}}</tool_call>', True)
    assert bad.tool_errors == 1 and not bad.done and "bad arguments" in bad.messages[0]["content"]
    assert env.step(state, "finished", True).reward == 0.0  # total 5, target 7


def test_python_tool_runs_in_the_sandbox():
    from gspo.envs.tools import python_tool
    from gspo.sandbox import SandboxError

    tool = python_tool(timeout_s=5.0)
    try:
        out = tool.fn("print(6 * 7)")
    except SandboxError as exc:  # no sandbox on this machine (e.g. no python for the boot)
        pytest.skip(f"sandbox unavailable: {exc}")
    assert out == "42\n"
    assert "error: " in tool.fn("import socket; socket.socket().connect(('1.1.1.1', 80))")
    env = ToolEnv("py", [tool], lambda t, e: 0.0, plain=False)
    step = env.step(None, '<tool_call>{"name": "python", "arguments": {"code": "print(1+1)"}}'
                    "</tool_call>", True)  # fmt: skip
    assert step.messages == [{"role": "tool", "content": "2\n"}]


def test_code_with_execution_feedback():
    from gspo.envs.code_feedback import CodeFeedbackEnv
    from gspo.sandbox import SandboxError

    task = make_task("code_feedback", n_train=1, n_test=1, difficulty=1)
    ex = task.test[0]
    env = CodeFeedbackEnv(retries=1)
    state = env.reset(ex)
    try:
        first = env.step(state, "```python\ndef f(x):\n    return 0\n```", True)
    except SandboxError as exc:
        pytest.skip(f"sandbox unavailable: {exc}")
    assert not first.done and "tests failed" in first.messages[0]["content"]
    assert "assert f(" in first.messages[0]["content"]  # the failing test goes back
    second = env.step(state, ex.demo, True)
    assert second.done and second.reward == 1.0
    # Out of retries: the episode ends with the share of tests passed.
    state = env.reset(ex)
    env.step(state, "no code here", True)
    last = env.step(state, "```python\ndef f(x):\n    return 0\n```", True)
    assert last.done and 0.0 <= last.reward < 1.0


def test_verifiers_adapter_names_its_install_command():
    import importlib.util

    from gspo.envs.verifiers_adapter import VerifiersEnv

    if importlib.util.find_spec("verifiers") is not None:
        pytest.skip("verifiers is installed (tests/test_envs_verifiers.py covers the adapter)")
    with pytest.raises(ImportError, match=r"verifiers>=0.3.1,<0.4"):
        VerifiersEnv(object())
