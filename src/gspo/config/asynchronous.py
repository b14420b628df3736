"""Asynchronous-RL config fields (``max_staleness``, ``async_partial``, ``async_chunk_tokens``).

``AsyncFields`` is a base of ``TrainConfig``. Its checks: ``AsyncOptions.problems``
(gspo.config.options) and, across components, ``gspo.config.combinations``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .fields import _doc

PARTIAL_MODES = ("keep", "mask", "restart")


@dataclass
class AsyncFields:
    """Rollouts running ahead of training (gspo.orchestration.async_source)."""

    max_staleness: int = _doc(
        "K, the most policy versions a training sample may lag behind the trainer. 0: the "
        "synchronous loop (generate, then train, bit for bit as without this field). K >= 1: a "
        "rollout thread with its own copy of the weights generates the batches of upcoming "
        "steps while the trainer trains; a sample is admitted only if the weights that "
        "generated its oldest token are at most K updates old (async/* metrics). Local backend "
        "(torch engine: new weights enter at any token; vLLM: at chunk boundaries, and the "
        "evaluation runs a torch engine) or backend='ray' (rollout workers, torch or vLLM, new "
        "weights entering at chunk boundaries); single-turn tasks and multi-turn episodes (also "
        "at turn boundaries); no dynamic_sampling.",
        0,
    )
    async_partial: str = _doc(
        "What a generation does when new weights arrive mid-way (max_staleness >= 1): 'keep' "
        "continues under the new weights, each token keeping the log-prob of the weights that "
        "made it (the behaviour policy, so the loss ratio is the true importance ratio); "
        "'mask' also continues but drops the tokens made before the newest version from the "
        "loss (slime-style); 'restart' starts the step's batch again under the new weights.",
        "keep",
    )
    async_chunk_tokens: int = _doc(
        "max_staleness >= 1 on the Ray rollout workers or a local vLLM engine: the most new "
        "tokens per generation call; new weights reach a running generation at these chunk "
        "boundaries (each chunk continues from prompt + tokens so far). 0: the whole generation "
        "in one call (versions per sample, no pause). A local torch engine pauses at any token.",
        8,
    )
