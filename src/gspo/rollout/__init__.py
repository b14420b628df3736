"""Rollout engines: sample completions together with their per-token log-probs.

``SamplingParams``, ``GenerationRequest``, ``Rollout`` and the ``RolloutEngine`` protocol live in
``base`` and are cheap to import; the torch engine is ``gspo.rollout.torch_engine.TorchEngine``
(it imports transformers, which the protocol does not need).
"""

from gspo.rollout.base import GenerationRequest, Rollout, RolloutEngine, SamplingParams

__all__ = ["GenerationRequest", "Rollout", "RolloutEngine", "SamplingParams"]
