"""The training side's options: rollout, loss, optimizer, backend and async (the run, model
and engine parts: :mod:`gspo.config.options`; task and reward: :mod:`gspo.config.options_task`)."""

from __future__ import annotations

from dataclasses import dataclass

from .asynchronous import PARTIAL_MODES
from .fields import CORRECTIONS, MINIBATCH_GROUPINGS, OLD_LOGPROBS, _doc
from .names import ADVANTAGE_SCALES, CREDITS, KL_ESTIMATORS, MISMATCH_LEVELS, losses, one_of
from .options import _collect, _Options
from .scale import BACKENDS, PLACEMENTS, REWARD_PLACEMENTS


@dataclass(frozen=True)
class RolloutOptions(_Options):
    """What one step samples: prompts, group size, lengths, sampling, old log-probs."""

    prompts_per_step: int = _doc("Prompts sampled per RL step.", 16)
    group_size: int = _doc("Completions per prompt (G).", 8)
    max_new_tokens: int = _doc("Maximum completion length in tokens.", 8)
    temperature: float = _doc("Sampling temperature; log-probs are of logits/temperature.", 1.0)
    top_p: float = _doc("Nucleus sampling mass (1 disables it).", 1.0)
    old_logprobs: str = _doc(
        "'engine': the rollout engine's own log-probs are the old log-probs (no extra pass); "
        "'recompute': a forward pass of the trainer's model, with the mismatch logged.",
        "engine",
    )
    dynamic_sampling: bool = _doc(
        "DAPO dynamic sampling: drop groups whose rewards are all equal and sample more "
        "prompts until prompts_per_step groups remain.",
        False,
    )
    dynamic_sampling_rounds: int = _doc(
        "Most rollout rounds per step with dynamic_sampling; then train on what there is.", 4
    )
    overlong_buffer: int = _doc(
        "DAPO soft overlong penalty buffer (tokens before max_new_tokens); 0 turns it off.", 0
    )

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
class LossOptions(_Options):
    """The objective: policy loss and its clip range, advantages, KL, multi-turn credit and the
    training-inference mismatch correction."""

    algo: str = _doc(
        "Policy loss: grpo, gspo, gspo_token, luspo, cispo, sapo, sapo_seq or gmpo "
        "(`gspo algos` lists each with its formula, defaults and paper).",
        "gspo",
    )
    clip_low: float | None = _doc(
        "ε below 1 (1 removes the lower bound); None: the algorithm's paper default.", None
    )
    clip_high: float | None = _doc("ε above 1; None: the algorithm's paper default.", None)
    aggregation: str | None = _doc("Loss aggregation; None: the algorithm's paper default.", None)
    loss_constant: float | None = _doc(
        "Normalizer of the 'constant' aggregation (Dr. GRPO); None: max_new_tokens.", None
    )
    advantage_scale: str = _doc(
        "Group advantage scale: std (population), sample_std (Bessel) or none (Dr. GRPO).", "std"
    )
    kl_coef: float = _doc("β of a KL penalty to the initial policy; 0 turns it off.", 0.0)
    kl_estimator: str = _doc("KL estimator: k1, k2, k3 or k3+ (k3 value, k2 gradient).", "k3")
    kl_in_reward: bool = _doc(
        "Put the KL penalty in the reward (r - β Σ_t KL_t before group normalization) instead "
        "of the loss.",
        False,
    )
    dual_clip: float | None = _doc(
        "GRPO dual clip: cap c > 1 on the ratio of negative-advantage tokens; None: off.", None
    )
    sapo_tau_pos: float = _doc("SAPO gate temperature for positive advantages.", 1.0)
    sapo_tau_neg: float = _doc("SAPO gate temperature for zero or negative advantages.", 1.05)
    off_policy_mask: bool = _doc(
        "DeepSeek-V3.2 off-policy sequence masking: drop a negative-advantage sequence whose "
        "mean log(engine/current) exceeds off_policy_mask_delta.",
        False,
    )
    off_policy_mask_delta: float = _doc("δ of off_policy_mask (nats per token).", 0.5)
    credit: str = _doc(
        "Multi-turn credit: 'episode' (one advantage per episode, every algo) or 'turn' "
        "(per-turn returns-to-go; gspo_token and grpo only).",
        "episode",
    )
    turn_discount: float = _doc("credit='turn': discount γ of later turns' rewards.", 1.0)
    mismatch_correction: str | None = _doc(
        "Re-weight the policy term by ρ = π_trainer(θ_old) / π_engine(θ_old) (needs "
        "old_logprobs='recompute', whose log-probs then serve as the old ones): None (off), "
        "'truncate' (TIS: min(ρ, cap)) or 'mask' (MIS / IcePop: ρ inside [floor, cap], else 0). "
        "The share of truncated or masked weights is logged as mismatch/corrected_fraction.",
        None,
    )
    mismatch_level: str = _doc(
        "Level of ρ: 'token' (per token), 'sequence' (product over the response) or "
        "'geometric' (geometric mean over the response, length-independent).",
        "token",
    )
    mismatch_cap: float = _doc("Upper bound C of the correction weights.", 2.0)
    mismatch_floor: float | None = _doc(
        "Lower bound of the correction weights (truncate: max(ρ, floor); mask: ρ < floor gets "
        "0); None: no lower bound.",
        None,
    )

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
class OptimOptions(_Options):
    """The update: minibatches, micro-batches, zero-advantage rows, AdamW and its schedule."""

    num_minibatches: int = _doc(
        "Optimizer steps per rollout batch; the first is on-policy, the rest off-policy.", 4
    )
    minibatch_grouping: str = _doc(
        "How a rollout is cut into minibatches: 'shuffled' (rows shuffled across groups) or "
        "'groups' (whole groups per minibatch, as verl's prompt-counted minibatches: each "
        "prompt then runs once per minibatch in the training pass; needs prompts_per_step "
        "divisible by num_minibatches).",
        "shuffled",
    )
    zero_advantage_split: float = _doc(
        "Rows whose advantage is 0 (their group's rewards all agree) add exactly 0 to the loss "
        "and the gradient. When at least this share of a minibatch's rows are such rows, they "
        "leave the gradient pass (no backward); below it they stay in it, since their separate "
        "no-grad forward (see zero_advantage_metrics) would cost more than their backward saves "
        "on small, overhead-bound models. 0: always split them off; 1: only all-zero "
        "minibatches. The update is the same either way.",
        0.25,
    )
    zero_advantage_metrics: bool = _doc(
        "True: zero-advantage rows that leave the gradient pass (see zero_advantage_split) get "
        "a no-grad forward, so entropy, clip and ratio metrics cover every row. False: every "
        "zero-advantage row is dropped from the training pass, with no forward at all: faster "
        "when many groups agree, and those metrics then cover only the rows that carry a "
        "gradient (the loss and the update are the same either way).",
        True,
    )
    micro_batch_size: int = _doc(
        "Sequences per forward/backward inside a minibatch (gradient accumulation); 0: whole minibatch.",
        0,
    )
    compile: bool = _doc(
        "True: the update's forwards (the gradient pass with its backward, and the no-grad pass "
        "of zero-advantage rows) and the torch engine's decode step run under torch.compile "
        "(inductor; needs a C++ compiler on CPU): one update graph per grad mode (rows, prompts "
        "and both widths dynamic) and one decode graph per KV-cache width (a multiple of 16), "
        "so a run compiles a handful of graphs; the first steps pay the compile (minutes on a "
        "small CPU), a later run reuses inductor's cache (TORCHINDUCTOR_CACHE_DIR). Text models "
        "of the lean forward, the update on the local backend; elsewhere eager. Same loss and "
        "log-probs up to float rounding (docs/performance.md, 'Compiled update').",
        False,
    )
    lr: float = _doc("AdamW learning rate.", 5e-5)
    warmup_steps: int = _doc("Optimizer steps of linear learning-rate warm-up.", 10)
    weight_decay: float = _doc("AdamW weight decay.", 0.0)
    adam_beta1: float = _doc("AdamW β1.", 0.9)
    adam_beta2: float = _doc("AdamW β2.", 0.999)
    max_grad_norm: float = _doc("Gradient-norm clip; 0 turns it off.", 1.0)

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
class BackendOptions(_Options):
    """Where training and rollout run: this process, or Ray actors (gspo.config.scale)."""

    backend: str = _doc(
        "Training backend: 'local' (this process, CPU or one GPU) or 'ray' (trainer_workers "
        "FSDP2 ranks and rollout_workers engines as Ray actors; needs the ray extra: pip "
        "install 'gspo[ray]'). Both run the same loop and give the same metrics.",
        "local",
    )
    trainer_workers: int = _doc(
        "backend='ray': FSDP2 training ranks (data parallel, sharded weights and optimizer; "
        "gloo on CPU, NCCL on GPU); each takes its share of every minibatch.",
        1,
    )
    rollout_workers: int = _doc(
        "backend='ray': rollout engines as Ray actors, each sampling its share of the prompts "
        "and receiving the new weights after every update; 0: one engine in the driver.",
        0,
    )
    ray_address: str | None = _doc(
        "backend='ray': address of an existing Ray cluster (e.g. 'ray://head:10001', "
        "'head:6379' or 'auto'); None: start a private local Ray for this run.",
        None,
    )
    placement: str = _doc(
        "backend='ray': 'colocated' (rank i and rollout worker i share a bundle: the same "
        "CPUs/GPU) or 'separate' (training and rollout in their own placement groups).",
        "separate",
    )
    reward_placement: str = _doc(
        "Where rewards are scored: 'driver' (this process, reward_workers threads), 'ray' "
        "(backend='ray': the batch cut into reward_workers chunks, one Ray task of 1 CPU "
        "each, on the cluster's free CPUs; a private local Ray gets reward_workers more "
        "CPUs) or 'auto' ('ray' for sandboxed rewards such as the code task's on "
        "backend='ray', else 'driver': a cheap reward loses to a task's overhead).",
        "auto",
    )
    fsdp_param_dtype: str | None = _doc(
        "backend='ray': FSDP2 mixed precision: the dtype the ranks all-gather and compute in "
        "('bfloat16' or 'float16'; gradients are reduced in float32 and the sharded master "
        "weights keep dtype); None: compute in dtype.",
        None,
    )
    activation_checkpointing: bool = _doc(
        "backend='ray': recompute each decoder layer's activations in the backward pass "
        "(less memory, one more forward per layer; the gradients are the same).",
        False,
    )

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
class AsyncOptions(_Options):
    """Rollouts running ahead of training (gspo.orchestration.async_source)."""

    max_staleness: int = _doc(
        "K, the most policy versions a training sample may lag behind the trainer. 0: the "
        "synchronous loop (generate, then train, bit for bit as without this field). K >= 1: a "
        "rollout thread with its own copy of the weights generates the batches of upcoming "
        "steps while the trainer trains; a sample is admitted only if the weights that "
        "generated its oldest token are at most K updates old (async/* metrics). Local backend "
        "(torch engine: new weights enter at any token; vLLM: at chunk boundaries, and the "
        "evaluation runs a torch engine) or backend='ray' (rollout workers, torch or vLLM, new "
        "weights entering at chunk boundaries); single-turn tasks and multi-turn episodes (also "
        "at turn boundaries); no dynamic_sampling.",
        0,
    )
    async_partial: str = _doc(
        "What a generation does when new weights arrive mid-way (max_staleness >= 1): 'keep' "
        "continues under the new weights, each token keeping the log-prob of the weights that "
        "made it (the behaviour policy, so the loss ratio is the true importance ratio); "
        "'mask' also continues but drops the tokens made before the newest version from the "
        "loss (slime-style); 'restart' starts the step's batch again under the new weights.",
        "keep",
    )
    async_chunk_tokens: int = _doc(
        "max_staleness >= 1 on the Ray rollout workers or a local vLLM engine: the most new "
        "tokens per generation call; new weights reach a running generation at these chunk "
        "boundaries (each chunk continues from prompt + tokens so far). 0: the whole generation "
        "in one call (versions per sample, no pause). A local torch engine pauses at any token.",
        8,
    )

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
