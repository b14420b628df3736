"""Run configuration: one flat dataclass, each field documented, plus presets and validation.

Precedence when building a config: defaults < preset < config file (YAML or JSON) < command-line
flags. Unknown keys and bad values are rejected before any work starts, with messages naming them.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from .async_config import AsyncFields
from .config_base import SharedFields, _doc
from .engine_config import CorrectionFields, EngineFields, validate_engine

ALGOS = ("grpo", "gspo", "gspo_token", "luspo")
OLD_LOGPROBS = ("engine", "recompute")
MINIBATCH_GROUPINGS = ("shuffled", "groups")
DTYPES = ("float32", "bfloat16", "float16", "float64")


class ConfigError(ValueError):
    """A configuration problem, reported before any work starts."""


@dataclass
class TrainConfig(SharedFields, EngineFields, CorrectionFields, AsyncFields):
    """Everything that defines an RL run; saved with every checkpoint."""

    # --- run, model, task: SharedFields (gspo.config_base); what differs here ---------------
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
        "Malformed data-file rows: 'error' stops with file, row and field; 'skip' drops them "
        "and logs the count (data/skipped_rows).",
        "error",
    )
    reward_timeout_s: float = _doc(
        "Seconds a reward call may take before it scores 0 and counts in reward/errors; 0: no limit.",
        0.0,
    )
    reward_workers: int = _doc(
        "Reward calls scored at once (threads); 0: one per core, at most 8, for sandboxed code "
        "rewards and 1 for others (gspo.rewards.reward_workers).",
        0,
    )
    max_prompt_tokens: int = _doc(
        "Longest prompt in tokens; 0: what the model's context length (max_position_embeddings; "
        "256 for the tiny models) leaves after max_new_tokens. A larger value is an error.",
        0,
    )
    long_prompts: str = _doc(
        "Prompts over max_prompt_tokens: 'error', 'truncate' (keep the last tokens) or 'skip'; "
        "counts are logged as data/prompts_truncated and data/prompts_skipped. Held-out "
        "prompts are never truncated: 'error' stops, otherwise they are left out "
        "(data/test_prompts_skipped).",
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
    # Options of the objectives of gspo.losses_family and gspo.train_options (checked there).
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
        "Multi-turn tasks: seconds one environment step may take before the episode fails "
        "(counted in episode/failed); 0: no limit.",
        30.0,
    )
    tool_timeout_s: float = _doc(
        "Multi-turn tasks: seconds one tool call may take before the episode fails.", 10.0
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
        "Stop after this many steps although the schedule runs to `steps` (preemption tests).", None
    )
    max_bad_steps: int = _doc(
        "Stop the run after this many consecutive steps whose updates were all skipped because "
        "the loss or gradients were not finite.",
        3,
    )
    progress: bool = _doc("Show a live progress bar.", True)
    tensorboard: bool = _doc("Also log to TensorBoard (needs the tensorboard extra).", False)
    wandb: bool = _doc("Also log to Weights & Biases (needs the wandb extra).", False)


@dataclass
class SFTConfig(SharedFields):
    """Supervised cold start on a task's demonstrations (run, model and task: SharedFields)."""

    output_dir: str = _doc("Folder for the fine-tuned model.", "runs/sft")
    n_test: int = _doc("Held-out problems for the accuracy printed at the end; 0: skip it.", 200)
    demo_key: str | None = _doc("Demonstration column; None uses the answer as the target.", None)
    steps: int = _doc("Optimizer steps.", 200)
    batch_size: int = _doc("Sequences per step.", 256)
    lr: float = _doc("AdamW learning rate.", 3e-3)
    warmup_steps: int = _doc("Linear warm-up steps.", 10)
    max_new_tokens: int = _doc("Completion length used when measuring held-out accuracy.", 8)
    progress: bool = _doc("Show a live progress bar.", True)


@dataclass
class EvalConfig(EngineFields):
    """``gspo eval``: score a model on a data file or a built-in task's held-out split."""

    model: str = _doc(
        "'smollm2-135m-instruct', a local Hugging Face checkpoint directory (e.g. a run's "
        "final/), or 'tiny' (random init: a smoke test only).",
        "smollm2-135m-instruct",
    )
    dtype: str = _doc("Model dtype: float32, bfloat16, float16 or float64.", "float32")
    device: str = _doc("'cpu', 'cuda' or 'auto'.", "auto")
    threads: int = _doc("torch CPU threads (0 keeps torch's default).", 0)
    seed: int = _doc("Seed of the held-out split of built-in tasks and of sampling.", 0)
    hidden_size: int = _doc("Tiny model: hidden width.", 64)
    num_layers: int = _doc("Tiny model: transformer layers.", 2)
    num_heads: int = _doc("Tiny model: attention heads.", 4)
    num_kv_heads: int = _doc("Tiny model: key/value heads.", 2)
    chat_template: str = _doc("Prompt formatting: 'auto', 'none' or 'always'.", "auto")
    system_prompt: str | None = _doc("System turn of chat-formatted prompts.", None)
    data: str | None = _doc(
        "A local .jsonl/.json/.parquet file of problems; None: the held-out split of --task.",
        None,
    )
    task: str = _doc(
        "Built-in task whose held-out split is scored when --data is not given.", "word_problems"
    )
    difficulty: int | None = _doc("Task difficulty; None: the task's default.", None)
    n_test: int = _doc("Held-out problems drawn from the built-in task.", 200)
    prompt_key: str = _doc("Prompt column of --data (GSM8K: question, MATH: problem).", "prompt")
    answer_key: str = _doc("Answer column of --data (MATH: solution).", "answer")
    answer_format: str = _doc(
        "How data files hold the final answer: 'raw' (the answer field itself), 'gsm8k' (after "
        "the last '####') or 'boxed' (the last \\boxed{...}, e.g. MATH's solution field).",
        "raw",
    )
    reward: str = _doc(
        "Reward for --data (exact_match, numeric, math_verify, format).", "math_verify"
    )
    limit: int = _doc("Score only the first N problems; 0: all.", 0)
    samples: int = _doc("Sampled completions per problem (k of avg@k and pass@k); 0: none.", 4)
    greedy: bool = _doc("Also score one greedy completion per problem.", True)
    max_new_tokens: int = _doc("Maximum completion length in tokens.", 256)
    temperature: float = _doc("Sampling temperature of the k samples.", 1.0)
    top_p: float = _doc("Nucleus sampling mass (1 disables it).", 1.0)
    batch_size: int = _doc("Sequences generated together.", 64)
    output: str | None = _doc("Write the JSON report here; None: print only.", "eval.json")
    show: int = _doc(
        "Per-problem records (prompt, completions, rewards) kept in the JSON; 0: all.", 20
    )
    progress: bool = _doc("Show a live progress bar.", True)


PRESETS: dict[str, dict[str, Any]] = {
    # The README's main job: a tiny model on 2-digit addition, visible learning in minutes.
    "demo": dict(
        task="addition", steps=800, prompts_per_step=16, group_size=8, max_new_tokens=6, lr=1e-4
    ),
    # Seconds-long smoke runs for tests.
    "smoke": dict(
        hidden_size=32,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        n_train=64,
        n_test=8,
        steps=2,
        prompts_per_step=2,
        group_size=4,
        max_new_tokens=4,
        num_minibatches=2,
        eval_every=0,
        checkpoint_every=0,
        progress=False,
    ),
    # GSPO paper settings (arXiv 2507.18071 §5.1): 4 minibatches, clip 3e-4 / 4e-4, no KL.
    "gspo-paper": dict(algo="gspo", num_minibatches=4, clip_low=3e-4, clip_high=4e-4, kl_coef=0.0),
    # The paper's GRPO baseline ranges: 0.2 / 0.27.
    "grpo-paper": dict(algo="grpo", num_minibatches=4, clip_low=0.2, clip_high=0.27, kl_coef=0.0),
    # LUSPO with its paper ranges (clip-higher): 2e-3 / 2.5e-3.
    "luspo-paper": dict(algo="luspo", num_minibatches=4, clip_low=2e-3, clip_high=2.5e-3),
}


def field_docs(cls: type) -> dict[str, str]:
    return {f.name: f.metadata.get("doc", "") for f in fields(cls)}


def _base_type(annotation: Any) -> tuple[type, bool]:
    """(the scalar type, whether None is allowed) of a field annotation like ``int | None``."""
    hint = annotation
    if isinstance(hint, str):  # `from __future__ import annotations`
        hint = eval(hint, {"typing": typing}, {})
    args = typing.get_args(hint)
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        non_none = [a for a in args if a is not type(None)]
        return non_none[0], True
    return hint, False


def coerce(cls: type, key: str, value: Any) -> Any:
    """Convert ``value`` (from a file or the command line) to the type of field ``key``."""
    by_name = {f.name: f for f in fields(cls)}
    if key not in by_name:
        raise ConfigError(f"unknown config key {key!r}; valid keys: {', '.join(by_name)}")
    typ, optional = _base_type(by_name[key].type)
    if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
        if optional:
            return None
        raise ConfigError(f"{key} cannot be None")
    try:
        if typ is bool:
            if isinstance(value, bool):
                return value
            text = str(value).lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if typ is int:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            if isinstance(value, bool):
                raise ValueError(value)
            return int(value) if not isinstance(value, str) else int(value, 10)
        if typ is float:
            if isinstance(value, bool):
                raise ValueError(value)
            return float(value)
        return str(value)
    except ValueError:
        raise ConfigError(f"{key}: expected {typ.__name__}, got {value!r}") from None


def load_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML or JSON config file into a dict (keys may use - or _)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    text = p.read_text()
    try:
        if p.suffix == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except Exception as exc:  # parse errors of either format
        raise ConfigError(f"{p}: cannot parse config: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: a config file must hold a mapping of keys to values")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def build(
    cls: type,
    *,
    preset: str | None = None,
    file: str | Path | None = None,
    overrides: dict[str, Any] | None = None,
) -> Any:
    """Defaults < preset < file < overrides, every value coerced and the result validated."""
    values: dict[str, Any] = {}
    if preset is not None:
        if preset not in PRESETS:
            raise ConfigError(f"unknown preset {preset!r}; valid: {', '.join(PRESETS)}")
        valid = {f.name for f in fields(cls)}
        values.update({k: v for k, v in PRESETS[preset].items() if k in valid})
    if file is not None:
        for k, v in load_file(file).items():
            values[k] = coerce(cls, k, v)
    for k, v in (overrides or {}).items():
        values[k] = coerce(cls, k, v)
    for k, v in list(values.items()):
        values[k] = coerce(cls, k, v)
    cfg = cls(**values)
    validate(cfg)
    return cfg


def validate(cfg: Any) -> None:
    """Raise ConfigError listing every problem in ``cfg``."""
    problems: list[str] = []

    def need(cond: bool, message: str) -> None:
        if not cond:
            problems.append(message)

    _validate_model_fields(cfg, need)
    validate_engine(cfg, need)  # rollout_engine, vllm_*, mismatch_* fields
    if isinstance(cfg, EvalConfig):
        _validate_eval(cfg, need)
        if problems:
            raise ConfigError("invalid config:\n  - " + "\n  - ".join(problems))
        return
    positive = [
        "n_train",
        *([] if isinstance(cfg, SFTConfig) else ["n_test"]),  # SFT: 0 skips its final eval
        "steps",
        "max_new_tokens",
        "hidden_size",
        "num_layers",
        "num_heads",
    ]
    positive += ["num_kv_heads"]
    if isinstance(cfg, TrainConfig):
        positive += ["prompts_per_step", "num_minibatches"]  # group_size: its own >= 2 check
    else:
        positive += ["batch_size"]
    for name in positive:
        need(getattr(cfg, name) > 0, f"{name} must be positive, got {getattr(cfg, name)}")
    if isinstance(cfg, SFTConfig):
        need(cfg.n_test >= 0, f"n_test must be >= 0, got {cfg.n_test}")
    need(cfg.lr > 0, f"lr must be positive, got {cfg.lr}")
    need(cfg.warmup_steps >= 0, f"warmup_steps must be >= 0, got {cfg.warmup_steps}")
    need(cfg.dtype in DTYPES, f"dtype must be one of {', '.join(DTYPES)}, got {cfg.dtype!r}")
    need(
        cfg.device in ("auto", "cpu", "cuda") or cfg.device.startswith("cuda:"),
        f"bad device {cfg.device!r}",
    )
    need(cfg.threads >= 0, f"threads must be >= 0, got {cfg.threads}")
    if cfg.hidden_size > 0 and cfg.num_heads > 0:
        need(cfg.hidden_size % cfg.num_heads == 0, "hidden_size must be divisible by num_heads")
    if cfg.num_heads > 0 and cfg.num_kv_heads > 0:
        need(cfg.num_heads % cfg.num_kv_heads == 0, "num_heads must be divisible by num_kv_heads")
    if cfg.task == "file":
        need(cfg.train_file is not None, "task='file' needs train_file")
        need(
            cfg.reward is not None,
            "task='file' needs reward (exact_match, numeric, math_verify, format)",
        )
    _validate_moe(cfg, need)
    if isinstance(cfg, TrainConfig):
        _validate_train(cfg, need)
    if problems:
        raise ConfigError("invalid config:\n  - " + "\n  - ".join(problems))


def _validate_moe(cfg: Any, need: Any) -> None:
    need(cfg.num_experts > 0, f"num_experts must be positive, got {cfg.num_experts}")
    need(
        1 <= cfg.experts_top_k <= cfg.num_experts,
        f"experts_top_k must be in [1, num_experts={cfg.num_experts}], got {cfg.experts_top_k}",
    )
    if cfg.moe_intermediate_size is not None:
        need(cfg.moe_intermediate_size > 0, "moe_intermediate_size must be positive")
    need(cfg.router_aux_loss_coef >= 0, "router_aux_loss_coef must be >= 0")
    if isinstance(cfg, TrainConfig):
        from .moe import ROUTING_REPLAY

        need(
            cfg.routing_replay is None or cfg.routing_replay in ROUTING_REPLAY,
            f"routing_replay must be one of {', '.join(ROUTING_REPLAY)}, got {cfg.routing_replay!r}",
        )
        need(
            cfg.routing_replay != "old" or cfg.old_logprobs == "recompute",
            "routing_replay='old' (R2) replays the routing of the old log-prob recompute pass: "
            "set old_logprobs='recompute', or use routing_replay='engine' (R3)",
        )
        need(
            cfg.routing_replay in (None, "none") or cfg.model != "tiny",
            f"routing_replay={cfg.routing_replay!r} needs an MoE model (e.g. model='tiny-moe')",
        )


def _validate_model_fields(cfg: Any, need: Any) -> None:
    """Prompt formatting, LoRA and answer-format fields shared by the train, SFT and eval configs."""
    from .chat import CHAT_MODES
    from .tasks.files import ANSWER_FORMATS

    need(
        cfg.chat_template in CHAT_MODES,
        f"chat_template must be one of {', '.join(CHAT_MODES)}, got {cfg.chat_template!r}",
    )
    need(
        cfg.answer_format in ANSWER_FORMATS,
        f"answer_format must be one of {', '.join(ANSWER_FORMATS)}, got {cfg.answer_format!r}",
    )
    if hasattr(cfg, "lora_rank"):
        need(cfg.lora_rank >= 0, f"lora_rank must be >= 0, got {cfg.lora_rank}")
        need(cfg.lora_alpha > 0, f"lora_alpha must be positive, got {cfg.lora_alpha}")
        need(0 <= cfg.lora_dropout < 1, f"lora_dropout must be in [0, 1), got {cfg.lora_dropout}")


def _validate_eval(cfg: EvalConfig, need: Any) -> None:
    for name in ("n_test", "max_new_tokens", "batch_size"):
        need(getattr(cfg, name) > 0, f"{name} must be positive, got {getattr(cfg, name)}")
    for name in ("samples", "limit", "show", "threads"):
        need(getattr(cfg, name) >= 0, f"{name} must be >= 0, got {getattr(cfg, name)}")
    need(cfg.samples > 0 or cfg.greedy, "nothing to score: samples is 0 and greedy is off")
    need(cfg.dtype in DTYPES, f"dtype must be one of {', '.join(DTYPES)}, got {cfg.dtype!r}")
    need(
        cfg.device in ("auto", "cpu", "cuda") or cfg.device.startswith("cuda:"),
        f"bad device {cfg.device!r}",
    )
    need(cfg.temperature >= 0, f"temperature must be >= 0, got {cfg.temperature}")
    need(0 < cfg.top_p <= 1, f"top_p must be in (0, 1], got {cfg.top_p}")


def _validate_train(cfg: TrainConfig, need: Any) -> None:
    from .advantages import SCALES
    from .losses import LOSSES

    need(cfg.algo in LOSSES, f"algo must be one of {', '.join(sorted(LOSSES))}, got {cfg.algo!r}")
    if cfg.algo in LOSSES:
        spec = LOSSES[cfg.algo]
        if cfg.aggregation is not None:
            need(
                cfg.aggregation in spec.aggregations,
                f"algo {cfg.algo} supports aggregation {', '.join(spec.aggregations)}, got {cfg.aggregation!r}",
            )
    if cfg.clip_low is not None:
        need(cfg.clip_low >= 0, f"clip_low must be >= 0, got {cfg.clip_low}")
    from .train_options import validate_options

    validate_options(cfg, need)
    if cfg.clip_high is not None:
        need(cfg.clip_high >= 0, f"clip_high must be >= 0, got {cfg.clip_high}")
    need(cfg.advantage_scale in SCALES, f"advantage_scale must be one of {', '.join(SCALES)}")
    if cfg.algo in LOSSES:  # multi-turn credit (gspo.envs.credit)
        from .envs.credit import credit_problem

        problem = credit_problem(cfg.algo, cfg.credit)
        need(problem is None, problem or "")
    need(cfg.max_turns >= 1, f"max_turns must be >= 1, got {cfg.max_turns}")
    need(cfg.max_total_tokens >= 1, f"max_total_tokens must be >= 1, got {cfg.max_total_tokens}")
    need(cfg.max_tokens_per_turn >= 0, "max_tokens_per_turn must be >= 0")
    need(0 <= cfg.turn_discount <= 1, f"turn_discount must be in [0, 1], got {cfg.turn_discount}")
    need(cfg.kl_coef >= 0, f"kl_coef must be >= 0, got {cfg.kl_coef}")
    need(
        0 <= cfg.overlong_buffer <= cfg.max_new_tokens,
        "overlong_buffer must be in [0, max_new_tokens]",
    )
    need(cfg.temperature >= 0, f"temperature must be >= 0, got {cfg.temperature}")
    need(0 < cfg.top_p <= 1, f"top_p must be in (0, 1], got {cfg.top_p}")
    need(cfg.old_logprobs in OLD_LOGPROBS, f"old_logprobs must be one of {', '.join(OLD_LOGPROBS)}")
    if cfg.engine_dtype is not None:
        need(cfg.engine_dtype in DTYPES, f"engine_dtype must be one of {', '.join(DTYPES)}")
    batch = cfg.prompts_per_step * cfg.group_size
    if cfg.num_minibatches > 0 and batch > 0:
        need(
            batch % cfg.num_minibatches == 0,
            f"prompts_per_step x group_size = {batch} must be divisible by num_minibatches={cfg.num_minibatches}",
        )
    need(
        cfg.minibatch_grouping in MINIBATCH_GROUPINGS,
        f"minibatch_grouping must be one of {', '.join(MINIBATCH_GROUPINGS)}, "
        f"got {cfg.minibatch_grouping!r}",
    )
    if cfg.minibatch_grouping == "groups" and cfg.num_minibatches > 0:
        need(
            cfg.prompts_per_step % cfg.num_minibatches == 0,
            f"minibatch_grouping='groups' keeps groups whole: prompts_per_step={cfg.prompts_per_step} "
            f"must be divisible by num_minibatches={cfg.num_minibatches}",
        )
    need(
        0.0 <= cfg.zero_advantage_split <= 1.0,
        f"zero_advantage_split must be in [0, 1], got {cfg.zero_advantage_split}",
    )
    need(cfg.micro_batch_size >= 0, "micro_batch_size must be >= 0")
    need(cfg.max_grad_norm >= 0, "max_grad_norm must be >= 0")
    need(cfg.weight_decay >= 0, "weight_decay must be >= 0")
    need(0 <= cfg.adam_beta1 < 1 and 0 <= cfg.adam_beta2 < 1, "adam betas must be in [0, 1)")
    need(
        cfg.eval_every >= 0 and cfg.checkpoint_every >= 0,
        "eval_every / checkpoint_every must be >= 0",
    )
    need(cfg.keep_checkpoints >= 1, "keep_checkpoints must be >= 1")
    need(
        math.isfinite(cfg.format_reward_weight),
        f"format_reward_weight must be finite, got {cfg.format_reward_weight}",
    )
    need(cfg.max_bad_steps >= 1, "max_bad_steps must be >= 1")
    need(
        cfg.bad_rows in ("error", "skip"),
        f"bad_rows must be 'error' or 'skip', got {cfg.bad_rows!r}",
    )
    need(cfg.reward_timeout_s >= 0, f"reward_timeout_s must be >= 0, got {cfg.reward_timeout_s}")
    need(cfg.reward_workers >= 0, f"reward_workers must be >= 0, got {cfg.reward_workers}")
    need(cfg.max_prompt_tokens >= 0, f"max_prompt_tokens must be >= 0, got {cfg.max_prompt_tokens}")
    need(
        cfg.long_prompts in ("error", "truncate", "skip"),
        f"long_prompts must be error, truncate or skip, got {cfg.long_prompts!r}",
    )
    need(
        cfg.group_size >= 2,
        f"group_size must be >= 2 (group-normalized advantages compare responses to the same prompt), got {cfg.group_size}",
    )
    if cfg.stop_after is not None:
        need(cfg.stop_after > 0, "stop_after must be positive")
    if cfg.loss_constant is not None:
        need(cfg.loss_constant > 0, "loss_constant must be positive")


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def from_dict(cls: type, data: dict[str, Any]) -> Any:
    """Rebuild a saved config (unknown keys rejected, values validated)."""
    return build(cls, overrides=data)
