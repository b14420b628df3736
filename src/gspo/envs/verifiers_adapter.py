"""Environments written for the ``verifiers`` library (0.1-0.3: ``load_environment()`` returning a
``SingleTurnEnv`` / ``MultiTurnEnv`` with a ``Rubric``), trained here.

Needs ``verifiers`` 0.3.x (``pip install "gspo[verifiers03]"``; 0.4.0 removed these classes for
its ``verifiers.v1`` stack, whose environments train through :mod:`gspo.envs.verifiers_v1`). It
is imported lazily: nothing here needs it until an adapter is built. Works offline: no model
client is ever called.

How one episode maps onto the verifiers hooks (the same order as its own ``rollout`` loop):

* ``reset``: ``env.init_state(row, client, "gspo")`` (``client`` is a stub that refuses to be
  called: gspo's engine writes the turns) and ``env.setup_state``;
* ``step(text)``: the turn is appended to ``state["trajectory"]``; if a stop condition fires
  (``env.is_completed``: ``max_turns``, the env's own ``@vf.stop`` methods) the episode ends;
  else ``env.get_prompt_messages`` runs ``env_response`` and its new messages are the reply
  (an env that sets ``final_env_response`` ends the episode there);
* at the end ``env.render_completion`` and ``env.rubric.score_rollout`` give the reward
  (``state["reward"]``, the weighted sum of the rubric's functions).

What is not supported: the dataset's system message and few-shot turns (the prompt is the last
user message; use ``--system-prompt``), tools declared through ``tool_defs`` (their schemas are
not rendered; the env's ``env_response`` still sees the text of each turn), group-level reward
functions and rubric advantages (gspo computes its own), and the ``verifiers.v1`` stack (see
:mod:`gspo.envs.verifiers_v1`).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

from gspo.envs.tasks.base import Example, Task
from gspo.envs.tasks.synthetic import TASKS

from .base import ENVIRONMENTS, Step

INSTALL = 'pip install "gspo[verifiers03]"  (verifiers>=0.3.1,<0.4; 0.4: gspo.envs.verifiers_v1)'


def _require_verifiers():
    try:
        import verifiers  # noqa: F401
        from verifiers.legacy.clients.client import Client
    except ImportError as exc:
        raise ImportError(f"the verifiers adapter needs verifiers 0.3.x: {INSTALL}") from exc
    return Client


class _Loop:
    """One event loop in a daemon thread: the verifiers hooks are coroutines, gspo calls
    ``reset``/``step`` synchronously (from the driver's worker threads)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True, name="gspo-vf").start()

    def run(self, coro) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()


def _stub_client():
    client_cls = _require_verifiers()

    class NoClient(client_cls):  # type: ignore[misc, valid-type]
        """gspo generates the turns; a verifiers env that calls its client is a bug here."""

        def setup_client(self, config):
            return None

        async def _refuse(self, *a, **k):
            raise RuntimeError("gspo drives this verifiers env: its model client is not used")

        to_native_tool = to_native_prompt = get_native_response = _refuse
        raise_from_native_response = from_native_response = _refuse

        async def close(self) -> None:
            return None

    return NoClient(None)


def _as_dict(message: Any) -> dict[str, str]:
    if isinstance(message, dict):
        return {"role": str(message["role"]), "content": str(message.get("content") or "")}
    return {"role": str(message.role), "content": str(getattr(message, "content", "") or "")}


def _last_user(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    users = [_as_dict(m) for m in prompt if _as_dict(m)["role"] == "user"]
    if not users:
        raise ValueError("a verifiers dataset row has no user message in its prompt")
    return users[-1]["content"]


def examples_of(dataset: Any) -> list[Example]:
    """gspo examples of a (formatted) verifiers dataset: the last user message is the prompt,
    the whole row travels in ``meta["vf_row"]``."""
    out = []
    for row in dataset:
        row = dict(row)
        out.append(Example(_last_user(row["prompt"]), str(row.get("answer", "")),
                           meta={"vf_row": row}))  # fmt: skip
    return out


class VerifiersEnv:
    """A verifiers ``SingleTurnEnv`` / ``MultiTurnEnv`` as a gspo environment."""

    multi_turn = True
    stop_strings: tuple[str, ...] = ()

    def __init__(self, vf_env: Any, name: str = "verifiers") -> None:
        self.vf_env = vf_env
        self.name = name
        self._client = _stub_client()  # first: without verifiers, fail before the loop starts
        self._loop = _Loop()

    def reset(self, example: Example) -> Any:
        row = example.meta.get("vf_row")
        if row is None:
            row = {"prompt": [{"role": "user", "content": example.prompt}],
                   "answer": example.answer}  # fmt: skip
        env = self.vf_env
        state = self._loop.run(env.init_state(dict(row), self._client, "gspo"))
        return self._loop.run(env.setup_state(state)) or state

    def step(self, state: Any, text: str, finished: bool) -> Step:
        return self._loop.run(self._step(state, text, finished))

    async def _step(self, state: Any, text: str, finished: bool) -> Step:
        from verifiers.legacy.utils.message_utils import normalize_messages

        env = self.vf_env
        # The prompt of this turn: the dataset's, then the one the last env_response built.
        prompt = state.get("_gspo_next_prompt") or state["prompt"]
        turn = normalize_messages([{"role": "assistant", "content": text}], field_name="turn")
        state["trajectory"].append({"prompt": prompt, "completion": turn})
        if not finished or await env.is_completed(state):
            return await self._score(state)
        nxt = await env.get_prompt_messages(state)  # runs env_response
        reply = [_as_dict(m) for m in nxt[len(prompt) + len(turn) :]]
        state["_gspo_next_prompt"] = nxt
        if await env.is_completed(state):  # final_env_response, or an env stop condition
            return await self._score(state)
        return Step(done=False, messages=reply)

    async def _score(self, state: Any) -> Step:
        env = self.vf_env
        await env.render_completion(state)
        await env.rubric.score_rollout(state)
        return Step(done=True, reward=float(state["reward"] or 0.0))


def verifiers_task(vf_env: Any, name: str, n_test: int | None = None) -> Task:
    """The gspo task of a verifiers env: its dataset for training, its eval dataset (or the
    last ``n_test`` rows of the dataset) held out."""
    train = examples_of(vf_env.get_dataset())
    if getattr(vf_env, "eval_dataset", None) is not None:
        test = examples_of(vf_env.get_eval_dataset())
    else:
        k = n_test if n_test is not None else max(1, len(train) // 10)
        train, test = train[:-k] or train, train[-k:]
    return Task(name=name, train=train, test=test, reward=lambda text, example: 0.0,
                description=f"verifiers environment {name}")  # fmt: skip


def register_verifiers(name: str, load_environment: Callable[[], Any]) -> None:
    """Make ``task=name`` train the env ``load_environment()`` returns (its rows are the data;
    ``n_train``/``n_test`` cap them)."""
    vf_env = load_environment()

    def build(*, n_train: int, n_test: int, seed: int = 0, difficulty: int | None = None) -> Task:
        task = verifiers_task(vf_env, name, n_test or None)
        task.train, task.test = task.train[:n_train], task.test[:n_test]
        return task

    TASKS[name] = build
    ENVIRONMENTS[name] = lambda task, opts, chat: VerifiersEnv(vf_env, name)
