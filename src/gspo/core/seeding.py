"""Seeding helpers: one generator per (seed, step, stream), so resumed runs replay exactly.

They live beside the core so that evaluation, the update and the loop share them without
importing each other.
"""

from __future__ import annotations

import torch


def step_generator(seed: int, step: int, stream: int, device: torch.device) -> torch.Generator:
    """A generator for one purpose (stream) of one step: independent of everything before it."""
    g = torch.Generator(device=device)
    g.manual_seed((seed * 1_000_003 + step) * 16 + stream)
    return g


def prompt_indices(n_examples: int, step: int, batch: int, seed: int) -> list[int]:
    """Which training problems step ``step`` uses: epoch-wise shuffles, deterministic from seed."""
    out: list[int] = []
    pos = step * batch
    while len(out) < batch:
        epoch, offset = divmod(pos, n_examples)
        perm = torch.randperm(
            n_examples, generator=torch.Generator().manual_seed(seed * 7919 + epoch)
        )
        take = min(batch - len(out), n_examples - offset)
        out += perm[offset : offset + take].tolist()
        pos += take
    return out
