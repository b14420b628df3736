"""The Ray backend's parts: the Ray session, placement groups, FSDP2 ranks and rollout workers.

Placement (``cfg.backend.placement``):

- ``separate``: the N training ranks in one placement group and the M rollout workers in
  another, one bundle each (1 CPU, or 1 GPU on CUDA);
- ``colocated``: max(N, M) bundles; rank i and rollout worker i share bundle i (half its CPU
  or GPU each), as verl's hybrid engine shares devices between training and rollout. With
  vLLM on CUDA the engines sleep through each update and wake before the weight sync
  (:func:`attach_sleeper`; never run on a GPU).

A local Ray is started for the run (a private temp dir, as many logical CPUs as the bundles
need) unless ``ray_address`` names a cluster; the backend shuts down what this run started.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from gspo.config.combinations import Options

from ..backend.ray_backend import RayFSDPBackend, refuse_unsupported
from ..backend.ray_cluster import import_ray, start_ray, stop_ray
from ..rollout.engines import close_engine, colocated_sleep, policy_engine
from .ray_rewards import RayScorer
from .ray_rollout import RolloutPool

READY_TIMEOUT_S = 60.0


def _cuda(cfg: Options) -> bool:
    return cfg.run.device.startswith("cuda") or (
        cfg.run.device == "auto" and torch.cuda.is_available()
    )


def placement_options(ray: Any, cfg: Options) -> tuple[list[dict], list[dict], list[Any]]:
    """(options of each training rank, of each rollout worker, the placement groups)."""
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    n, m = cfg.backend.trainer_workers, cfg.backend.rollout_workers
    unit = {"GPU": 1} if _cuda(cfg) else {"CPU": 1}

    def wait(pg: Any, what: str) -> Any:
        ready, _ = ray.wait([pg.ready()], timeout=READY_TIMEOUT_S)
        if not ready:
            raise RuntimeError(
                f"Ray cannot place {what} within {READY_TIMEOUT_S:.0f} s: the cluster lacks "
                f"the resources ({unit} per bundle; cluster: {ray.cluster_resources()})"
            )
        return pg

    def on(pg: Any, i: int, share: float) -> dict:
        strategy = PlacementGroupSchedulingStrategy(
            placement_group=pg, placement_group_bundle_index=i
        )
        res = {"num_gpus": share, "num_cpus": 0} if "GPU" in unit else {"num_cpus": share}
        return {"scheduling_strategy": strategy, **res}

    if cfg.backend.placement == "colocated":
        pg = wait(placement_group([dict(unit)] * max(n, m), strategy="PACK"), "the bundles")
        return [on(pg, i, 0.5) for i in range(n)], [on(pg, i, 0.5) for i in range(m)], [pg]
    train_pg = wait(placement_group([dict(unit)] * n, strategy="PACK"), f"{n} training ranks")
    groups = [train_pg]
    rollout: list[dict] = []
    if m:
        roll_pg = wait(placement_group([dict(unit)] * m, strategy="PACK"), f"{m} rollout workers")
        groups.append(roll_pg)
        rollout = [on(roll_pg, i, 1.0) for i in range(m)]
    return [on(train_pg, i, 1.0) for i in range(n)], rollout, groups


def build_ray_parts(
    cfg: Options,
    model: torch.nn.Module,
    tokenizer: Any,
    output_dir: Any,
    temp_dir: str | None = None,
    reward_cpus: int = 0,
) -> tuple[RayFSDPBackend, Any]:
    """(backend, rollout engine) for ``backend='ray'``: the engine is a :class:`RolloutPool`
    with rollout_workers >= 1, else an engine in the driver sharing the driver's weights.
    ``reward_cpus``: CPUs a private local Ray gets beyond the bundles, for reward tasks."""
    refuse_unsupported(cfg, model)  # before Ray starts
    owns = not import_ray().is_initialized()
    n, m = cfg.backend.trainer_workers, cfg.backend.rollout_workers
    bundles = max(n, m) if cfg.backend.placement == "colocated" else n + m
    ray = start_ray(cfg.backend.ray_address, num_cpus=bundles + reward_cpus, temp_dir=temp_dir)
    groups: list[Any] = []
    pool = None
    try:
        trainer_opts, rollout_opts, groups = placement_options(ray, cfg)
        out = str(output_dir)
        if m:
            pool = RolloutPool(
                ray, cfg, model, tokenizer.pad_token_id, m, rollout_opts, output_dir=out
            )
            engine: Any = pool
        else:
            engine = policy_engine(cfg, model, tokenizer)
        backend = RayFSDPBackend(cfg, model, n, actor_options=trainer_opts, output_dir=out)
    except BaseException:
        if pool is not None:
            pool.close()
        _release(ray, groups, owns)
        raise
    backend.owns_ray = False
    backend.after_close = lambda: _release(ray, groups, owns)
    attach_sleeper(backend, engine, cfg)
    return backend, engine


def attach_sleeper(backend: Any, engine: Any, cfg: Options) -> None:
    """Colocated vLLM on CUDA: the engine sleeps through each update and wakes before the
    weight sync (``RayFSDPBackend.update`` / ``push_weights``); elsewhere nothing."""
    backend.sleeper = engine if colocated_sleep(cfg) else None


def ray_scorer(
    backend: RayFSDPBackend, engine: Any, tasks: int, reward_fns: tuple
) -> RayScorer | None:
    """Reward scoring in ``tasks`` Ray tasks on the backend's Ray (None: 0 tasks, score in the
    driver); an unpicklable reward closes the engine and the backend and raises, naming it."""
    if tasks < 1:
        return None
    try:
        return RayScorer(backend.ray, tasks, reward_fns)
    except BaseException:
        try:
            close_engine(engine)
        finally:
            backend.close()
        raise


def _release(ray: Any, groups: list[Any], owns: bool) -> None:
    from ray.util.placement_group import remove_placement_group

    if not ray.is_initialized():
        return
    for pg in groups:
        with contextlib.suppress(Exception):  # gone with a dead cluster: nothing left to free
            remove_placement_group(pg)
    if owns:
        stop_ray(ray)
