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
    rows = [
        ids[m].tolist()
        for ids, m in zip(completion_ids.cpu(), completion_mask.cpu().bool(), strict=True)
    ]
    return tokenizer.batch_decode(rows, skip_special_tokens=True)
