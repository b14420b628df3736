"""The context rules of a run's prompts, the same in training and in ``gspo eval``: a prompt
plus what is generated after it must fit the model's context (``max_prompt_tokens`` 0: all the
room it leaves), and a longer prompt is refused, truncated or skipped as ``long_prompts`` says.

What is generated after a prompt: ``max_new_tokens`` for one-turn tasks; for multi-turn
episodes ``max_total_tokens`` (every policy and environment token after the prompt).
Held-out prompts follow the same rule: ``truncate`` keeps the end of a long one (its text is
cut, so that a chat template stays whole and evaluation encodes it as usual), ``skip`` leaves
it out; both are counted, and a held-out set left empty stops the run.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence

from ..config.eval_config import EvalConfig
from ..config.options_task import TaskOptions
from ..config.train import TrainConfig
from ..envs.tasks.base import Example
from ..envs.tasks.checks import EmptyHeldOutError
from ..envs.tasks.reading import SKIPPED_METRICS
from ..models.chat import encode_examples
from .parts import context_length, count_unknown, limit_prompts, prompt_token_limit

__all__ = ["eval_prompt_rules", "fit_text", "prepare_prompts", "run_prompt_limit"]


def run_prompt_limit(
    max_prompt_tokens: int, max_new_tokens: int, max_total_tokens: int, multi_turn: bool, model
) -> tuple[int, str]:
    """(longest prompt, its name in messages): the context's room after ``max_new_tokens``, or
    after ``max_total_tokens`` for multi-turn episodes (their whole budget after the prompt)."""
    if multi_turn:
        return prompt_token_limit(
            max_prompt_tokens,
            max_total_tokens,
            context_length(model),
            reserved_by="max_total_tokens",
        )
    return prompt_token_limit(max_prompt_tokens, max_new_tokens, context_length(model))


def fit_text(fmt, prompt: str, limit: int) -> str | None:
    """The longest end of ``prompt`` whose encoding (``fmt``: template and special tokens
    included) has at most ``limit`` tokens; None when no character of it fits. Cut on
    text, not ids, so the result encodes as any prompt does (a chat template stays whole)."""
    if len(fmt.encode([prompt])[0]) <= limit:
        return prompt
    if len(fmt.encode([""])[0]) > limit:
        return None
    lo, hi = 1, len(prompt)  # prompt[hi:] fits, prompt[lo - 1:] does not: find the first start
    while lo < hi:
        mid = (lo + hi) // 2
        if len(fmt.encode([prompt[mid:]])[0]) <= limit:
            hi = mid
        else:
            lo = mid + 1
    return prompt[hi:] or None  # (nothing of the prompt left: no problem to pose)


def held_out_prompts(
    examples: Sequence[Example], fmt, limit: int, named: str, policy: str, what: str
) -> tuple[list[Example], int, int]:
    """(held-out problems within ``limit``, n truncated, n skipped) under ``policy``
    (``long_prompts``); ``error`` raises naming ``what`` (e.g. "data/test.jsonl row"), the row
    and its length."""
    encoded, _ = encode_examples(fmt, examples)
    # 'truncate' is applied on the text below; here it only marks which prompts are long.
    kept, *_ = limit_prompts(
        encoded, limit, "error" if policy == "error" else "skip", limit=named, what=what
    )
    out: list[Example] = []
    truncated = skipped = 0
    short = set(kept)
    for i, example in enumerate(examples):
        if i in short:
            out.append(example)
            continue
        # (An image prompt is not cut: its placeholders and image tokens must stay whole.)
        cut = policy == "truncate" and not example.images
        text = fit_text(fmt, example.prompt, limit) if cut else None
        if text is None:
            skipped += 1
        else:
            out.append(dataclasses.replace(example, prompt=text))
            truncated += 1
    return out, truncated, skipped


def _rows(cfg: TrainConfig, task, split: str) -> str:
    """How a refusal names a row of ``split``: the data file's row where the problems are the
    file's rows one for one (nothing skipped or deduplicated), else the problem's index."""
    path = cfg.task.train_file if split == "train" else cfg.task.test_file
    dropped = task.skipped_rows or (cfg.task.dedupe and any(task.data_checks.values()))
    if cfg.task.task == "file" and path is not None and not dropped:
        return f"{path} row"
    return "training problem" if split == "train" else "held-out problem"


def prepare_prompts(cfg: TrainConfig, task, fmt, tokenizer, model, multi_turn: bool = False):
    """(train problems, their prompt token ids, held-out problems, ``data/*`` counts): prompts
    over the context limit truncated, skipped or refused as ``long_prompts`` says."""
    # Image prompts: every image is read and processed here, before training (a bad one stops
    # the run now, naming it); their pixel inputs are made again per step, for the step's prompts.
    encoded, _ = encode_examples(fmt, task.train)
    # A prompt and what follows it must fit the model's context (max_prompt_tokens 0: all of it).
    limit, named = run_prompt_limit(
        cfg.task.max_prompt_tokens,
        cfg.rollout.max_new_tokens,
        cfg.task.max_total_tokens,
        multi_turn,
        model,
    )
    kept, replaced, n_truncated, n_skipped = limit_prompts(
        encoded, limit, cfg.task.long_prompts, limit=named, what=_rows(cfg, task, "train")
    )
    if not kept:
        raise ValueError(f"no training problem has a prompt within {named}")
    train_set = [task.train[i] for i in kept]
    prompt_cache = [replaced.get(i, encoded[i]) for i in kept]
    test_set, test_truncated, test_skipped = held_out_prompts(
        task.test, fmt, limit, named, cfg.task.long_prompts, _rows(cfg, task, "test")
    )
    if task.test and not test_set and cfg.run.eval_every > 0:
        way_out = "truncate" if cfg.task.long_prompts == "skip" else "a shorter chat template"
        raise EmptyHeldOutError(
            f"the held-out set is empty: all {len(task.test)} held-out prompts are over {named} "
            f"and long_prompts={cfg.task.long_prompts!r} leaves them out (use shorter held-out "
            f"prompts, a larger limit or {way_out}; eval_every 0 runs without evaluation)"
        )
    if n_truncated or n_skipped:  # (the held-out split's line below: one line per split)
        print(
            f"data: {n_truncated} training prompts truncated, {n_skipped} skipped (over "
            f"{named}); {len(train_set)} training problems left",
            file=sys.stderr,
            flush=True,
        )
    if test_truncated or test_skipped:
        print(
            f"data: {test_truncated} held-out prompts truncated, {test_skipped} skipped "
            f"(over {named}); {len(test_set)} held-out problems left",
            file=sys.stderr,
            flush=True,
        )
    data = {
        "data/train_problems": len(train_set),
        "data/test_problems": len(test_set),
        "data/prompts_truncated": n_truncated,
        "data/prompts_skipped": n_skipped,
        "data/test_prompts_truncated": test_truncated,
        "data/test_prompts_skipped": test_skipped,
        "data/prompts_with_unknown_chars": count_unknown(tokenizer, encoded),
        "data/skipped_rows": len(task.skipped_rows),
        **{SKIPPED_METRICS[kind]: n for kind, n in task.skipped_kinds.items()},
        **task.data_checks,
    }
    return train_set, prompt_cache, test_set, data


def eval_prompt_rules(
    cfg: EvalConfig, examples: list[Example], fmt, model, where: str, multi_turn: bool = False
) -> tuple[list[Example], dict[str, int]]:
    """``gspo eval``'s problems under training's context rules (``max_prompt_tokens``,
    ``long_prompts``; ``max_total_tokens`` for multi-turn episodes): (problems kept, counts for
    the report). Refusal names the file or task, the row and its length; a set left empty is an
    error; truncated and skipped rows are counted and said on stderr."""
    task = TaskOptions.of(cfg)  # eval's own fields where it has them, training's defaults else
    limit, named = run_prompt_limit(
        task.max_prompt_tokens, cfg.max_new_tokens, task.max_total_tokens, multi_turn, model
    )
    what = f"{cfg.data} row" if cfg.data else f"task {cfg.task} held-out problem"
    kept, truncated, skipped = held_out_prompts(
        examples, fmt, limit, named, task.long_prompts, what
    )
    if not kept:
        raise EmptyHeldOutError(
            f"nothing to evaluate: all {len(examples)} problems of {where} are over {named} and "
            f"long_prompts={task.long_prompts!r} leaves them out"
        )
    if truncated or skipped:
        print(
            f"data: {truncated} prompts truncated, {skipped} skipped (over {named}); "
            f"{len(kept)} of {len(examples)} problems scored",
            file=sys.stderr,
            flush=True,
        )
    counts = {"prompts_truncated": truncated, "prompts_skipped": skipped, "prompt_limit": limit}
    return kept, counts
