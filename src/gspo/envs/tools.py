"""Tools and the tool-calling convention.

Chat models call tools the Qwen way, one JSON object per call::

    <tool_call>{"name": "calc", "arguments": {"expression": "123*4567"}}</tool_call>

and get each result back as a ``{"role": "tool", "content": ...}`` message. The tiny char
models use a plain-text fallback that fits their charset and short contexts::

    [[calc:123*4567]]        ->  reply " => 561741 "

A malformed call (bad JSON, unknown tool, missing argument) is answered with an error message
as the environment's reply; the episode goes on. A tool that raises or runs past its timeout
fails the episode (:class:`ToolFailure`).
"""

from __future__ import annotations

import ast
import dataclasses
import json
import operator
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass

from gspo.sandbox import DEFAULT_CONFIG, run_python
from gspo.sandbox.cancel import CANCEL, CancelScope

QWEN_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
PLAIN_CALL = re.compile(r"\[\[(\w+):(.*?)\]\]", re.DOTALL)
QWEN_STOP = "</tool_call>"
PLAIN_STOP = "]]"


class ToolFailure(RuntimeError):
    """A tool raised or hung: the episode ends as failed."""


class MalformedCall(ValueError):
    """A tool call the environment cannot run; its message becomes the reply."""


@dataclass(frozen=True)
class Tool:
    """A named function of one string argument (``argument`` names it in JSON calls; "*"
    passes the call's whole JSON object of arguments as a string)."""

    name: str
    fn: Callable[[str], str]
    argument: str
    description: str = ""


@dataclass(frozen=True)
class Call:
    name: str
    argument: str


def parse_calls(text: str, plain: bool) -> list[Call | MalformedCall]:
    """The tool calls in a policy turn, in order (a malformed one as a MalformedCall)."""
    if plain:
        return [Call(m.group(1), m.group(2).strip()) for m in PLAIN_CALL.finditer(text)]
    out: list[Call | MalformedCall] = []
    for m in QWEN_CALL.finditer(text):
        try:
            obj = json.loads(m.group(1))
            name = obj["name"]
            args = obj.get("arguments", {})
            if isinstance(args, str):  # some models write the arguments as a JSON string
                args = json.loads(args)
            if not isinstance(name, str) or not isinstance(args, dict):
                raise TypeError("name must be a string and arguments an object")
            out.append(Call(name, json.dumps(args)))
        except (ValueError, KeyError, TypeError) as exc:
            out.append(MalformedCall(f"malformed tool call: {exc}"))
    # An opened but never closed call is malformed too (the turn was cut or badly written).
    if text.count("<tool_call>") > text.count("</tool_call>"):
        out.append(MalformedCall("malformed tool call: <tool_call> without </tool_call>"))
    return out


def argument_of(tool: Tool, call: Call, plain: bool) -> str:
    if plain:
        return call.argument
    if tool.argument == "*":  # the tool takes the whole JSON object of arguments
        return call.argument
    args = json.loads(call.argument)
    if tool.argument not in args:
        raise MalformedCall(f"tool {tool.name!r} needs the argument {tool.argument!r}")
    return str(args[tool.argument])


# How long a timed-out tool call waits for its cancelled runs' teardown (killed within
# 0.05 s; this bounds a machine too loaded to tear down promptly).
_TEARDOWN_S = 10.0


def run_tool(tool: Tool, argument: str, timeout_s: float) -> str:
    """``tool.fn(argument)`` in a daemon thread; ToolFailure if it raises or outlives
    ``timeout_s``. Then the sandbox runs the tool started are killed (a
    :class:`~gspo.sandbox.cancel.CancelScope`) and waited for, so a call that sleeps
    holds no uid slot or memory past its timeout; the thread itself is abandoned (a Python
    thread cannot be killed)."""
    box: dict[str, object] = {}
    scope = CancelScope()

    def target() -> None:
        CANCEL.set(scope)  # a thread starts with a context of its own: set in it
        try:
            box["out"] = tool.fn(argument)
        except MalformedCall as exc:
            box["bad"] = exc
        except BaseException as exc:  # any failure of the tool fails the episode
            box["err"] = exc

    thread = threading.Thread(target=target, daemon=True, name=f"gspo-tool-{tool.name}")
    thread.start()
    thread.join(timeout_s if timeout_s > 0 else None)
    if thread.is_alive():
        scope.cancel()
        scope.wait_idle(_TEARDOWN_S)
        raise ToolFailure(f"tool {tool.name!r} ran past its {timeout_s:g} s timeout")
    if "bad" in box:
        raise box["bad"]  # type: ignore[misc]
    if "err" in box:
        exc = box["err"]
        raise ToolFailure(f"tool {tool.name!r} raised {type(exc).__name__}: {exc}")
    return str(box["out"])


# --------------------------------------------------------------------------------------------
# Built-in tools
# --------------------------------------------------------------------------------------------

_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Div: operator.truediv,
}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}
_MAX_DIGITS = 60


def calculate(expression: str) -> str:
    """Evaluate integer/decimal arithmetic (+ - * / // %, parentheses, unary minus).

    Anything else (names, calls, powers, numbers over 60 digits) is a MalformedCall: the
    policy gets the message back. Exact integers; a division gives a float.
    """

    def ev(node: ast.AST) -> int | float:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = ev(node.left), ev(node.right)
            if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
                raise MalformedCall("calculator: division by zero")
            value = _OPS[type(node.op)](left, right)
            if isinstance(value, int) and len(str(abs(value))) > _MAX_DIGITS:
                raise MalformedCall("calculator: result too large")
            return value
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](ev(node.operand))
        raise MalformedCall(f"calculator: unsupported expression {expression!r}")

    if len(expression) > 200:
        raise MalformedCall("calculator: expression too long")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise MalformedCall(f"calculator: cannot parse {expression!r}") from None
    value = ev(tree)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


def python_tool(timeout_s: float = 5.0) -> Tool:
    """Run a program in the sandbox (:func:`gspo.sandbox.run_python`); the reply is its
    stdout, with stderr's last line when it failed."""

    def run(code: str) -> str:
        config = dataclasses.replace(DEFAULT_CONFIG, timeout_s=timeout_s)
        result = run_python(code, config=config)
        if result.timed_out:
            return f"error: timed out after {timeout_s:g} s"
        out = result.stdout[-500:]
        if not result.ok:
            last = (result.stderr.strip().splitlines() or ["failed"])[-1]
            out += f"error: {last[-300:]}"
        return out

    return Tool("python", run, "code", "Run Python code; returns its standard output.")


CALCULATOR = Tool("calc", calculate, "expression", "Evaluate an arithmetic expression.")
