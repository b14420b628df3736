"""The rollout-engine protocol: what the trainer needs from anything that samples completions.

An engine turns prompts into completions together with its *own* per-token log-probs, which the
trainer uses directly as the old-policy log-probs (GSPO's "no recompute pass" claim). Engines that
hold a separate copy of the weights receive new ones through ``update_weights`` after each step.

Log-prob convention (every engine must follow it, and the trainer computes the same thing):
``logprobs[i, t] = log softmax(logits / temperature)[token]`` — the temperature-scaled
distribution, *before* top-p truncation. Top-p only decides which tokens can be drawn; it does
not change the recorded log-prob. At temperature 1 this is the model's own distribution.

The scored batch (:class:`RolloutBatch`) is the one type from generation through reward,
advantages and update: a step's rows (N = prompts x group size, group after group) start as the
engine's or the episode driver's :class:`Rollout`; the environment scores them (rewards,
per-turn advantages for ``credit='turn'``), dynamic sampling and the async buffer keep some of
their rows (:meth:`RolloutBatch.select`), and the trainer adds the old log-probs, the mismatch
weights, the group advantages and the step before the update reads them. Single- and multi-turn
episodes, synchronous and async, all hand this one object along.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

import torch

NO_VERSION = -1
"""``Rollout.versions`` value on positions that hold no generated token (padding)."""


@dataclass(frozen=True)
class SamplingParams:
    """How to sample completions."""

    max_new_tokens: int = 16
    """Hard cap on generated tokens per completion (finish reason "length" when hit)."""
    temperature: float = 1.0
    """Softmax temperature; 0 means greedy decoding (log-probs are then of the T=1 distribution)."""
    top_p: float = 1.0
    """Nucleus sampling mass in (0, 1]; 1 disables it."""
    stop_token_ids: tuple[int, ...] = ()
    """Token ids that end a completion (the EOS id is added by the engine); they are kept in it."""
    stop_strings: tuple[str, ...] = ()
    """Strings that end a completion once they appear at its end (matched on token ids)."""


@dataclass(frozen=True)
class GenerationRequest:
    """What to sample: ``n`` completions of each prompt (token ids, no padding) under
    ``params``; the rollout's row ``i * n + j`` is sample j of prompt i. One object for every
    engine, partial generation and async place, so that none spells the arguments out."""

    prompts: list[list[int]]
    n: int
    params: SamplingParams
    generator: torch.Generator | None = None
    """Seeds the sampling (a seeded one makes the rollout reproducible); None: the global RNG."""
    pixels: Any = None
    """Image prompts' :class:`gspo.models.vision.PixelInputs`, one entry per prompt (the
    engine's rollout carries them on ``extras["pixels"]``); an engine or place without image
    inputs refuses a request that has them."""


@dataclass
class Rollout:
    """A batch of completions, laid out group after group: sample j of prompt i is row i*n + j.

    N = number of prompts x n samples, P = longest prompt, L = longest completion.
    """

    prompt_ids: torch.Tensor  # [N, P] left-padded with pad_id
    prompt_mask: torch.Tensor  # [N, P] 1 for real prompt tokens
    completion_ids: torch.Tensor  # [N, L] right-padded with pad_id
    completion_mask: torch.Tensor  # [N, L] 1 for generated tokens (a final stop token included)
    logprobs: torch.Tensor  # [N, L] engine log-probs of completion tokens, 0 where masked
    finish_reasons: list[str]  # N entries: "stop" (EOS / stop token / stop string) or "length"
    prompt_index: torch.Tensor  # [N] index of the prompt each row was sampled from
    extras: dict = field(default_factory=dict)  # engine-specific data (e.g. MoE routing)
    # [N, L] 1 on tokens the policy sampled; None: the same as completion_mask. Multi-turn
    # episodes (gspo.envs) set it: environment tokens are attended to (completion_mask 1) but
    # get no gradient and count in no length (loss_mask 0).
    loss_mask: torch.Tensor | None = None
    # [N, L] policy version (trainer step) of the weights that generated each token, -1 on
    # padding; None: not recorded (synchronous runs). Set by partial rollouts (rollout.partial).
    versions: torch.Tensor | None = None

    @property
    def num_samples(self) -> int:
        return self.completion_ids.shape[0]

    @property
    def policy_mask(self) -> torch.Tensor:  # [N, L]
        """The loss mask: 1 on policy tokens only (environment tokens and padding 0)."""
        return self.completion_mask if self.loss_mask is None else self.loss_mask

    def completion_lengths(self) -> torch.Tensor:  # [N]
        """Policy tokens per row (environment tokens of multi-turn episodes not counted)."""
        return self.policy_mask.sum(dim=1)

    def to(self, device: torch.device) -> Rollout:
        """The rollout on ``device`` (itself when already there). ``extras`` stay where they
        are: the engine's records (MoE routing) are placed by their own readers."""
        if self.completion_ids.device == device:
            return self
        moved = {
            k: getattr(self, k).to(device)
            for k in (
                "prompt_ids",
                "prompt_mask",
                "completion_ids",
                "completion_mask",
                "logprobs",
                "prompt_index",
            )
        }
        if self.loss_mask is not None:
            moved["loss_mask"] = self.loss_mask.to(device)
        if self.versions is not None:
            moved["versions"] = self.versions.to(device)
        return Rollout(finish_reasons=self.finish_reasons, extras=self.extras, **moved)

    def select(self, rows: torch.Tensor) -> Rollout:
        """The listed rows [n] (CPU indices), in order, per-token fields and per-row extras
        included. Engine extras that are not laid out by row (MoE routing) cannot be split."""
        other = set(self.extras) - set(ROW_EXTRAS) - {PIXELS}
        if other:
            names = ", ".join(sorted(other))
            raise ValueError(f"cannot select rows of a rollout carrying engine extras ({names})")
        idx = rows.to(self.completion_ids.device)
        return Rollout(
            prompt_ids=self.prompt_ids[idx],
            prompt_mask=self.prompt_mask[idx],
            completion_ids=self.completion_ids[idx],
            completion_mask=self.completion_mask[idx],
            logprobs=self.logprobs[idx],
            finish_reasons=[self.finish_reasons[i] for i in rows.tolist()],
            prompt_index=self.prompt_index[idx],
            # Pixel inputs stay whole: the rows keep their prompt (or pixel) indices.
            extras={k: v if k == PIXELS else v[rows.to(v.device)] for k, v in self.extras.items()},
            loss_mask=None if self.loss_mask is None else self.loss_mask[idx],
            versions=None if self.versions is None else self.versions[idx],
        )


PIXELS = "pixels"
"""Rollout extra of image prompts: their :class:`gspo.models.vision.PixelInputs`, one entry per
prompt, indexed by ``prompt_index`` (kept whole by ``select``, offset-joined by rounds)."""

PIXEL_INDEX = "pixel_index"
"""Rollout extra [N] of multi-turn episodes with images: the entry of ``extras["pixels"]`` each
row reads (its own: an episode's images grow turn by turn, so rows of one group differ);
absent, a row reads its ``prompt_index`` entry (:func:`pixel_rows`)."""

ROW_EXTRAS = {"turn_ids": -1, "policy_version": None, PIXEL_INDEX: None}
"""Rollout extras that are per-row tensors (episodes: the policy turn of each token [N, L],
padded with the value given; the policy version of each row [N]; the pixel entry of each row
[N]), split and joined by row."""


def pixel_rows(rollout: Rollout) -> torch.Tensor:
    """[N] the entry of ``rollout.extras["pixels"]`` each row's forward takes: its episode's
    (``extras["pixel_index"]``) or its prompt's."""
    return rollout.extras.get(PIXEL_INDEX, rollout.prompt_index)


@dataclass
class RolloutBatch:
    """One step's scored rollout, row-aligned (N rows); each stage fills in its fields."""

    rollout: Rollout
    """Tokens and masks, the engine's log-probs [N, L], per-token policy versions
    (``versions``), the environment-token mask (``loss_mask``), per-token turns and per-row
    versions of episodes (``extras``)."""
    rewards: torch.Tensor  # [N] float64 training reward (episode return, less overlong penalty)
    reward_errors: int = 0
    """Failed episodes (a reward or an environment that raised, hung or gave no number)."""
    task_rewards: torch.Tensor | None = None  # [N] the task reward alone, beside a format bonus
    advantages: torch.Tensor | None = None
    """[N] group advantages of the rewards, or [N, L] per-turn credit (``credit='turn'``)."""
    trajectories: list[Any] = field(default_factory=list)
    """The episodes' records (``gspo.envs.trajectory.Trajectory``), one per row when scored."""
    images: Any = None
    """Per-row image inputs of vision-language prompts; None (text only) for now."""
    old_logprobs: torch.Tensor | None = None  # [N, L] the update's old policy
    weights: torch.Tensor | None = None  # [N, L] or [N] mismatch-correction weights
    step: int = 0
    """The RL step whose update trains these rows (seeds its minibatch shuffle); the loop sets
    it before the update."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Reward-side metrics in logging order (dynamic sampling, task reward, async, episodes, KL)."""
    mismatch: dict[str, float] = field(default_factory=dict)
    corrected: dict[str, float] = field(default_factory=dict)
    times: dict[str, float] = field(default_factory=dict)
    """Seconds per phase: rollout (sampling and scoring, or the wait for an async batch),
    recompute, update, sync."""

    @property
    def num_samples(self) -> int:
        return self.rollout.num_samples

    def to(self, device: torch.device) -> RolloutBatch:
        """The batch with what the update reads on ``device`` (rollout, advantages, old
        log-probs, weights). The rewards stay where they were scored (float64 on the CPU):
        the group advantages are computed there and moved, as they always were."""
        moved = {
            k: getattr(self, k).to(device)
            for k in ("advantages", "old_logprobs", "weights")
            if getattr(self, k) is not None
        }
        return replace(self, rollout=self.rollout.to(device), **moved)

    def select(self, rows: torch.Tensor) -> RolloutBatch:
        """The listed rows [n] (CPU indices), in order; counts and metrics are kept whole."""

        def pick(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t[rows.to(t.device)]

        listed = rows.tolist()
        return replace(
            self,
            rollout=self.rollout.select(rows),
            rewards=self.rewards[rows],
            task_rewards=pick(self.task_rewards),
            advantages=pick(self.advantages),
            old_logprobs=pick(self.old_logprobs),
            weights=pick(self.weights),
            trajectories=[self.trajectories[i] for i in listed] if self.trajectories else [],
            images=None if self.images is None else [self.images[i] for i in listed],
            metrics=dict(self.metrics),
            mismatch=dict(self.mismatch),
            corrected=dict(self.corrected),
            times=dict(self.times),
        )


@runtime_checkable
class RolloutEngine(Protocol):
    """Anything that samples completions with their log-probs and can take new weights."""

    def generate(self, request: GenerationRequest) -> Rollout:
        """Sample the request's completions."""
        ...

    def update_weights(self, model: torch.nn.Module) -> None:
        """Make the engine sample from ``model``'s current weights."""
        ...


@runtime_checkable
class PartialGeneration(Protocol):
    """A generation that can stop part way and continue later, possibly under new weights (the
    partial rollouts of asynchronous RL). Each token keeps the log-prob and the policy version
    of the weights that made it (``Rollout.versions``)."""

    @property
    def done(self) -> bool:
        """Every row finished (stop rule or ``max_new_tokens``)."""
        ...

    def run(
        self, max_tokens: int | None, version: int, stop: Callable[[], bool] | None = None
    ) -> int:
        """Generate up to ``max_tokens`` more tokens (None: to the end) with the engine's current
        weights, tagged ``version``, stopping early at the first boundary (a token, or a chunk
        for engines that cannot stop at any token) after which ``stop()`` is true; return the
        steps taken."""
        ...

    def pause(self) -> None:
        """Call before the engine's weights change: what was computed with the old ones goes."""
        ...

    def result(self) -> Rollout:
        """The generation as a ``Rollout`` with ``versions``; call once ``done``."""
        ...


@runtime_checkable
class ResumableEngine(RolloutEngine, Protocol):
    """An engine with its own partial generation (the torch engine: a pause at any token, bit
    for bit ``generate`` without one). Engines without it run partial rollouts as chunks of
    ``generate`` calls (:func:`gspo.rollout.partial.partial_generation`)."""

    def partial(self, request: GenerationRequest) -> PartialGeneration:
        """A :class:`PartialGeneration` of the request's completions (rows ``i * n + j``)."""
        ...


@dataclass(frozen=True)
class EngineBuild:
    """What an engine module's ``build`` makes its engine from (``gspo.rollout.engines``
    calls it; the engines are declared in ``gspo.config.options.ROLLOUT_ENGINES``)."""

    engine: Any
    """The run's ``gspo.config.options.EngineOptions`` (each engine reads its own fields)."""
    model: Any
    tokenizer: Any
    seed: int
    logprobs: bool
    pad_id: int
    eos_id: int
    sleep_mode: bool
    torch_kw: dict[str, Any]
    """The torch engine's own keywords (``dtype``, ``share_weights``)."""
