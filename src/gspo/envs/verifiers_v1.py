"""Environments written for verifiers 0.4 (``verifiers.v1``), trained through gspo's
OpenAI-compatible rollout endpoint.

A v1 environment drives the model itself: ``Env.run_episode(task, ctx)`` runs the task's
harness (a chat loop, an agent program), and every model call the harness makes goes through
verifiers' interception server to the client ``ctx`` names. Here that client is the episode's
:class:`~gspo.envs.agent.AgentClient`: the run's engine behind the endpoint, which records the
token ids and log-probs it sampled (the agent driver trains on exactly those tokens).

One episode (:meth:`VerifiersV1Env.run_episode`):

* the env's serving resources (interception server, shared tool servers) are held while any
  of its episodes runs in this event loop (:class:`_Serving`: ``Env.serving()`` keeps them on
  the env object, so concurrent episodes must share one);
* ``vf_env.run_episode(task, ModelContext(model, EvalClientConfig(base_url), sampling))``;
* the episode's reward is its traces' rubric reward (the weighted sum of the task's
  ``@vf.reward`` functions; the mean over traces when an env runs several agents), and each
  ``@vf.reward`` score and ``@vf.metric`` value is kept in ``AgentOutcome.info`` as
  ``vf/<name>`` (averaged over traces); its success is that reward >= :data:`SUCCESS_AT` (a
  v1 rubric gives scores, not a verdict);
* a taskset module that ships no harness runs under gspo's offline in-process chat harness
  (:mod:`gspo.envs.vf_chat_harness`), not verifiers' default ``bash``, which needs the network;
* an episode verifiers reports as failed (a harness, provider or scoring error, the endpoint's
  ``episode_limit`` refusal included) raises :class:`VerifiersEpisodeError`, so the driver
  fails it (reward 0, ``episode/failed``); the driver cancels an episode cut by a limit, which
  unwinds verifiers' own clean-up and releases the shared serving resources.

What works: tasksets whose harness runs on this host without a container or network, i.e.
an in-process harness (``examples/verifiers_v1/vf_arith.py``) or a local runtime
(``runtime.type subprocess``, the default here) whose program needs nothing downloaded.
What does not: harnesses installed with ``uv`` at run time (verifiers' own ``null``/``bash``
chat programs fetch ``openai`` etc. from the network), container runtimes (docker, podman,
prime, modal, e2b sandboxes), tunnels, and judges or tools that call remote models or APIs.
See docs/verifiers.md.
"""

from __future__ import annotations

import asyncio
import importlib
import sys
import weakref
from collections.abc import Mapping
from typing import Any

from gspo.core.metrics import CORRECT
from gspo.envs.agent import AgentClient, AgentOutcome
from gspo.envs.tasks.base import Example, Task
from gspo.envs.tasks.synthetic import TASKS

from .base import ENVIRONMENTS

INSTALL = 'pip install "gspo[verifiers]"  (verifiers>=0.4,<0.5)'
CHAT_HARNESS = "gspo_chat_harness"
"""The harness id of gspo's offline chat harness (see :func:`load_env`)."""
SUCCESS_AT = CORRECT
"""An episode whose rubric reward is at least this (1, within rounding) is a success, unless
the environment gives its own verdict: a v1 rubric gives scores, not a verdict."""
API_KEY_VAR = "GSPO_AGENT_API_KEY"
"""The variable verifiers reads the endpoint's API key from (unset: "EMPTY"; gspo's endpoint
ignores keys)."""


def _vf():
    try:
        import verifiers
        import verifiers.v1 as vf
    except ImportError as exc:
        raise ImportError(f"verifiers 0.4 environments need verifiers.v1: {INSTALL}") from exc
    major_minor = tuple(int(x) for x in verifiers.__version__.split(".")[:2] if x.isdigit())
    if major_minor < (0, 4):  # 0.3.x ships an early, different verifiers.v1
        raise ImportError(f"verifiers {verifiers.__version__} is installed; gspo.envs.verifiers_v1 "
                          f"needs 0.4: {INSTALL}")  # fmt: skip
    return vf


class VerifiersEpisodeError(RuntimeError):
    """A verifiers episode ended with errors (its trace's last error, one line)."""


def env_config(taskset_id: str, **config: Any) -> dict[str, Any]:
    """A v1 env config (the ``[env]`` block of ``vf-eval``) for the taskset module ``taskset_id``:
    ``config`` may hold ``taskset`` fields (``{"taskset": {"num_tasks": 50}}``), ``agent``
    fields, ``id`` (an env id)... The agent's runtime defaults to ``subprocess`` (this host):
    verifiers' default (prime sandboxes) needs an account and the network."""
    out = {k: dict(v) if isinstance(v, Mapping) else v for k, v in config.items()}
    out["taskset"] = {**out.get("taskset", {}), "id": taskset_id}
    agent = out.setdefault("agent", {})
    agent.setdefault("runtime", {"type": "subprocess"})
    return out


def load_env(taskset_id: str, **config: Any) -> Any:
    """The v1 ``Env`` for the taskset module ``taskset_id`` (see :func:`env_config`). A
    taskset module that exports no ``Harness`` runs under gspo's offline chat harness
    (:data:`CHAT_HARNESS`) unless ``agent.harness`` names one: verifiers' own default (``bash``)
    downloads its program's dependencies at run time."""
    vf = _vf()
    data = env_config(taskset_id, **config)
    agent = data["agent"]
    if "harness" not in agent and vf.default_harness_id(taskset_id) == "bash":
        agent["harness"] = {"id": chat_harness()}
    return vf.load_environment(vf.resolve_env_config(data))


def chat_harness() -> str:
    """The harness id of gspo's offline chat harness (:mod:`gspo.envs.vf_chat_harness`),
    made importable under it: verifiers imports harnesses by a top-level module name."""
    sys.modules.setdefault(CHAT_HARNESS, importlib.import_module("gspo.envs.vf_chat_harness"))
    return CHAT_HARNESS


def examples_of(vf_env: Any, limit: int | None = None) -> list[Example]:
    """gspo examples of the env's taskset (its first ``limit`` tasks): the task's prompt text
    is the prompt, its ``answer`` field (when it has one) the answer, the task itself travels
    in ``meta["vf_task"]``."""
    taskset = vf_env.taskset if limit is None else vf_env.taskset.take(limit)
    if not taskset.bounded:
        raise ValueError(f"{type(vf_env.taskset).__name__} is infinite: give a limit")
    return [
        Example(
            task.data.prompt_text,
            str(getattr(task.data, "answer", "") or ""),
            meta={"vf_task": task},
        )
        for task in taskset
    ]


class _Serving:
    """``vf_env.serving()`` held while at least one episode of one event loop runs.

    ``Env.serving()`` keeps the interception server on the env object, so concurrent episodes
    must share one: a holder task enters it, and the last episode to leave lets it exit and
    waits for it, so no task outlives the episodes (a loop closed after them finds none
    pending). An episode arriving while it stops waits for the stop, then starts it again."""

    def __init__(self, vf_env: Any) -> None:
        self.vf_env = vf_env
        self.users = 0
        self.holder: asyncio.Task | None = None
        self.lock = asyncio.Lock()
        self.ready = asyncio.Event()
        self.release = asyncio.Event()

    async def _hold(self, ready: asyncio.Event, release: asyncio.Event) -> None:
        async with self.vf_env.serving():
            ready.set()
            await release.wait()

    async def acquire(self) -> None:
        self.users += 1
        async with self.lock:
            if self.holder is None or self.release.is_set() or self.holder.done():
                if self.holder is not None:  # stopping (or failed): let it finish first
                    await asyncio.gather(self.holder, return_exceptions=True)
                self.ready, self.release = asyncio.Event(), asyncio.Event()
                self.holder = asyncio.get_running_loop().create_task(
                    self._hold(self.ready, self.release)
                )
            holder, ready = self.holder, self.ready
        waiter = asyncio.ensure_future(ready.wait())
        await asyncio.wait([waiter, holder], return_when=asyncio.FIRST_COMPLETED)
        if not waiter.done():  # serving() failed before it was ready: its error is the holder's
            waiter.cancel()
            await asyncio.gather(waiter, return_exceptions=True)
            holder.result()

    def leave(self) -> asyncio.Task | None:
        """One episode done; the holder to wait for when it was the last."""
        self.users -= 1
        if self.users or self.holder is None:
            return None
        self.release.set()
        return self.holder


class VerifiersV1Env:
    """A verifiers 0.4 environment as a gspo agent environment (see the module doc)."""

    multi_turn = True
    stop_strings: tuple[str, ...] = ()
    cut_reward = 0.0
    """What an episode cut by a limit (``max_turns`` completions, ``max_total_tokens``) earns."""

    def __init__(self, vf_env: Any, name: str = "verifiers") -> None:
        self.vf_env = vf_env
        self.name = name
        self._serving: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Serving] = (
            weakref.WeakKeyDictionary()
        )

    def _context(self, client: AgentClient) -> Any:
        vf = _vf()
        sampling = {k: v for k, v in client.sampling.items() if v is not None}
        return vf.ModelContext(
            model=client.model,
            client=vf.EvalClientConfig(base_url=client.base_url, api_key_var=API_KEY_VAR),
            sampling=vf.Sampling(**sampling),
        )

    async def run_episode(self, example: Example, client: AgentClient) -> AgentOutcome:
        task = example.meta.get("vf_task")
        if task is None:
            raise ValueError(f"example {example.prompt[:40]!r} carries no verifiers task")
        ctx = self._context(client)
        loop = asyncio.get_running_loop()
        serving = self._serving.get(loop)
        if serving is None:
            serving = self._serving[loop] = _Serving(self.vf_env)
        try:
            await serving.acquire()
            episode = await self.vf_env.run_episode(task, ctx)
        finally:
            holder = serving.leave()
            if holder is not None:
                # shield: an episode cancelled again while the server stops still lets it stop
                await asyncio.shield(asyncio.gather(holder, return_exceptions=True))
        return outcome_of(episode)


def outcome_of(episode: Any) -> AgentOutcome:
    """The gspo outcome of a finished verifiers ``Episode`` (raises when it failed)."""
    if not episode.ok or not episode.traces:
        raise VerifiersEpisodeError(_error_line(episode))
    traces = episode.traces
    reward = sum(t.reward for t in traces) / len(traces)
    sums: dict[str, list[float]] = {}
    for t in traces:
        for key, r in t.rewards.items():
            if r is not None:
                sums.setdefault(f"vf/{key}", []).append(float(r.score))
        for key, value in t.metrics.items():
            if value is not None:
                sums.setdefault(f"vf/{key}", []).append(float(value))
    info = {k: sum(v) / len(v) for k, v in sums.items()}
    return AgentOutcome(reward=float(reward), success=reward >= SUCCESS_AT, info=info)


def _error_line(episode: Any) -> str:
    errors = list(episode.errors) + [e for t in episode.traces for e in t.errors]
    if not errors:
        return "the verifiers episode did not complete (no trace)"
    last = errors[-1]
    message = " ".join(str(last.message).split())[:300]
    return f"verifiers episode failed: {last.type}: {message}"


def verifiers_v1_task(vf_env: Any, name: str, n_train: int, n_test: int) -> Task:
    """The gspo task of a v1 env: the first ``n_test`` tasks of its taskset are held out, the
    next ``n_train`` train (the taskset's own order; shuffle it in its config)."""
    examples = examples_of(vf_env, n_test + n_train)
    test, train = examples[:n_test], examples[n_test:]
    if n_train > 0 and not train:  # gspo eval asks for no training tasks
        raise ValueError(f"verifiers taskset of {name!r} has {len(examples)} tasks: none left "
                         f"to train on after {n_test} held out")  # fmt: skip
    return Task(name=name, train=train, test=test, reward=_unused_reward,
                description=f"verifiers 0.4 environment {name}")  # fmt: skip


def _unused_reward(text: str, example: Example) -> float:
    raise RuntimeError("a verifiers environment scores its own episodes (its rubric)")


def register_verifiers_v1(name: str, taskset_id: str, **config: Any) -> None:
    """Make ``--task name`` train the v1 env of the taskset module ``taskset_id`` (``config``:
    as :func:`env_config`). verifiers and the taskset module are imported now (a plugin's
    import: a missing one is reported before the run starts); the env is loaded when the task
    is first built."""
    _vf().import_taskset(taskset_id)
    envs: dict[str, Any] = {}

    def env() -> Any:
        if "env" not in envs:
            envs["env"] = load_env(taskset_id, **config)
        return envs["env"]

    def build(*, n_train: int, n_test: int, seed: int = 0, difficulty: int | None = None) -> Task:
        return verifiers_v1_task(env(), name, n_train, n_test)

    TASKS[name] = build
    ENVIRONMENTS[name] = lambda task, opts, chat: VerifiersV1Env(env(), name)
