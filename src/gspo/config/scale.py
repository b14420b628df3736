"""Scale-out config fields (backend, ranks, rollout workers, Ray cluster, placement) and their
checks: plain data (imports nothing else of gspo).

``ScaleFields`` is a base of ``TrainConfig`` (flat fields, each with a doc, shown by
``--help``; the CLI flags ``--backend``, ``--trainer-workers``, ... come from them). Their
checks are ``BackendOptions.problems`` (gspo.config.options) and, across components,
``gspo.config.combinations``; ``gspo.compose.ray_check.check_backend_available``
checks the machine (Ray installed, the cluster reachable) before any work.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

BACKENDS = ("local", "ray")
PLACEMENTS = ("colocated", "separate")
REWARD_PLACEMENTS = ("auto", "driver", "ray")


def _doc(text: str, default: Any) -> Any:
    return dataclasses.field(default=default, metadata={"doc": text})


@dataclass
class ScaleFields:
    """Where training and rollout run: this process, or Ray actors on one machine or a cluster."""

    backend: str = _doc(
        "Training backend: 'local' (this process, CPU or one GPU) or 'ray' (trainer_workers "
        "FSDP2 ranks and rollout_workers engines as Ray actors; needs the ray extra: pip "
        "install 'gspo[ray]'). Both run the same loop and give the same metrics.",
        "local",
    )
    trainer_workers: int = _doc(
        "backend='ray': FSDP2 training ranks (data parallel, sharded weights and optimizer; "
        "gloo on CPU, NCCL on GPU); each takes its share of every minibatch.",
        1,
    )
    rollout_workers: int = _doc(
        "backend='ray': rollout engines as Ray actors, each sampling its share of the prompts "
        "and receiving the new weights after every update; 0: one engine in the driver.",
        0,
    )
    ray_address: str | None = _doc(
        "backend='ray': address of an existing Ray cluster (e.g. 'ray://head:10001', "
        "'head:6379' or 'auto'); None: start a private local Ray for this run.",
        None,
    )
    placement: str = _doc(
        "backend='ray': 'colocated' (rank i and rollout worker i share a bundle: the same "
        "CPUs/GPU) or 'separate' (training and rollout in their own placement groups).",
        "separate",
    )

    reward_placement: str = _doc(
        "Where rewards are scored: 'driver' (this process, reward_workers threads), 'ray' "
        "(backend='ray': the batch cut into reward_workers chunks, one Ray task of 1 CPU "
        "each, on the cluster's free CPUs; a private local Ray gets reward_workers more "
        "CPUs) or 'auto' ('ray' for sandboxed rewards such as the code task's on "
        "backend='ray', else 'driver': a cheap reward loses to a task's overhead).",
        "auto",
    )

    fsdp_param_dtype: str | None = _doc(
        "backend='ray': FSDP2 mixed precision: the dtype the ranks all-gather and compute in "
        "('bfloat16' or 'float16'; gradients are reduced in float32 and the sharded master "
        "weights keep dtype); None: compute in dtype.",
        None,
    )
    activation_checkpointing: bool = _doc(
        "backend='ray': recompute each decoder layer's activations in the backward pass "
        "(less memory, one more forward per layer; the gradients are the same).",
        False,
    )
