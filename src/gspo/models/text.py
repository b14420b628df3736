"""Token ids <-> text at the trainer's edges: prompt encoding, completion decoding."""

from __future__ import annotations

import torch


def encode_prompts(tokenizer, prompts: list[str]) -> list[list[int]]:
    """Token ids of each prompt (special tokens such as <bos> included), no padding."""
    return [list(ids) for ids in tokenizer(prompts, add_special_tokens=True)["input_ids"]]


def decode_completions(
    tokenizer, completion_ids: torch.Tensor, completion_mask: torch.Tensor
) -> list[str]:
    """Completion texts without padding and special tokens (EOS is not part of the answer)."""
    # One host copy of each tensor, then plain lists: indexing every row as a tensor costs
    # several ops per row (~1k ops per 128-row rollout).
    keep = completion_mask.cpu().bool().tolist()  # [N][L]
    rows = [
        [t for t, k in zip(ids, m, strict=True) if k]
        for ids, m in zip(completion_ids.cpu().tolist(), keep, strict=True)
    ]
    return tokenizer.batch_decode(rows, skip_special_tokens=True)
