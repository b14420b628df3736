"""The rollout pool's pure parts (no Ray): prompt shares, per-worker generators, and putting
the workers' rollouts back together in prompt order."""

from __future__ import annotations

import torch

from gspo.orchestration.ray_rollout import concat_in_order, shares, worker_generator_state
from gspo.rollout.base import Rollout


def test_shares_are_contiguous_and_balanced():
    assert shares(5, 2) == [range(0, 3), range(3, 5)]
    assert shares(4, 4) == [range(i, i + 1) for i in range(4)]
    assert shares(1, 3) == [range(0, 1)]  # idle workers get no call


def test_worker_generators():
    g = torch.Generator().manual_seed(7)
    assert torch.equal(worker_generator_state(g, 0), g.get_state())  # 1 worker == local engine
    s1, s2 = worker_generator_state(g, 1), worker_generator_state(g, 2)
    assert not torch.equal(s1, s2) and not torch.equal(s1, g.get_state())
    assert torch.equal(s1, worker_generator_state(torch.Generator().manual_seed(7), 1))
    assert not torch.equal(s1, worker_generator_state(torch.Generator().manual_seed(8), 1))


def _rollout(prompt_len: int, comp_len: int, prompts: int, n: int, fill: int) -> Rollout:
    rows = prompts * n
    return Rollout(
        prompt_ids=torch.full((rows, prompt_len), fill),
        prompt_mask=torch.ones(rows, prompt_len, dtype=torch.long),
        completion_ids=torch.full((rows, comp_len), fill),
        completion_mask=torch.ones(rows, comp_len, dtype=torch.long),
        logprobs=torch.full((rows, comp_len), -float(fill)),
        finish_reasons=["stop"] * rows,
        prompt_index=torch.arange(prompts).repeat_interleave(n),
    )


def test_concat_in_prompt_order():
    a, b = _rollout(2, 3, prompts=2, n=2, fill=5), _rollout(4, 1, prompts=1, n=2, fill=7)
    out = concat_in_order([a, b], [0, 2], pad_id=0)
    assert out.prompt_index.tolist() == [0, 0, 1, 1, 2, 2]
    assert out.prompt_ids.shape == (6, 4) and out.completion_ids.shape == (6, 3)
    assert out.prompt_ids[0].tolist() == [0, 0, 5, 5]  # prompts left-padded
    assert out.prompt_mask[0].tolist() == [0, 0, 1, 1]
    assert out.completion_ids[4].tolist() == [7, 0, 0]  # completions right-padded
    assert out.completion_mask[4].tolist() == [1, 0, 0]
    assert out.logprobs[4].tolist() == [-7.0, 0.0, 0.0]
    assert len(out.finish_reasons) == 6
