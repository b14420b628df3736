"""``gspo sft``'s context rules, as training's (``gspo.compose.prompts``): a demonstration's
prompt plus its target (the demonstration and the end token) must fit the model's context, and
a held-out prompt plus ``max_new_tokens``; a longer one is refused, truncated (the prompt's end
kept) or skipped as ``long_prompts`` says, and the counts of each split are said in one line."""

from __future__ import annotations

import sys
from typing import Any

from ..config.train import SFTConfig
from ..envs.tasks.base import Example
from ..envs.tasks.checks import EmptyHeldOutError
from .parts import context_length, prompt_token_limit
from .prompts import held_out_prompts

__all__ = ["fit_demonstrations", "sft_held_out"]


def _named(cfg: SFTConfig, task: Any, split: str) -> str:
    """How a refusal names a row: the data file's row where the problems are its rows one for
    one, else the problem's index."""
    path = cfg.train_file if split == "train" else cfg.test_file
    if cfg.task == "file" and path is not None and not task.skipped_rows and not cfg.dedupe:
        return f"{path} row"
    return "training problem" if split == "train" else "held-out problem"


def fit_demonstrations(
    cfg: SFTConfig,
    task: Any,
    demos: list[Example],
    prompts: list[list[int]],
    targets: list[list[int]],
    model: Any,
) -> tuple[list[int], dict[int, list[int]]]:
    """(indices of the demonstrations kept, truncated prompt ids by index) under the model's
    context and ``long_prompts``; ``error`` raises naming the first one over it."""
    context = context_length(model)
    if context is None:
        return list(range(len(demos))), {}
    kept: list[int] = []
    replaced: dict[int, list[int]] = {}
    truncated = skipped = 0
    for i, (ids, target) in enumerate(zip(prompts, targets, strict=True)):
        total = len(ids) + len(target)
        if total <= context:
            kept.append(i)
            continue
        if cfg.long_prompts == "error":
            raise ValueError(
                f"{_named(cfg, task, 'train')} {i} has a {len(ids)}-token prompt and a "
                f"{len(target)}-token demonstration, {total} tokens over the model's context of "
                f"{context} (set --long-prompts truncate or skip to accept such data)"
            )
        room = context - len(target)
        if cfg.long_prompts == "truncate" and room > 0 and not demos[i].images:
            kept.append(i)
            replaced[i] = ids[-room:]
            truncated += 1
        else:
            skipped += 1
    if not kept:
        raise ValueError(f"no demonstration fits the model's context of {context} tokens")
    if truncated or skipped:
        print(
            f"data: {truncated} training prompts truncated, {skipped} skipped (prompt + "
            f"demonstration over the context of {context}); {len(kept)} demonstrations left",
            file=sys.stderr,
            flush=True,
        )
    return kept, replaced


def sft_held_out(cfg: SFTConfig, task: Any, fmt: Any, model: Any) -> list[Example]:
    """The held-out problems SFT scores at its end, under the context rule (prompt plus
    ``max_new_tokens``) and ``long_prompts``, their counts in one line."""
    if not task.test:
        return []
    limit, named = prompt_token_limit(0, cfg.max_new_tokens, context_length(model))
    kept, truncated, skipped = held_out_prompts(
        task.test, fmt, limit, named, cfg.long_prompts, _named(cfg, task, "test")
    )
    if not kept:
        raise EmptyHeldOutError(
            f"the held-out set is empty: all {len(task.test)} held-out prompts are over {named} "
            f"and long_prompts={cfg.long_prompts!r} leaves them out (n_test 0 skips the score)"
        )
    if truncated or skipped:
        print(
            f"data: {truncated} held-out prompts truncated, {skipped} skipped (over {named}); "
            f"{len(kept)} held-out problems left",
            file=sys.stderr,
            flush=True,
        )
    return kept
