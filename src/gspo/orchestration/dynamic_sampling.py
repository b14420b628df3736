"""DAPO dynamic sampling (arXiv 2503.14476, §3.2): keep only groups whose rewards differ.

A group whose G rewards are all equal has advantage 0 on every sample (group normalization), so
it adds nothing to the policy gradient but still dilutes the batch's denominators. Dynamic
sampling drops such groups and samples more prompts, round after round, until the step has
``prompts_per_step`` informative groups. Rounds are bounded (``dynamic_sampling_rounds``); when the
bound is hit the step trains on the informative groups it has (a warning says so), or, with none
at all, on the last round unfiltered (every advantage 0: a zero gradient, as without the filter).

Round 0 uses the step's usual prompts and sampling generator, so a step whose first round keeps
every group is exactly the step without dynamic sampling. Later rounds draw their prompts and
samples from generators seeded by (seed, step, round): a resumed run replays them exactly.

Logged per step: ``data/groups_filtered`` (groups dropped over all rounds) and
``data/oversample_rounds`` (rounds beyond the first).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch

from gspo.rollout.base import PIXEL_INDEX, PIXELS, ROW_EXTRAS, Rollout, RolloutBatch


def informative_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """[n_groups] bool: groups whose rewards are not all equal (exact comparison)."""
    groups = rewards.view(-1, group_size)  # [n_groups, G]
    return ~(groups == groups[:, :1]).all(dim=1)  # [n_groups]


def round_generator(seed: int, step: int, round_: int, device: torch.device) -> torch.Generator:
    """The generator of dynamic-sampling round ``round_`` >= 1 of ``step`` (prompts, samples)."""
    g = torch.Generator(device=device)
    g.manual_seed(((seed * 1_000_003 + step) * 16 + 5) * 1009 + round_)
    return g


def round_prompts(n_examples: int, batch: int, seed: int, step: int, round_: int) -> list[int]:
    """Training-problem indices of an extra round: a fresh random draw without replacement."""
    g = round_generator(seed, step, round_, torch.device("cpu"))
    perm = torch.randperm(n_examples, generator=g)  # [n_examples]
    reps = -(-batch // n_examples)  # a small train set repeats
    return perm.repeat(reps)[:batch].tolist()


def select_groups(s: RolloutBatch, groups: torch.Tensor, group_size: int) -> RolloutBatch:
    """The rows of the listed groups, in order."""
    rows = (groups[:, None] * group_size + torch.arange(group_size)).reshape(-1)  # [n * G]
    # Image prompts' pixels are per prompt and stay whole (Rollout.select keeps them).
    if set(s.rollout.extras) - set(ROW_EXTRAS) - {PIXELS}:
        raise ValueError(
            "dynamic_sampling cannot split a rollout that carries engine extras (MoE routing): "
            "turn dynamic_sampling off for MoE models"
        )
    return s.select(rows)


def _pad_cols(t: torch.Tensor, width: int, value: float, left: bool) -> torch.Tensor:
    extra = width - t.shape[1]
    if extra == 0:
        return t
    pad = torch.full((t.shape[0], extra), value, dtype=t.dtype, device=t.device)
    return torch.cat([pad, t] if left else [t, pad], dim=1)


def concat(parts: list[RolloutBatch], pad_id: int) -> RolloutBatch:
    """Rows of several rounds in one rollout: prompts left-padded and completions right-padded
    to the widest; prompt indices offset so that groups of different rounds stay apart."""
    if len(parts) == 1:
        return parts[0]
    p_width = max(p.rollout.prompt_ids.shape[1] for p in parts)
    c_width = max(p.rollout.completion_ids.shape[1] for p in parts)
    cols: dict[str, list[torch.Tensor]] = {k: [] for k in ("pi", "pm", "ci", "cm", "lp", "ix")}
    offset = 0
    for p in parts:
        r = p.rollout
        cols["pi"].append(_pad_cols(r.prompt_ids, p_width, pad_id, left=True))
        cols["pm"].append(_pad_cols(r.prompt_mask, p_width, 0, left=True))
        cols["ci"].append(_pad_cols(r.completion_ids, c_width, pad_id, left=False))
        cols["cm"].append(_pad_cols(r.completion_mask, c_width, 0, left=False))
        cols["lp"].append(_pad_cols(r.logprobs, c_width, 0.0, left=False))
        cols["ix"].append(r.prompt_index + offset)
        if PIXELS in r.extras and PIXEL_INDEX not in r.extras:  # kept whole by select: index
            # past all of its prompts (episodes' pixels are indexed by pixel_index instead)
            offset += r.extras[PIXELS].num_prompts
        else:
            offset += int(r.prompt_index.max()) + 1 if r.num_samples else 0
    rollout = Rollout(
        prompt_ids=torch.cat(cols["pi"]),
        prompt_mask=torch.cat(cols["pm"]),
        completion_ids=torch.cat(cols["ci"]),
        completion_mask=torch.cat(cols["cm"]),
        logprobs=torch.cat(cols["lp"]),
        finish_reasons=[f for p in parts for f in p.rollout.finish_reasons],
        prompt_index=torch.cat(cols["ix"]),
    )
    rs = [p.rollout for p in parts]
    if any(r.loss_mask is not None for r in rs):  # episodes: environment tokens get no loss
        masks = [r.policy_mask for r in rs]
        rollout.loss_mask = torch.cat([_pad_cols(m, c_width, 0, left=False) for m in masks])
    for key, pad in ROW_EXTRAS.items():
        if key in rs[0].extras:
            values = [r.extras[key] for r in rs]
            if pad is not None:  # [n, L] per token
                values = [_pad_cols(v, c_width, pad, left=False) for v in values]
            if key == PIXEL_INDEX:  # episodes' own pixel entries: offset as the pixels join
                starts = torch.tensor([0, *(r.extras[PIXELS].num_prompts for r in rs)]).cumsum(0)
                values = [v + int(s) for v, s in zip(values, starts.tolist(), strict=False)]
            rollout.extras[key] = torch.cat(values)
    if PIXELS in rs[0].extras:  # image prompts: their pixels, in the offset prompt order
        pixels = [r.extras[PIXELS] for r in rs]  # PixelInputs, or QwenPixelInputs (Qwen2.5-VL)
        rollout.extras[PIXELS] = type(pixels[0]).cat(pixels)
    if all(r.versions is not None for r in rs):  # per-token policy versions, -1 on padding
        rollout.versions = torch.cat([_pad_cols(r.versions, c_width, -1, left=False) for r in rs])
    has_task = all(p.task_rewards is not None for p in parts)
    return RolloutBatch(
        rollout,
        torch.cat([p.rewards for p in parts]),
        sum(p.reward_errors for p in parts),
        torch.cat([p.task_rewards for p in parts]) if has_task else None,
        trajectories=[t for p in parts for t in p.trajectories],
    )


def fill_batch(
    sample_round: Callable[[int], RolloutBatch],
    *,
    target_groups: int,
    group_size: int,
    max_rounds: int,
    pad_id: int,
    groups_multiple: int = 1,
    step: int = 0,
) -> tuple[RolloutBatch, dict[str, float]]:
    """Call ``sample_round(k)`` for k = 0, 1, ... keeping informative groups until there are
    ``target_groups`` (the extra ones of the last round are cut) or ``max_rounds`` rounds ran.

    ``groups_multiple``: a shortfall batch is cut to a multiple of it (whole-group minibatches
    need the group count to split evenly), never below one multiple when one exists.
    Returns the batch and its metrics.
    """
    kept: list[RolloutBatch] = []
    n_kept = 0
    filtered = 0
    rounds = 0
    last: RolloutBatch | None = None
    while n_kept < target_groups and rounds < max_rounds:
        last = sample_round(rounds)
        rounds += 1
        good = informative_groups(last.rewards, group_size).nonzero().flatten()  # [n_good]
        filtered += last.rewards.shape[0] // group_size - len(good)
        good = good[: target_groups - n_kept]
        if len(good):
            kept.append(select_groups(last, good, group_size))
            n_kept += len(good)
    metrics = {"data/groups_filtered": float(filtered), "data/oversample_rounds": float(rounds - 1)}
    if n_kept >= target_groups:
        return concat(kept, pad_id), metrics
    assert last is not None
    usable = n_kept - n_kept % groups_multiple
    warnings.warn(
        f"dynamic sampling, step {step + 1}: {n_kept} of {target_groups} groups had differing "
        f"rewards after {rounds} rounds (dynamic_sampling_rounds={max_rounds}); training on "
        + (f"{usable} of them" if usable else "the last round unfiltered (zero advantages)"),
        RuntimeWarning,
        stacklevel=2,
    )
    metrics["data/dynamic_sampling_short"] = 1.0
    if usable == 0:
        return last, metrics
    batch = concat(kept, pad_id)
    groups = torch.arange(usable)
    return select_groups(batch, groups, group_size), metrics
