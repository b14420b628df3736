"""A verifiers 0.4 (``verifiers.v1``) environment that runs offline: a taskset of sums with a
rubric, and a chat harness that runs in-process (no sandbox, no ``uv``, no network).

verifiers loads it by module name (``--env.taskset.id vf_arith`` in ``vf-eval``;
``gspo.envs.verifiers_v1`` here): the module exports, through ``__all__``, its ``Taskset``
subclass and the ``Harness`` its tasks run under by default.

The harness is a plain chat loop: it sends the task's prompt, and for up to ``max_turns``
turns it tells the model when its answer is wrong (``feedback``), so one episode can hold
several completions. Every model call goes through the rollout's interception endpoint, as
verifiers requires (it records the turns and applies the run's sampling).
"""

from __future__ import annotations

import random

import verifiers.v1 as vf
from pydantic import Field


class SumData(vf.TaskData):
    answer: str
    """The sum, as digits."""


def _answer(text: str) -> str:
    """The last whitespace-separated word of a reply, without trailing punctuation."""
    words = text.strip().split()
    return words[-1].strip(".,!") if words else ""


class SumTask(vf.Task[SumData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def correct(self, task: SumData, trace: vf.Trace) -> float:
        """1 when the final reply's last word is the sum."""
        return float(_answer(trace.last_reply) == task.answer)

    @vf.metric
    async def turns(self, trace: vf.Trace) -> float:
        """Model calls the episode made (the harness retries after a wrong answer)."""
        return float(trace.num_turns)


class SumTasksetConfig(vf.TasksetConfig):
    num_tasks: int = Field(200, ge=1)
    """Rows of the taskset."""
    seed: int = 0
    max_operand: int = Field(9, ge=1)


class SumTaskset(vf.Taskset[SumTask, SumTasksetConfig]):
    """Single-digit sums: ``What is 3+4?`` -> ``7``."""

    def load(self):
        rng = random.Random(self.config.seed)
        for _ in range(self.config.num_tasks):
            a, b = rng.randint(1, self.config.max_operand), rng.randint(1, self.config.max_operand)
            data = SumData(prompt=f"What is {a}+{b}? Answer with the number.", answer=str(a + b))
            yield SumTask(data, self.config.task)


class ChatHarnessConfig(vf.HarnessConfig):
    max_turns: int = Field(1, ge=1)
    """Completions per episode: after a wrong answer the harness says so and asks again."""
    feedback: str = "That is not right. Try again."


class ChatHarness(vf.Harness[ChatHarnessConfig]):
    """A chat loop run in this process (verifiers allows it: "a harness may run its loop
    in-process instead of launching a program, as long as every model call goes through
    ``endpoint`` + ``secret``")."""

    APPENDS_SYSTEM_PROMPT = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, **kwargs):
        from openai import AsyncOpenAI

        system, prompt = self.resolve_prompt(data)
        messages: list[dict] = [{"role": "system", "content": system}] if system else []
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        else:
            messages += [m.model_dump(exclude_none=True) for m in prompt or []]
        client = AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0)
        try:
            for turn in range(self.config.max_turns):
                reply = await client.chat.completions.create(model=ctx.model, messages=messages)
                text = reply.choices[0].message.content or ""
                messages.append({"role": "assistant", "content": text})
                if turn + 1 == self.config.max_turns or _answer(text) == data.answer:
                    break
                messages.append({"role": "user", "content": self.config.feedback})
        finally:
            await client.close()
        return vf.ProgramResult(exit_code=0, stdout="", stderr="")


__all__ = ["ChatHarness", "ChatHarnessConfig", "SumTask", "SumTaskset", "SumTasksetConfig"]
