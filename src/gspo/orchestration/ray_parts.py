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
import sys
from typing import Any

import torch

from gspo.config.fields import ConfigError
from gspo.config.train import TrainConfig

from ..backend.ray_backend import RayFSDPBackend, refuse_unsupported
from ..backend.ray_cluster import import_ray, start_ray, stop_ray
from ..rollout.engines import close_engine, colocated_sleep, policy_engine
from .ray_rewards import RayScorer
from .ray_rollout import RolloutPool

READY_TIMEOUT_S = 60.0


def _cuda(cfg: TrainConfig) -> bool:
    return cfg.run.device.startswith("cuda") or (
        cfg.run.device == "auto" and torch.cuda.is_available()
    )


def placement_options(ray: Any, cfg: TrainConfig) -> tuple[list[dict], list[dict], list[Any]]:
    """(options of each training rank, of each rollout worker, the placement groups). A
    request the cluster cannot hold is refused in one line before any group is made; one that
    waits past READY_TIMEOUT_S (resources held by others) too, and its groups are removed."""
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    n, m = cfg.backend.trainer_workers, cfg.backend.rollout_workers
    unit = {"GPU": 1} if _cuda(cfg) else {"CPU": 1}
    kind = next(iter(unit))
    ask = asked(cfg, kind)
    need = max(n, m) if cfg.backend.placement == "colocated" else n + m
    have = float(ray.cluster_resources().get(kind, 0))
    if have < need:  # never placeable: say so now rather than wait
        raise ConfigError(f"Ray cannot place this run: {ask}; {cluster_has(ray, kind)}")
    groups: list[Any] = []

    def wait(pg: Any) -> Any:
        groups.append(pg)
        ready, _ = ray.wait([pg.ready()], timeout=READY_TIMEOUT_S)
        if not ready:
            for made in groups:  # a pending group would hold the cluster's next job
                with contextlib.suppress(Exception):
                    remove_placement_group(made)
            free = float(ray.available_resources().get(kind, 0))
            raise ConfigError(
                f"Ray could not place this run within {READY_TIMEOUT_S:.0f} s: {ask}; "
                f"{cluster_has(ray, kind)}, {free:g} {kind} free (others hold the rest)"
            )
        return pg

    def on(pg: Any, i: int, share: float) -> dict:
        strategy = PlacementGroupSchedulingStrategy(
            placement_group=pg, placement_group_bundle_index=i
        )
        res = {"num_gpus": share, "num_cpus": 0} if "GPU" in unit else {"num_cpus": share}
        return {"scheduling_strategy": strategy, **res}

    if cfg.backend.placement == "colocated":
        pg = wait(placement_group([dict(unit)] * max(n, m), strategy="PACK"))
        return [on(pg, i, 0.5) for i in range(n)], [on(pg, i, 0.5) for i in range(m)], [pg]
    train_pg = wait(placement_group([dict(unit)] * n, strategy="PACK"))
    rollout: list[dict] = []
    if m:
        roll_pg = wait(placement_group([dict(unit)] * m, strategy="PACK"))
        rollout = [on(roll_pg, i, 1.0) for i in range(m)]
    return [on(train_pg, i, 1.0) for i in range(n)], rollout, groups


def asked(cfg: TrainConfig, kind: str) -> str:
    """What the run asks Ray for, in words: '2 training ranks x 1 CPU + 1 rollout worker x 1
    CPU = 3 CPU (placement separate)'."""
    n, m = cfg.backend.trainer_workers, cfg.backend.rollout_workers
    ranks = f"{n} training rank{'s' * (n != 1)}"
    workers = f"{m} rollout worker{'s' * (m != 1)}"
    if cfg.backend.placement == "colocated":
        return (
            f"it asks for {ranks} and {workers} sharing {max(n, m)} bundles x 1 {kind} = {max(n, m)} {kind} "
            "(placement colocated)"
        )
    parts = [f"{ranks} x 1 {kind}"] + ([f"{workers} x 1 {kind}"] if m else [])
    return f"it asks for {' + '.join(parts)} = {n + m} {kind} (placement separate)"


def cluster_has(ray: Any, kind: str) -> str:
    """'the cluster has 2 CPU on 1 node (192.0.2.2: 2)' from Ray's live nodes."""
    nodes = [node for node in ray.nodes() if node.get("Alive")]
    total = sum(float(node["Resources"].get(kind, 0)) for node in nodes)
    each = ", ".join(
        f"{node.get('NodeManagerAddress', '?')}: {float(node['Resources'].get(kind, 0)):g}"
        for node in nodes
    )
    count = f"{len(nodes)} node{'s' * (len(nodes) != 1)}"
    return f"the cluster has {total:g} {kind} on {count} ({each})"


def build_ray_parts(
    cfg: TrainConfig,
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
    pool = backend = None
    try:
        trainer_opts, rollout_opts, groups = placement_options(ray, cfg)
        out = str(output_dir)
        # The ranks' processes start (and import torch) while the rollout workers start: the
        # two waits overlap instead of adding up.
        backend = RayFSDPBackend(
            cfg, model, n, actor_options=trainer_opts, output_dir=out, wait=False
        )
        if m:
            pool = RolloutPool(
                ray,
                cfg,
                model,
                tokenizer.pad_token_id,
                m,
                rollout_opts,
                output_dir=out,
                refs=backend.refs,  # one object-store copy of a step's pixels for both
            )
            engine: Any = pool
        else:
            engine = policy_engine(cfg, model, tokenizer)
        backend.finish_start()
    except BaseException:
        if pool is not None:
            pool.close()
        if backend is not None:
            backend.owns_ray = False  # Ray and the groups are released below
            backend.close()
        _release(ray, groups, owns)
        raise
    backend.owns_ray = False
    backend.after_close = lambda: _release(ray, groups, owns)
    if cfg.backend.ray_address:  # a cluster: say where the ranks landed
        print(f"ray: {ranks_on_nodes(ray, backend.nodes)}", file=sys.stderr, flush=True)
    attach_sleeper(backend, engine, cfg)
    return backend, engine


def ranks_on_nodes(ray: Any, node_ids: list[str]) -> str:
    """'2 training ranks on 2 nodes: rank 0 on 1a2b3c4d (192.0.2.2; node_a), ...': each rank's
    node, with the node's custom resources (the labels a cluster's nodes were started with)."""
    info = {node["NodeID"]: node for node in ray.nodes()}
    standard = ("CPU", "GPU", "memory", "object_store_memory", "node:", "accelerator_type:")

    def where(node_id: str) -> str:
        node = info.get(node_id, {})
        labels = sorted(k for k in node.get("Resources", {}) if not k.startswith(standard))
        ip = node.get("NodeManagerAddress", "?")
        return f"{node_id[:8]} ({ip}" + (f"; {', '.join(labels)})" if labels else ")")

    each = ", ".join(f"rank {r} on {where(node)}" for r, node in enumerate(node_ids))
    count = len(set(node_ids))
    return f"{len(node_ids)} training ranks on {count} node{'s' * (count != 1)}: {each}"


def attach_sleeper(backend: Any, engine: Any, cfg: TrainConfig) -> None:
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
