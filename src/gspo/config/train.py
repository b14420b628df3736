"""Plain config data: ``TrainConfig`` (an RL run) and ``SFTConfig`` (a supervised cold start).

Flat fields, each with a doc (shown by ``--help``). This module imports nothing else of gspo.
"""

from __future__ import annotations

from dataclasses import dataclass

from .asynchronous import AsyncFields
from .fields import CorrectionFields, EngineFields, SharedFields, _doc, field_group
from .scale import ScaleFields


@dataclass
class TrainConfig(SharedFields, EngineFields, CorrectionFields, ScaleFields, AsyncFields):
    """Everything that defines an RL run; saved with every checkpoint."""

    # --- run, model, task: SharedFields (gspo.config.fields); what differs here ---------------
    output_dir: str = _doc(
        "Folder for metrics, checkpoints, the final model and plots.", "runs/gspo"
    )
    routing_replay: str | None = _doc(
        "MoE Routing Replay in the training forwards: none (off); 'old' (R2) reuses the experts "
        "the pre-update policy chose in the old log-prob recompute pass (needs "
        "old_logprobs='recompute'); 'engine' (R3) reuses the rollout engine's choice during "
        "generation. Gate weights still come from the current router (it keeps training).",
        None,
    )

    # --- data ------------------------------------------------------------------------------
    bad_rows: str = _doc(
        "Bad data-file rows (invalid JSON, not UTF-8, missing or empty field, bad image): "
        "'error' stops, listing each with file, row and field; 'skip' drops them and logs the "
        "counts (data/skipped_rows, and per kind data/skipped_rows_<kind>).",
        "error",
    )
    reward_timeout_s: float = _doc(
        "Seconds a reward call may take before it scores 0 and counts in reward/errors; 0: no limit.",
        0.0,
    )
    reward_workers: int = _doc(
        "Reward calls scored at once (threads); 0: one per core, at most 8, for sandboxed code "
        "rewards and 1 for others (gspo.envs.rewards.reward_workers).",
        0,
    )
    # The code reward's limits (gspo.sandbox.code_reward; docs/sandbox.md), applied to
    # any task whose reward runs the sandbox (task 'code', or reward 'code' for data files).
    code_test_timeout_s: float = _doc(
        "Code reward: seconds each unit test may run (an alarm inside the sandbox).", 2.0
    )
    code_total_timeout_s: float = _doc(
        "Code reward: wall-clock seconds of one whole sandboxed run (all of a completion's "
        "tests); 0: code_test_timeout_s per test plus 2 s.",
        0.0,
    )
    code_memory_mb: int = _doc(
        "Code reward: address-space limit of each sandboxed process in MiB (RLIMIT_AS).", 512
    )
    code_run_memory_mb: int = _doc(
        "Code reward: memory of a whole sandboxed run in MiB (its cgroup: processes, tmpfs "
        "files, page cache), where the host gives cgroups.",
        1024,
    )
    code_compare: str = _doc(
        "Code reward: how answers compare, unless a row's 'compare' field says: 'auto' (an "
        "expected string as text, a number as a number), 'text' or 'number' (numbers written "
        "as text too, within 1e-6). See docs/sandbox.md.",
        "auto",
    )
    max_prompt_tokens: int = _doc(
        "Longest prompt in tokens; 0: what the model's context length (max_position_embeddings; "
        "256 for the tiny models) leaves after max_new_tokens (multi-turn tasks: after "
        "max_total_tokens). A larger value is an error.",
        0,
    )
    long_prompts: str = _doc(
        "Prompts over max_prompt_tokens: 'error', 'truncate' (keep the last tokens) or 'skip'; "
        "counts are logged as data/prompts_truncated and data/prompts_skipped, and for "
        "held-out prompts (cut on their text) data/test_prompts_truncated and "
        "data/test_prompts_skipped. A held-out set left empty stops the run.",
        "error",
    )

    # --- algorithm -------------------------------------------------------------------------
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
    format_reward_weight: float = _doc(
        "Training reward += this x a format reward (1 when the answer is in \\boxed{} or after "
        "'####'); held-out evaluation scores the task's own reward only.",
        0.0,
    )
    kl_coef: float = _doc("β of a KL penalty to the initial policy; 0 turns it off.", 0.0)
    # Options of the objectives of gspo.core.losses_family and gspo.train_options (checked there).
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

    # --- multi-turn environments (gspo.envs; tasks with a registered environment) ---------
    max_turns: int = _doc("Multi-turn tasks: policy turns per episode.", 4)
    max_tokens_per_turn: int = _doc(
        "Multi-turn tasks: tokens one policy turn may sample; 0: max_new_tokens.", 0
    )
    max_total_tokens: int = _doc(
        "Multi-turn tasks: policy + environment tokens after the prompt per episode.", 128
    )
    env_timeout_s: float = _doc(
        "Environments without step_batch (the multi-turn tasks'): seconds one environment "
        "step may take before the episode fails (counted in episode/failed); 0: no limit.",
        30.0,
    )
    tool_timeout_s: float = _doc(
        "Multi-turn tasks: seconds one tool call may take before the episode fails.", 10.0
    )
    endpoint_host: str = _doc(
        "Agent environments: address the OpenAI-compatible endpoint of their episodes listens "
        "on (docs/endpoint.md); 0.0.0.0 lets agents on other machines reach it.",
        "127.0.0.1",
    )
    endpoint_port: int = _doc("Agent environments: the endpoint's port; 0: a free one.", 0)
    episode_timeout_s: float = _doc(
        "Agent environments: seconds one whole episode may take; past it the episode is cut "
        "like a turn limit (the environment's cut_reward, episode/timeout_fraction); 0: no "
        "limit.",
        600.0,
    )
    credit: str = _doc(
        "Multi-turn credit: 'episode' (one advantage per episode, every algo) or 'turn' "
        "(per-turn returns-to-go; gspo_token and grpo only).",
        "episode",
    )
    turn_discount: float = _doc("credit='turn': discount γ of later turns' rewards.", 1.0)

    # --- rollout ---------------------------------------------------------------------------
    steps: int = _doc("RL steps (rollout + updates) in the run.", 200)
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
    engine_dtype: str | None = _doc(
        "Run the rollout engine on its own copy of the weights in this dtype (e.g. bfloat16 to "
        "emulate a training-inference precision mismatch); None shares the trainer's model.",
        None,
    )

    # --- optimization ----------------------------------------------------------------------
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
        "True: the training forward + backward runs under torch.compile (inductor; needs a C++ "
        "compiler on CPU), each micro-batch padded to a bucket of shapes (rows, prompts, widths "
        "up to powers of two) so a run compiles a handful of graphs; the first steps pay the "
        "compile (minutes on a small CPU), a later run of the same shapes reuses inductor's "
        "cache (TORCHINDUCTOR_CACHE_DIR). Text models of the lean forward on the local "
        "backend; elsewhere, and for no-grad passes, eager. Same loss up to float rounding "
        "(docs/performance.md, 'Compiled update').",
        False,
    )
    lr: float = _doc("AdamW learning rate.", 5e-5)
    warmup_steps: int = _doc("Optimizer steps of linear learning-rate warm-up.", 10)
    weight_decay: float = _doc("AdamW weight decay.", 0.0)
    adam_beta1: float = _doc("AdamW β1.", 0.9)
    adam_beta2: float = _doc("AdamW β2.", 0.999)
    max_grad_norm: float = _doc("Gradient-norm clip; 0 turns it off.", 1.0)

    # --- evaluation, logging, checkpoints --------------------------------------------------
    eval_every: int = _doc("Held-out evaluation every N steps (and at start and end); 0: off.", 25)
    checkpoint_every: int = _doc(
        "Checkpoint every N steps (and at the end); 0: only at the end.", 50
    )
    keep_checkpoints: int = _doc("How many recent checkpoints to keep.", 2)
    stop_after: int | None = _doc(
        "Stop at this global step (counted like `steps`, from the run's start, across resumes) "
        "although the schedule runs to `steps`; a checkpoint is written there. Not kept on "
        "--resume unless given again.",
        None,
    )
    max_bad_steps: int = _doc(
        "Stop the run after this many consecutive steps whose updates were all skipped because "
        "the loss or gradients were not finite.",
        3,
    )
    progress: bool = _doc("Show a live progress bar.", True)
    tensorboard: bool = _doc("Also log to TensorBoard (needs the tensorboard extra).", False)
    wandb: bool = _doc("Also log to Weights & Biases (needs the wandb extra).", False)


EPISODE_LIMITS = (
    "max_turns",
    "max_tokens_per_turn",
    "max_total_tokens",
    "env_timeout_s",
    "tool_timeout_s",
)
EpisodeFields = field_group(
    "EpisodeFields",
    TrainConfig,
    EPISODE_LIMITS,
    """Limits of multi-turn episodes where a model is evaluated outside training (``gspo eval``,
    ``gspo sft``'s held-out score): ``TrainConfig``'s fields, defaults and docs.""",
)


@dataclass
class SFTConfig(SharedFields, EpisodeFields):
    """Supervised cold start on a task's demonstrations (run, model and task: SharedFields)."""

    output_dir: str = _doc("Folder for the fine-tuned model.", "runs/sft")
    n_test: int = _doc("Held-out problems for the accuracy printed at the end; 0: skip it.", 200)
    demo_key: str | None = _doc("Demonstration column; None uses the answer as the target.", None)
    steps: int = _doc("Optimizer steps.", 200)
    batch_size: int = _doc("Sequences per step.", 256)
    lr: float = _doc("AdamW learning rate.", 3e-3)
    warmup_steps: int = _doc("Linear warm-up steps.", 10)
    max_new_tokens: int = _doc("Completion length used when measuring held-out accuracy.", 8)
    long_prompts: str = _doc(
        "Demonstrations whose prompt + demonstration exceed the model's context (held-out "
        "prompts: prompt + max_new_tokens): 'error' (stop, naming the row), 'truncate' (keep "
        "the prompt's end) or 'skip'.",
        "error",
    )
    progress: bool = _doc("Show a live progress bar.", True)
    checkpoint_every: int = _doc(
        "Resumable checkpoint (in output_dir/checkpoints, until the model is saved) every N "
        "steps; 0: only when SIGINT / SIGTERM stop it.",
        50,
    )


SFT_SAFE_ON_RESUME = frozenset(
    {"output_dir", "steps", "checkpoint_every", "progress", "threads", *EPISODE_LIMITS}
)
"""Fields a resumed SFT may change: its learning rate is warm-up then constant, so more steps
continue the same run; the episode limits only shape the final held-out score; the rest decide
what each step computes."""
