"""The one place that refuses bad combinations across a ``TrainConfig``'s components.

:func:`combination_problems` lists every refused combination together (each component's own
fields: its ``problems()``; names checked against the task and reward registries:
:mod:`gspo.config.validation`). Torch-free and registry-free, like the options.
"""

from __future__ import annotations

from .names import VLLM_CPU_HEAD_SIZES, is_environment_task
from .train import TrainConfig


def problems(cfg: TrainConfig) -> list[str]:
    """Every problem of every component, then every refused combination, without repeats."""
    out: list[str] = []
    for problem in [p for part in cfg.parts() for p in part.problems()] + (
        combination_problems(cfg)
    ):
        if problem not in out:
            out.append(problem)
    return out


def combination_problems(o: TrainConfig) -> list[str]:
    """Every combination of values across components that a run refuses (empty: none)."""
    # A registered multi-turn environment, or one named by --env module:factory.
    multi_turn = is_environment_task(o.task.task) or o.task.env is not None
    return [
        *scale_combinations(o),
        *async_combinations(o),
        *_training_combinations(o),
        *(multi_turn_combinations(o) if multi_turn else []),
        *vision_combinations(o, multi_turn),
    ]


IMAGE_TASKS = ("shapes",)
"""Built-in tasks whose prompts carry images."""

TEXT_MODELS = ("tiny", "tiny-moe", "smollm2-135m-instruct")
"""Built-in models that read text only."""

VISION_MODELS = ("tiny-vl", "tiny-qwen-vl")
"""Built-in vision-language models."""


def vision_combinations(o: TrainConfig, multi_turn: bool = False) -> list[str]:
    """What image prompts need, and what they do not support yet (checked before torch)."""
    images = o.task.task in IMAGE_TASKS or bool(o.task.image_key)
    if not images and o.model.model not in VISION_MODELS:
        return []
    what = f"task {o.task.task!r}" if o.task.task in IMAGE_TASKS else "image_key"
    what = what if images else f"model {o.model.model!r}"
    out: list[str] = []
    if images and o.model.model in TEXT_MODELS:
        out.append(
            f"{what} has image prompts, which model {o.model.model!r} cannot see: use "
            "--model tiny-vl or a local vision-language checkpoint"
        )
    if o.engine.rollout_engine == "vllm" and o.model.model == "tiny-vl":
        out.extend(_vllm_head_size(o))
    if images and o.engine.rollout_engine == "vllm":
        # The vLLM engine takes image prompts one turn at a time, in this process.
        if o.backend.backend == "ray":
            out.append(
                f"{what} on Ray needs rollout_engine='torch' (vLLM rollout workers do not take "
                "images yet)"
            )
        if o.asynchronous.staleness_ok and o.asynchronous.max_staleness > 0:
            out.append(
                f"{what} sampled ahead of training (max_staleness >= 1) needs "
                "rollout_engine='torch'"
            )
        if multi_turn:
            out.append(f"{what} in multi-turn environments needs rollout_engine='torch'")
    if images and o.backend.backend == "ray":
        # Ray ranks and rollout workers take one-turn image prompts, sampled each step.
        if o.asynchronous.staleness_ok and o.asynchronous.max_staleness > 0:
            out.append(f"{what} on Ray is sampled each step only (max_staleness 0)")
        if multi_turn:
            out.append(f"{what} in multi-turn environments needs backend='local'")
    if o.model.model == "tiny-qwen-vl":
        # M-RoPE positions are built by the torch engine and the training forward only.
        late = o.asynchronous.staleness_ok and o.asynchronous.max_staleness > 0
        ways = [
            ("rollout_engine='vllm'", o.engine.rollout_engine == "vllm"),
            ("backend='ray'", o.backend.backend == "ray"),
            ("max_staleness >= 1", late),
            ("a multi-turn environment", multi_turn),
        ]
        for name, used in ways:
            if used:
                out.append(
                    f"model 'tiny-qwen-vl' runs on the torch engine, local backend, one turn "
                    f"sampled each step; not with {name} yet"
                )
    # (Async sampling, partial rollouts and multi-turn environments carry Idefics3's pixels on
    # the torch engine in this process.)
    return out


def _vllm_head_size(o: TrainConfig) -> list[str]:
    """tiny-vl's default head size (64 / 4 = 16) is one vLLM's CPU attention refuses at start-up,
    after the model is built; say so here, with the flags that fix it."""
    m = o.model
    if o.run.device.startswith("cuda") or m.num_heads <= 0 or m.hidden_size % m.num_heads:
        return []
    head = m.hidden_size // m.num_heads
    if head in VLLM_CPU_HEAD_SIZES:
        return []
    fix = f"--hidden-size {m.hidden_size} --num-heads {m.hidden_size // 32}"
    fix += f" --num-kv-heads {max(1, m.hidden_size // 64)}"
    return [
        f"model 'tiny-vl' with rollout_engine='vllm': head size {head} (hidden_size "
        f"{m.hidden_size} / num_heads {m.num_heads}) is not one vLLM's CPU attention runs "
        f"{list(VLLM_CPU_HEAD_SIZES)}; use e.g. {fix} (head size 32), or --rollout-engine torch"
    ]


def multi_turn_combinations(o: TrainConfig) -> list[str]:
    """What multi-turn episodes do not support yet. Checked here for the tasks with a
    registered environment, and again when the run builds its episodes (an environment the
    config cannot know, e.g. one made in Python, is multi-turn only then)."""
    out: list[str] = []
    if o.task.max_turns < 1 or o.task.max_total_tokens < 1:
        out.append("max_turns and max_total_tokens must be >= 1")
    if o.rollout.overlong_buffer > 0:
        out.append("overlong_buffer applies to single-turn tasks only")
    if o.loss.kl_in_reward:
        out.append("kl_in_reward applies to single-turn tasks only (for now)")
    if o.rollout.dynamic_sampling and o.loss.credit == "turn":
        out.append(
            "dynamic_sampling keeps episode groups whose returns differ, which needs "
            "credit='episode' (per-turn credit is not split across rounds yet)"
        )
    if o.model.routing_replay == "engine":
        out.append(
            "routing_replay='engine' needs the engine's expert choices, which multi-turn "
            "episodes do not record yet (use 'old' or none)"
        )
    return out


def scale_combinations(o: TrainConfig) -> list[str]:
    """What backend='ray' does not support yet."""
    out: list[str] = []
    if o.backend.backend == "ray":
        if o.model.model == "tiny-moe" or o.model.routing_replay not in (None, "none"):
            out.append(
                "backend='ray' does not support MoE models or routing_replay yet; use "
                "backend='local'"
            )
        if o.model.lora_rank > 0:
            out.append("backend='ray' does not support LoRA (lora_rank > 0) yet")
    return out


def async_combinations(o: TrainConfig) -> list[str]:
    """What rollouts running ahead of training (max_staleness >= 1) do not support."""
    a = o.asynchronous
    if not a.staleness_ok or a.max_staleness == 0:
        return []
    out: list[str] = []
    ray = o.backend.backend == "ray"
    if o.rollout.dynamic_sampling:
        out.append("max_staleness >= 1 does not support dynamic_sampling yet")
    if o.model.routing_replay == "engine":
        out.append("max_staleness >= 1 does not record MoE routing: routing_replay='engine'")
    if ray and o.backend.rollout_workers < 1:
        out.append(
            "max_staleness >= 1 with backend='ray' needs rollout_workers >= 1 (the workers "
            "generate while the ranks train)"
        )
    return out


def _training_combinations(o: TrainConfig) -> list[str]:
    out: list[str] = []

    def need(cond: bool, message: str) -> None:
        if not cond:
            out.append(message)

    model, rollout, optim = o.model, o.rollout, o.optim
    need(
        model.routing_replay != "old" or rollout.old_logprobs == "recompute",
        "routing_replay='old' (R2) replays the routing of the old log-prob recompute pass: "
        "set old_logprobs='recompute', or use routing_replay='engine' (R3)",
    )
    if o.engine.rollout_engine == "vllm":
        need(
            rollout.top_p == 1.0,
            f"rollout_engine='vllm' with top_p={rollout.top_p}: vLLM's log-probs are of the "
            "top-p-truncated distribution, the trainer's of the full one (biased ratios); use "
            "top_p=1 or rollout_engine='torch'",
        )
        need(
            model.routing_replay != "engine",
            "routing_replay='engine' (R3) with rollout_engine='vllm': vLLM 0.32 records no expert "
            "choices on CPU (its enable_return_routed_experts output exists only in the GPU "
            "model runner and is not wired here); use routing_replay='old' (R2, with "
            "old_logprobs='recompute') or rollout_engine='torch'",
        )
        need(
            o.engine.engine_dtype is None,
            "engine_dtype is the torch engine's copy dtype; with rollout_engine='vllm' set "
            "vllm_dtype instead",
        )
    need(
        o.loss.mismatch_correction is None or rollout.old_logprobs == "recompute",
        f"mismatch_correction={o.loss.mismatch_correction!r} compares the trainer's old "
        "log-probs with the engine's: set old_logprobs='recompute'",
    )
    batch = rollout.prompts_per_step * rollout.group_size
    if optim.num_minibatches > 0 and batch > 0:
        need(
            batch % optim.num_minibatches == 0,
            f"prompts_per_step x group_size = {batch} must be divisible by "
            f"num_minibatches={optim.num_minibatches}",
        )
    if optim.minibatch_grouping == "groups" and optim.num_minibatches > 0:
        need(
            rollout.prompts_per_step % optim.num_minibatches == 0,
            "minibatch_grouping='groups' keeps groups whole: "
            f"prompts_per_step={rollout.prompts_per_step} "
            f"must be divisible by num_minibatches={optim.num_minibatches}",
        )
    return out


def early_problems(o: TrainConfig) -> list[str]:
    """The problems a run refuses even when its config was made without validation (Python
    API): the scale-out and async fields and their combinations, as checked before any work."""
    return [
        *o.backend.problems(),
        *scale_combinations(o),
        *o.asynchronous.problems(),
        *async_combinations(o),
    ]
