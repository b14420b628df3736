"""Rollout engines: sample completions together with their per-token log-probs.

``SamplingParams``, ``Rollout`` and the ``RolloutEngine`` protocol live in ``base`` and are cheap
to import; ``TorchEngine`` (plain PyTorch + transformers) is imported on first use so that
importing the protocol does not pull in transformers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gspo.rollout.base import Rollout, RolloutEngine, SamplingParams

if TYPE_CHECKING:
    from gspo.rollout.torch_engine import TorchEngine

__all__ = ["Rollout", "RolloutEngine", "SamplingParams", "TorchEngine"]


def __getattr__(name: str) -> Any:
    if name == "TorchEngine":
        from gspo.rollout.torch_engine import TorchEngine

        return TorchEngine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
