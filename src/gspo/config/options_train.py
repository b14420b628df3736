"""The training side's options: rollout, loss, optimizer, backend and async (see
:mod:`gspo.config.options`, whose helpers give each field the flat field's default and doc)."""

from __future__ import annotations

from dataclasses import dataclass

from .asynchronous import PARTIAL_MODES
from .fields import CORRECTIONS, MINIBATCH_GROUPINGS, OLD_LOGPROBS
from .names import ADVANTAGE_SCALES, CREDITS, KL_ESTIMATORS, MISMATCH_LEVELS, losses, one_of
from .options import _collect, _flat_fields, _Options
from .scale import BACKENDS, PLACEMENTS, REWARD_PLACEMENTS


@dataclass(frozen=True)
@_flat_fields
class RolloutOptions(_Options):
    """What one step samples: prompts, group size, lengths, sampling, old log-probs."""

    prompts_per_step: int
    group_size: int
    max_new_tokens: int
    temperature: float
    top_p: float
    old_logprobs: str
    dynamic_sampling: bool
    dynamic_sampling_rounds: int
    overlong_buffer: int

    def problems(self) -> list[str]:
        problems, need = _collect()
        for name in ("max_new_tokens", "prompts_per_step"):
            value = getattr(self, name)
            need(value > 0, f"{name} must be positive, got {value}")
        need(
            self.group_size >= 2,
            "group_size must be >= 2 (group-normalized advantages compare responses to the same "
            f"prompt), got {self.group_size}",
        )
        need(self.temperature >= 0, f"temperature must be >= 0, got {self.temperature}")
        need(0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}")
        need(
            self.old_logprobs in OLD_LOGPROBS,
            one_of("old_logprobs", self.old_logprobs, OLD_LOGPROBS),
        )
        need(
            self.dynamic_sampling_rounds >= 1,
            f"dynamic_sampling_rounds must be >= 1, got {self.dynamic_sampling_rounds}",
        )
        need(
            0 <= self.overlong_buffer <= self.max_new_tokens,
            "overlong_buffer must be in [0, max_new_tokens]",
        )
        return problems


@dataclass(frozen=True)
@_flat_fields
class LossOptions(_Options):
    """The objective: policy loss and its clip range, advantages, KL, multi-turn credit and the
    training-inference mismatch correction."""

    algo: str
    clip_low: float | None
    clip_high: float | None
    aggregation: str | None
    loss_constant: float | None
    advantage_scale: str
    kl_coef: float
    kl_estimator: str
    kl_in_reward: bool
    dual_clip: float | None
    sapo_tau_pos: float
    sapo_tau_neg: float
    off_policy_mask: bool
    off_policy_mask_delta: float
    credit: str
    turn_discount: float
    mismatch_correction: str | None
    mismatch_level: str
    mismatch_cap: float
    mismatch_floor: float | None

    def problems(self) -> list[str]:
        problems, need = _collect()
        spec = losses().get(self.algo)
        need(spec is not None, one_of("algo", self.algo, sorted(losses()), noun="algorithm"))
        if spec is not None and self.aggregation is not None:
            need(
                self.aggregation in spec.aggregations,
                f"algo {self.algo} supports aggregation {', '.join(spec.aggregations)}, "
                f"got {self.aggregation!r}",
            )
        if self.clip_low is not None:
            need(self.clip_low >= 0, f"clip_low must be >= 0, got {self.clip_low}")
        need(
            self.kl_estimator in KL_ESTIMATORS,
            one_of("kl_estimator", self.kl_estimator, KL_ESTIMATORS),
        )
        if spec is not None:
            clip_set = self.clip_low is not None or self.clip_high is not None
            need(
                spec.clip_meaning != "unused" or not clip_set,
                f"algo {self.algo} has no clip range: leave clip_low/clip_high unset "
                "(its gate temperatures are sapo_tau_pos/sapo_tau_neg)",
            )
            need(
                self.dual_clip is None or "dual_clip" in dict(spec.options),
                f"dual_clip applies to grpo only, not to algo {self.algo}",
            )
        if self.clip_low is not None and (spec is None or spec.clip_meaning in ("ratio", "weight")):
            # 1 - ε_low bounds a ratio from below (1: no lower bound); only GMPO's log-space ε
            # may exceed 1.
            need(self.clip_low <= 1, f"clip_low must be in [0, 1], got {self.clip_low}")
        need(
            self.dual_clip is None or self.dual_clip > 1,
            f"dual_clip must be > 1, got {self.dual_clip}",
        )
        need(
            self.sapo_tau_pos > 0 and self.sapo_tau_neg > 0,
            "sapo_tau_pos/sapo_tau_neg must be positive, "
            f"got {self.sapo_tau_pos}, {self.sapo_tau_neg}",
        )
        need(
            self.off_policy_mask_delta >= 0,
            f"off_policy_mask_delta must be >= 0, got {self.off_policy_mask_delta}",
        )
        need(
            not self.kl_in_reward or self.kl_coef > 0,
            "kl_in_reward needs kl_coef > 0 (the β of the penalty)",
        )
        if self.clip_high is not None:
            need(self.clip_high >= 0, f"clip_high must be >= 0, got {self.clip_high}")
        need(
            self.advantage_scale in ADVANTAGE_SCALES,
            one_of("advantage_scale", self.advantage_scale, ADVANTAGE_SCALES),
        )
        # Multi-turn credit, as gspo.envs.credit.credit_problem (which needs torch) checks it.
        need(self.credit in CREDITS, one_of("credit", self.credit, CREDITS))
        if self.credit == "turn" and spec is not None:
            need(
                spec.token_advantages,
                "credit='turn' gives each turn its own advantage, which needs a token-level loss "
                f"('gspo_token' or 'grpo'); algo={self.algo!r} takes one advantage per sequence "
                "(use credit='episode' with it)",
            )
        need(
            0 <= self.turn_discount <= 1,
            f"turn_discount must be in [0, 1], got {self.turn_discount}",
        )
        need(self.kl_coef >= 0, f"kl_coef must be >= 0, got {self.kl_coef}")
        if self.loss_constant is not None:
            need(self.loss_constant > 0, "loss_constant must be positive")
        need(
            self.mismatch_correction in (None, *CORRECTIONS),
            one_of("mismatch_correction", self.mismatch_correction, ("none", *CORRECTIONS)),
        )
        need(
            self.mismatch_level in MISMATCH_LEVELS,
            one_of("mismatch_level", self.mismatch_level, MISMATCH_LEVELS),
        )
        need(self.mismatch_cap > 0, f"mismatch_cap must be positive, got {self.mismatch_cap}")
        if self.mismatch_floor is not None:
            need(
                0 <= self.mismatch_floor <= self.mismatch_cap,
                f"mismatch_floor must be in [0, mismatch_cap], got {self.mismatch_floor}",
            )
        return problems


@dataclass(frozen=True)
@_flat_fields
class OptimOptions(_Options):
    """The update: minibatches, micro-batches, zero-advantage rows, AdamW and its schedule."""

    num_minibatches: int
    minibatch_grouping: str
    zero_advantage_split: float
    zero_advantage_metrics: bool
    micro_batch_size: int
    compile: bool
    lr: float
    warmup_steps: int
    weight_decay: float
    adam_beta1: float
    adam_beta2: float
    max_grad_norm: float

    def problems(self) -> list[str]:
        problems, need = _collect()
        need(
            self.num_minibatches > 0,
            f"num_minibatches must be positive, got {self.num_minibatches}",
        )
        need(self.lr > 0, f"lr must be positive, got {self.lr}")
        need(self.warmup_steps >= 0, f"warmup_steps must be >= 0, got {self.warmup_steps}")
        need(
            self.minibatch_grouping in MINIBATCH_GROUPINGS,
            one_of("minibatch_grouping", self.minibatch_grouping, MINIBATCH_GROUPINGS),
        )
        need(
            0.0 <= self.zero_advantage_split <= 1.0,
            f"zero_advantage_split must be in [0, 1], got {self.zero_advantage_split}",
        )
        need(self.micro_batch_size >= 0, "micro_batch_size must be >= 0")
        need(self.max_grad_norm >= 0, "max_grad_norm must be >= 0")
        need(self.weight_decay >= 0, "weight_decay must be >= 0")
        need(0 <= self.adam_beta1 < 1 and 0 <= self.adam_beta2 < 1, "adam betas must be in [0, 1)")
        return problems


@dataclass(frozen=True)
@_flat_fields
class BackendOptions(_Options):
    """Where training and rollout run: this process, or Ray actors (gspo.config.scale)."""

    backend: str
    trainer_workers: int
    rollout_workers: int
    ray_address: str | None
    placement: str
    reward_placement: str
    fsdp_param_dtype: str | None
    activation_checkpointing: bool

    def problems(self) -> list[str]:
        problems, need = _collect()
        need(self.backend in BACKENDS, one_of("backend", self.backend, BACKENDS))
        need(self.placement in PLACEMENTS, one_of("placement", self.placement, PLACEMENTS))
        need(
            self.reward_placement in REWARD_PLACEMENTS,
            one_of("reward_placement", self.reward_placement, REWARD_PLACEMENTS),
        )
        need(self.trainer_workers >= 1, f"trainer_workers must be >= 1, got {self.trainer_workers}")
        need(self.rollout_workers >= 0, f"rollout_workers must be >= 0, got {self.rollout_workers}")
        if self.backend == "local":
            for name, default in (("trainer_workers", 1), ("rollout_workers", 0)):
                value = getattr(self, name)
                need(value == default, f"{name}={value} needs backend='ray'")
            need(self.ray_address is None, "ray_address needs backend='ray'")
            need(self.reward_placement != "ray", "reward_placement='ray' needs backend='ray'")
            need(
                self.fsdp_param_dtype is None and not self.activation_checkpointing,
                "fsdp_param_dtype and activation_checkpointing need backend='ray'",
            )
        need(
            self.fsdp_param_dtype in (None, "bfloat16", "float16"),
            f"fsdp_param_dtype must be bfloat16, float16 or None, got {self.fsdp_param_dtype!r}",
        )
        if self.backend == "ray":
            need(
                self.placement != "colocated" or self.rollout_workers != 0,
                "placement='colocated' shares bundles with rollout workers: set "
                "rollout_workers >= 1 (or placement='separate')",
            )
        return problems


@dataclass(frozen=True)
@_flat_fields
class AsyncOptions(_Options):
    """Rollouts running ahead of training (gspo.orchestration.async_source)."""

    max_staleness: int
    async_partial: str
    async_chunk_tokens: int

    @property
    def staleness_ok(self) -> bool:
        return isinstance(self.max_staleness, int) and self.max_staleness >= 0

    def problems(self) -> list[str]:
        k = self.max_staleness
        if not self.staleness_ok:
            return [f"max_staleness must be an integer >= 0, got {k!r}"]
        problems, need = _collect()
        need(
            self.async_partial in PARTIAL_MODES,
            one_of("async_partial", self.async_partial, PARTIAL_MODES),
        )
        if k >= 1:
            chunk = self.async_chunk_tokens
            need(
                isinstance(chunk, int) and chunk >= 0,
                f"async_chunk_tokens must be an integer >= 0, got {chunk!r}",
            )
        return problems
