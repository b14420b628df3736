"""Helpers shared by test_envs.py and the files split from it.

Imported by name: pytest puts tests/ on sys.path.
"""

from __future__ import annotations

import torch

from gspo.models.char_tokenizer import build_char_tokenizer
from gspo.rollout.base import Rollout

TOK = build_char_tokenizer()


class ScriptedEngine:
    """Answers each context with the next scripted turn (by how many turns it already holds)."""

    def __init__(self, turns: list[str], logprob: float = -0.5) -> None:
        self.turns = turns
        self.logprob = logprob
        self.calls = 0

    def generate(self, request) -> Rollout:
        prompts, n, params = request.prompts, request.n, request.params
        self.calls += 1
        rows = []
        for p in prompts:
            for _ in range(n):
                text = self.turns[min(self.calls - 1, len(self.turns) - 1)]
                ids = TOK(text, add_special_tokens=False)["input_ids"] + [TOK.eos_token_id]
                if text.endswith(("]]", " ")):
                    ids = ids[:-1]  # a stop string ends the turn, no EOS
                cut = ids[: params.max_new_tokens]
                rows.append((p, cut, "stop" if len(cut) == len(ids) else "length"))
        width = max(len(r[1]) for r in rows)
        ids = torch.zeros((len(rows), width), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, (_, c, _) in enumerate(rows):
            ids[i, : len(c)] = torch.tensor(c)
            mask[i, : len(c)] = 1
        return Rollout(
            prompt_ids=torch.ones((len(rows), 1), dtype=torch.long),
            prompt_mask=torch.ones((len(rows), 1), dtype=torch.long),
            completion_ids=ids,
            completion_mask=mask,
            logprobs=mask * self.logprob,
            finish_reasons=[r[2] for r in rows],
            prompt_index=torch.arange(len(rows)) // n,
        )
