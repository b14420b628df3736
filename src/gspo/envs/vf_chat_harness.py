"""gspo's offline chat harness for verifiers 0.4 tasksets that ship none: the task's prompt (its
system prompt first, when it has one), one completion through verifiers' interception endpoint,
done. It runs in this process: no program, no ``uv``, no container, no network, where
verifiers' own default (``bash``) runs a chat program whose dependencies ``uv`` downloads.

verifiers imports a harness by a top-level module name, so :func:`gspo.envs.verifiers_v1.load_env`
makes this module importable as :data:`gspo.envs.verifiers_v1.CHAT_HARNESS` (in this process)
and names it in the agent's config when the taskset module exports no ``Harness``.

Its ``AsyncOpenAI`` client is closed when the call returns or fails: one left open is closed
by the garbage collector after its event loop, logging "Event loop is closed" for each.

Imports verifiers at import time (its base classes): only verifiers imports this module.
"""

from __future__ import annotations

from typing import Any

import verifiers.v1 as vf


class ChatHarness(vf.Harness[vf.HarnessConfig]):
    """One chat completion of the task's prompt, in-process (verifiers allows a harness to run
    its loop in-process as long as every model call goes through ``endpoint`` + ``secret``)."""

    APPENDS_SYSTEM_PROMPT = True
    EXECUTES_CODE = False
    NEEDS_CONTAINER = False

    async def launch(self, ctx, trace, runtime, endpoint, secret, mcp_urls, data, **kwargs):
        from openai import AsyncOpenAI

        system, prompt = self.resolve_prompt(data)
        messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
        if isinstance(prompt, str):
            messages.append({"role": "user", "content": prompt})
        else:
            messages += [m.model_dump(exclude_none=True) for m in prompt or []]
        async with AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0) as client:
            await client.chat.completions.create(model=ctx.model, messages=messages)
        return vf.ProgramResult(exit_code=0, stdout="", stderr="")


__all__ = ["ChatHarness"]
