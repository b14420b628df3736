"""Agent programs as environments: any program that calls an OpenAI-compatible endpoint.

:class:`ProgramAgentEnv` runs the user's agent program once per episode, as a sub-process
(its own loop, tools, sub-processes of its own), with

* ``OPENAI_BASE_URL``: the episode's endpoint (``.../episodes/<id>/v1``; the ``openai``
  client reads it), ``OPENAI_API_KEY``: any key, ``GSPO_MODEL``: the model name;
* ``GSPO_SAMPLING``: the run's sampling as JSON (``temperature``, ``top_p``, ``max_tokens``);
* the example as JSON (``{"prompt", "answer", "meta"}``) on its stdin and in ``GSPO_EXAMPLE``.

The program prints its result as the LAST line of its stdout, a JSON object:
``{"reward": 1.0, "success": true, "info": {"turns": 2}}`` (``success`` and ``info``
optional). A program that exits non-zero, prints no such line or outlives ``timeout_s`` fails
its episode (reward 0); a program whose episode is cut by a limit is killed with its process
group. See examples/agent_program.py and docs/endpoint.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import shlex
import signal
import sys
from collections.abc import Sequence
from typing import Any

from gspo.envs.tasks.base import Example

from .agent import AgentClient, AgentOutcome


class ProgramAgentEnv:
    """Episodes run by an agent program (``command``: argv list, or a shell-style string)."""

    multi_turn = True
    stop_strings: tuple[str, ...] = ()

    def __init__(
        self,
        command: Sequence[str] | str,
        name: str = "program_agent",
        *,
        timeout_s: float | None = 600.0,
        cut_reward: float = 0.0,
        env: dict[str, str] | None = None,
        cwd: str | None = None,
    ) -> None:
        argv = shlex.split(command) if isinstance(command, str) else list(command)
        if not argv:
            raise ValueError("ProgramAgentEnv needs a command to run")
        if argv[0] in ("python", "python3"):  # the run's own interpreter
            argv[0] = sys.executable
        self.argv = argv
        self.name = name
        self.timeout_s = timeout_s
        self.cut_reward = cut_reward
        self.env = dict(env or {})
        self.cwd = cwd

    async def run_episode(self, example: Example, client: AgentClient) -> AgentOutcome:
        data = json.dumps(
            {"prompt": example.prompt, "answer": example.answer, "meta": example.meta},
            default=str,
        )
        env = {
            **os.environ,
            **self.env,
            "OPENAI_BASE_URL": client.base_url,
            "OPENAI_API_KEY": client.api_key,
            "GSPO_MODEL": client.model,
            "GSPO_SAMPLING": json.dumps(client.sampling),
            "GSPO_EXAMPLE": data,
        }
        proc = await asyncio.create_subprocess_exec(
            *self.argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            cwd=self.cwd,
            start_new_session=True,  # its own process group: a cut kills its children too
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(data.encode()), self.timeout_s)
        except BaseException:  # cut (cancelled), timed out: the program and its children go
            _kill_group(proc.pid)
            await proc.wait()
            raise
        _kill_group(proc.pid)  # what the program left running
        if proc.returncode != 0:
            tail = err.decode(errors="replace").strip().splitlines()[-1:] or ["no stderr"]
            raise RuntimeError(f"{self.argv[-1]} exited with {proc.returncode}: {tail[0]}")
        return parse_result(out.decode(errors="replace"))


def parse_result(stdout: str) -> AgentOutcome:
    """The outcome an agent program printed as its last stdout line (a JSON object)."""
    lines = [line for line in stdout.strip().splitlines() if line.strip()]
    if not lines:
        raise ValueError('the agent program printed nothing; its last line must be {"reward": ...}')
    try:
        result: Any = json.loads(lines[-1])
    except ValueError:
        raise ValueError(
            f"the agent program's last line is not JSON: {lines[-1][:200]!r}"
        ) from None
    reward = result.get("reward") if isinstance(result, dict) else None
    if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
        raise ValueError(
            f'the agent program\'s last line has no finite "reward": {lines[-1][:200]!r}'
        )
    success = result.get("success")
    if success is not None and not isinstance(success, bool):
        raise ValueError(f'"success" must be true, false or absent, got {success!r}')
    info = result.get("info") or {}
    values = {str(k): float(v) for k, v in info.items() if isinstance(v, int | float)}
    return AgentOutcome(reward=float(reward), success=success, info=values)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # already gone
        os.killpg(pid, signal.SIGKILL)
