"""Helpers shared by test_rollout.py and the files split from it.

Imported by name: pytest puts tests/ on sys.path.
"""

from __future__ import annotations

import pytest
import torch

from gspo.models.char_tokenizer import EOS_ID, PAD_ID, build_char_tokenizer
from gspo.models.logprobs import token_logprobs
from gspo.models.tiny_model import build_tiny_model
from gspo.rollout import Rollout
from gspo.rollout.torch_engine import TorchEngine

PROMPT_TEXTS = ["12+3=", "7=", "100-99=", "ab cd"]


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def prompts(tok):
    return [tok(t)["input_ids"] for t in PROMPT_TEXTS]


@pytest.fixture(scope="module")
def model64(tok):
    return build_tiny_model(len(tok), hidden_size=32, num_layers=2, seed=11).double()


def _engine(model, tok=None, **kw) -> TorchEngine:
    return TorchEngine(model, pad_id=PAD_ID, eos_id=EOS_ID, tokenizer=tok, **kw)


def _rescore(model, r: Rollout, temperature: float) -> torch.Tensor:
    with torch.no_grad():
        lp, _ = token_logprobs(
            model,
            r.prompt_ids,
            r.prompt_mask,
            r.completion_ids,
            r.completion_mask,
            temperature=temperature,
        )
    return lp  # [N, L]
