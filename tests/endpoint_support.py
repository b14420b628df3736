"""Helpers shared by the endpoint tests (test_endpoint*.py). Imported by name: pytest puts
tests/ on sys.path."""

from __future__ import annotations

import torch

from gspo.models.char_tokenizer import EOS_ID, PAD_ID, build_char_tokenizer
from gspo.models.logprobs import token_logprobs
from gspo.models.tiny_model import build_tiny_model
from gspo.rollout.torch_engine import TorchEngine

TEMPERATURE = 0.7
TOLERANCE = 1e-10
"""The engine contract's tolerance (tests/test_engine_contract.py): float64 engine and trainer."""

TOK = build_char_tokenizer()


def float64_policy() -> tuple[torch.nn.Module, TorchEngine]:
    """A tiny float64 model and a torch engine over its own copy of the weights."""
    model = build_tiny_model(
        len(TOK), hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, seed=3
    ).to(torch.float64)
    engine = TorchEngine(model, pad_id=PAD_ID, eos_id=EOS_ID, share_weights=False)
    return model, engine


def recompute(model, prompt: list[int], completion: list[int]) -> torch.Tensor:  # [L]
    """The trainer's log-probs of ``completion`` after ``prompt``."""
    p = torch.tensor([prompt])  # [1, P]
    c = torch.tensor([completion])  # [1, L]
    with torch.no_grad():
        lp, _ = token_logprobs(
            model, p, torch.ones_like(p), c, torch.ones_like(c), temperature=TEMPERATURE
        )
    return lp[0]
