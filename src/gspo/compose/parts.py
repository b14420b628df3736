"""Turn a config into the run's parts: device, policy model and tokenizer, task."""

from __future__ import annotations

from dataclasses import replace

from ..config.combinations import combination_problems
from ..config.eval_config import EvalConfig
from ..config.options import ModelOptions
from ..config.options_task import RewardOptions, TaskOptions
from ..config.train import SFTConfig, TrainConfig
from ..envs.rewards import combine, format_reward
from ..envs.tasks import make_task
from ..envs.tasks.base import Task
from ..envs.tasks.checks import check_duplicates, check_held_out
from ..envs.tasks.files import options_file_task
from ..models.policy import build_policy
from ..models.vision_qwen import uses_mrope
from ..sandbox import with_code_limits


def build_policy_for(cfg: TrainConfig | SFTConfig | EvalConfig, device):
    """(model, tokenizer) of a config: its model options, initialized from its seed."""
    if isinstance(cfg, TrainConfig):
        return build_policy(cfg.model, device, seed=cfg.run.seed)
    return build_policy(ModelOptions.of(cfg), device, seed=cfg.seed)


def refuse_mrope_paths(cfg: TrainConfig, model) -> None:
    """A Qwen2.5-VL checkpoint (``--model PATH``) gets the refusals ``tiny-qwen-vl`` gets before
    torch (config/combinations.py): its M-RoPE positions are built by the torch engine and the
    training forward only. Its type is known only once it is loaded."""
    if not uses_mrope(model):
        return
    as_tiny = combination_problems(replace(cfg, model=replace(cfg.model, model="tiny-qwen-vl")))
    for line in as_tiny:
        if line.startswith("model 'tiny-qwen-vl' runs on"):
            name = f"model {cfg.model.model!r} (Qwen2.5-VL)"
            raise ValueError(line.replace("model 'tiny-qwen-vl'", name, 1))


def build_task(cfg: TrainConfig | SFTConfig) -> Task:
    """A built-in synthetic task, or a task made of the user's data files, with the run's
    code-reward limits (``code_*`` fields) on a reward that runs the sandbox."""
    if isinstance(cfg, SFTConfig):
        opts, reward, seed, demo_key = TaskOptions.of(cfg), cfg.reward, cfg.seed, cfg.demo_key
        evaluates = cfg.n_test > 0
    else:
        opts, reward, seed, demo_key = cfg.task, cfg.reward.reward, cfg.run.seed, None
        evaluates = cfg.run.eval_every > 0
    task = _build_task(opts, reward, seed, demo_key)
    # Duplicates counted (data/duplicates...) and, with dedupe, dropped; a run that evaluates
    # (train: eval_every > 0, SFT: n_test > 0) stops here if its held-out set ends up empty.
    checked = check_duplicates(task, dedupe=opts.dedupe)
    task = check_held_out(task, checked, opts.test_file, evaluates)
    if isinstance(cfg, TrainConfig):  # (SFT has no rewards to limit)
        limits = cfg.reward
        task.reward = with_code_limits(
            task.reward,
            test_timeout_s=limits.code_test_timeout_s,
            total_timeout_s=limits.code_total_timeout_s or None,
            memory_mb=limits.code_memory_mb,
            run_memory_mb=limits.code_run_memory_mb,
            compare=limits.code_compare,
        )
    return task


def _build_task(opts: TaskOptions, reward: str | None, seed: int, demo_key: str | None) -> Task:
    if opts.task == "file":
        return options_file_task(opts, reward, demo_key)
    return builder_task(opts, seed)


def builder_task(opts: TaskOptions, seed: int) -> Task:
    """The task ``opts.task`` made by its builder (a training run's, or ``gspo eval``'s and
    ``gspo sft``'s held-out one with ``n_train=0``). A user's builder (module:builder, or one a
    plugin registers) also gets the file arguments its signature names: it may read the run's
    data files itself (``gspo.envs.tasks.base.call_builder``)."""
    return make_task(
        opts.task,
        n_train=opts.n_train,
        n_test=opts.n_test,
        seed=seed,
        difficulty=opts.difficulty,
        train_file=opts.train_file,
        test_file=opts.test_file,
        prompt_key=opts.prompt_key,
        answer_key=opts.answer_key,
        answer_format=opts.answer_format,
    )


LONG_PROMPTS = ("error", "truncate", "skip")


def context_length(model) -> int | None:
    """Token positions the model was built for (``max_position_embeddings``), or None."""
    n = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    return int(n) if isinstance(n, int) and n > 0 else None


def prompt_token_limit(
    max_prompt_tokens: int,
    max_new_tokens: int,
    context: int | None,
    *,
    reserved_by: str = "max_new_tokens",
) -> tuple[int, str]:
    """(longest prompt in tokens, how to name that limit in messages).

    A prompt plus the tokens generated after it (``max_new_tokens``; a multi-turn run passes
    ``max_total_tokens`` and names it in ``reserved_by``) must fit the model's context:
    ``max_prompt_tokens`` 0 means exactly the room the context leaves; a larger explicit value
    is an error. Models without a known context keep ``max_prompt_tokens`` (0: no limit).
    """
    named = f"max_prompt_tokens={max_prompt_tokens}"
    if context is None:
        return max_prompt_tokens, named
    room = context - max_new_tokens
    if room < 1:
        raise ValueError(
            f"{reserved_by}={max_new_tokens} leaves no room for a prompt in the model's "
            f"{context}-token context"
        )
    if max_prompt_tokens > room:
        raise ValueError(
            f"max_prompt_tokens={max_prompt_tokens} plus {reserved_by}={max_new_tokens} exceeds "
            f"the model's {context}-token context: set max_prompt_tokens <= {room} (0: {room})"
        )
    if max_prompt_tokens:
        return max_prompt_tokens, named
    return room, (
        f"the {room} tokens the model's {context}-token context leaves after "
        f"{reserved_by}={max_new_tokens}"
    )


def count_unknown(tokenizer, prompts: list[list[int]]) -> int:
    """How many encoded prompts hold the tokenizer's unknown token (characters it lacks)."""
    unk = getattr(tokenizer, "unk_token_id", None)
    # Some tokenizers name a real special token (BOS/EOS) as their unk: nothing to count there.
    if unk is None or unk in (tokenizer.bos_token_id, tokenizer.eos_token_id):
        return 0
    return sum(unk in ids for ids in prompts)


def limit_prompts(
    prompts: list[list[int]],
    max_tokens: int,
    policy: str,
    *,
    limit: str | None = None,
    what: str = "training problem",
) -> tuple[list[int], dict[int, list[int]], int, int]:
    """Apply a prompt-length limit (0 = none) to encoded prompts.

    Returns (indices kept, replacement ids for truncated prompts, n truncated, n skipped).
    ``truncate`` keeps the *last* ``max_tokens`` tokens (the end of a prompt, just before the
    answer, matters most); ``skip`` drops the problem; ``error`` raises naming the first one.
    """
    if policy not in LONG_PROMPTS:
        raise ValueError(f"long_prompts must be one of {', '.join(LONG_PROMPTS)}, got {policy!r}")
    if max_tokens <= 0:
        return list(range(len(prompts))), {}, 0, 0
    kept: list[int] = []
    replaced: dict[int, list[int]] = {}
    truncated = skipped = 0
    for i, ids in enumerate(prompts):
        if len(ids) <= max_tokens:
            kept.append(i)
        elif policy == "error":
            raise ValueError(
                f"{what} {i} has a {len(ids)}-token prompt, over "
                f"{limit or f'max_prompt_tokens={max_tokens}'} (set long_prompts to 'truncate' "
                "or 'skip' to accept such data)"
            )
        elif policy == "truncate":
            kept.append(i)
            replaced[i] = ids[-max_tokens:]
            truncated += 1
        else:
            skipped += 1
    return kept, replaced, truncated, skipped


def build_train_reward(opts: RewardOptions, task: Task):
    """The reward RL trains on: the task's reward, plus ``format_reward_weight`` x the format
    reward (answer in ``\\boxed{}`` or after ``####``) when that weight is non-zero."""
    weight = opts.format_reward_weight
    if not weight:
        return task.reward

    return combine((task.reward, 1.0), (format_reward, weight))
