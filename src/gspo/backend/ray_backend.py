"""The FSDP2 training backend: :class:`~gspo.backend.base.TrainingBackend` over N Ray-placed
ranks (:class:`gspo.backend.fsdp.FSDPRank`).

The driver keeps an unsharded copy of the policy only to hand out weights (rollout engines, the
final export); the ranks own the trainable shards, the optimizer, the schedule and the reference.
Metrics are merged over ranks as one process would pool them. A rank that dies (SIGKILL, OOM)
ends the call with :class:`WorkerLostError` naming it and the last good checkpoint.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from gspo.config.train import TrainConfig

from ..backend.options import mismatch_stats
from ..core.checkpoint_paths import latest_checkpoint
from ..models.model_io import save_model
from ..models.moe import is_moe
from ..models.vision import save_processor
from ..rollout.base import Rollout, RolloutBatch
from .base import CheckpointTarget
from .checkpoint import (
    load_state,
    set_rng_state,
    write_checkpoint,
)
from .fsdp import FSDPRank
from .ray_cluster import import_ray, start_ray, stop_ray
from .ray_refs import PixelRefs
from .reshard import is_sharded, local_to_dcp
from .shard import merge_rank_metrics


class WorkerLostError(RuntimeError):
    """A training rank or rollout worker died; the message names it and the last checkpoint."""


def refuse_unsupported(cfg: TrainConfig, model: torch.nn.Module) -> None:
    """What the FSDP2 ranks cannot do yet, refused before any work."""
    if is_moe(model) or cfg.model.routing_replay not in (None, "none"):
        raise ValueError(
            "backend='ray' does not support MoE models or routing_replay yet (routing records "
            "are per process); use backend='local' for tiny-moe / --routing-replay"
        )
    if cfg.model.lora_rank > 0:
        raise ValueError("backend='ray' does not support LoRA (lora_rank > 0) yet")


PEER_GRACE_S = 20.0
"""How long :func:`gather` waits, after a task failed with an error, for its peers' results:
a rank whose peer was killed often fails first (gloo: "Connection reset by peer") before Ray
reports the killed actor, and the run should name the one that died."""


def gather(ray: Any, refs: list, names: list[str], what: str, output_dir: str | None) -> list:
    """``ray.get`` of every ref, in order; the first actor found dead raises
    :class:`WorkerLostError` at once (its peers may be stuck in a collective waiting for it).
    A task that fails with an error of its own while a peer has died (its collective lost the
    peer) also raises the peer's :class:`WorkerLostError`; otherwise its error propagates."""
    index = {ref: i for i, ref in enumerate(refs)}
    pending, results = list(refs), [None] * len(refs)
    # OutOfMemoryError: Ray's memory monitor killed the process (the node passed its memory
    # threshold); the run stops as for any lost rank, naming it.
    lost = (
        ray.exceptions.RayActorError,
        ray.exceptions.WorkerCrashedError,
        ray.exceptions.OutOfMemoryError,
    )
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        i = index[done[0]]
        try:
            results[i] = ray.get(done[0])
        except lost as err:
            raise _lost(names[i], what, err, output_dir) from None
        except ray.exceptions.RayTaskError as failed:
            ready = []
            if pending:
                ready, _ = ray.wait(pending, num_returns=len(pending), timeout=PEER_GRACE_S)
            for ref in ready:
                try:
                    ray.get(ref)
                except lost as err:  # the peer that died is the cause: name it
                    raise _lost(names[index[ref]], what, err, output_dir) from None
                except Exception:  # another casualty of the same failure
                    continue
            raise failed from None
    return results


def _lost(name: str, what: str, err: BaseException, output_dir: str | None) -> WorkerLostError:
    last = latest_checkpoint(output_dir) if output_dir else None
    # Measured: a node running another gspo than the driver fails to build the actor (its
    # classes do not unpickle) and Ray reports only ActorDiedError.
    hint = (
        " (on a cluster: every node needs the driver's gspo and torch)"
        if what == "start-up"
        else ""
    )
    return WorkerLostError(
        f"{name} died during {what} ({type(err).__name__}){hint}; the run stops. Last good "
        f"checkpoint: {last or 'none yet'}" + (" (continue with --resume)" if last else "")
    )


def _node_id(actor: Any) -> str:
    """Run inside an actor (``__ray_call__``): the id of the Ray node it runs on."""
    import ray

    return ray.get_runtime_context().get_node_id()


class RayFSDPBackend:
    """The policy update over ``workers`` FSDP2 ranks placed by Ray."""

    def __init__(
        self,
        cfg: TrainConfig,
        model: torch.nn.Module,
        workers: int,
        address: str | None = None,
        actor_options: list[dict[str, Any]] | None = None,
        output_dir: str | None = None,
        temp_dir: str | None = None,
        wait: bool = True,
    ):
        """``wait=False``: only create the rank actors (their processes start, importing torch,
        while the caller starts other actors); :meth:`finish_start` then forms the group."""
        refuse_unsupported(cfg, model)
        self.cfg, self.model, self.output_dir = cfg, model, output_dir
        self.owns_ray = not import_ray().is_initialized()  # then close() shuts it down
        self.after_close: Any = None  # called by close() once the ranks are gone
        # An engine sharing the ranks' devices (colocated vLLM on CUDA): it sleeps during the
        # update and wakes before the weight sync (set by orchestration.ray_parts).
        self.sleeper: Any = None
        self.asleep = False
        self.ray = start_ray(address, num_cpus=workers, temp_dir=temp_dir)
        # Image prompts: a step's pixel inputs in the object store once, read by reference by
        # the ranks (and by the rollout workers, which share this object: ray_parts).
        self.refs = PixelRefs(self.ray)
        self.ranks = []
        try:
            self._launch_ranks(FSDPRank, cfg, workers, actor_options)
            if wait:
                self.finish_start()
        except BaseException:  # a failed start-up: no rank, Ray or temp dir outlives it
            self.close()
            raise

    def _launch_ranks(self, rank_class, cfg, workers: int, actor_options) -> None:
        actor = self.ray.remote(num_cpus=1)(rank_class)
        options = actor_options or [{} for _ in range(workers)]
        self.names = [f"training rank {r}" for r in range(workers)]
        self.ranks = [actor.options(**options[r]).remote(cfg, r, workers) for r in range(workers)]

    def finish_start(self) -> None:
        """Wait for the launched ranks, form their process group and hand them the weights."""
        try:
            self._start_ranks(self.model)
        except BaseException:
            self.close()
            raise

    def _start_ranks(self, model) -> None:
        meet = self._rank0(lambda r: r.rendezvous.remote(), "start-up")
        state = self.ray.put({k: v.detach().cpu() for k, v in model.state_dict().items()})
        self._all(lambda r: r.setup.remote(meet, state), "start-up")
        self.pids = self._all(lambda r: r.pid.remote(), "start-up")
        self.names = [f"training rank {r} (pid {p})" for r, p in enumerate(self.pids)]
        # The Ray node of each rank (a cluster run reports where its ranks landed).
        self.nodes = self._all(lambda r: r.__ray_call__.remote(_node_id), "start-up")
        self._lr = self._rank0(lambda r: r.lr.remote(), "lr")

    def _all(self, call, what: str) -> list:
        return gather(self.ray, [call(r) for r in self.ranks], self.names, what, self.output_dir)

    def _rank0(self, call, what: str) -> Any:
        return gather(self.ray, [call(self.ranks[0])], self.names[:1], what, self.output_dir)[0]

    def old_logprobs(self, rollout: Rollout) -> tuple[torch.Tensor, dict[str, float]]:
        if self.cfg.rollout.old_logprobs == "engine":
            return rollout.logprobs, {}
        batch = self.ray.put(self.refs.by_reference(rollout))  # one copy for all ranks
        parts = self._all(lambda r: r.old_logprobs.remote(batch), "the old log-prob pass")
        out = torch.zeros(rollout.logprobs.shape, dtype=parts[0].dtype)  # [N, L]
        for rank, part in enumerate(parts):
            out[rank :: len(parts)] = part
        return out, mismatch_stats(out, rollout.logprobs, rollout.policy_mask)

    def reference_logprobs(self, rollout: Rollout) -> torch.Tensor | None:
        batch = self.refs.by_reference(rollout)
        return self._rank0(lambda r: r.reference_logprobs.remote(batch), "the reference pass")

    def kl_penalty(
        self, rollout: Rollout, old_logprobs: torch.Tensor
    ) -> tuple[torch.Tensor | None, dict[str, float]]:
        batch = self.refs.by_reference(rollout)
        return self._rank0(lambda r: r.kl_penalty.remote(batch, old_logprobs), "the KL pass")

    def update(self, batch: RolloutBatch) -> dict[str, float]:
        if self.sleeper is not None and not self.asleep:
            self.sleeper.sleep()  # free the shared GPU memory for the update
            self.asleep = True
        # One object-store copy of what the update reads, for all ranks (each takes its
        # rows); its pixel inputs (image prompts) by reference, the copy the step's earlier
        # passes read. The episodes' records and the metrics stay on the driver.
        shipped = replace(
            batch,
            rollout=self.refs.by_reference(batch.rollout),
            trajectories=[],
            images=None,
            metrics={},
            mismatch={},
            corrected={},
            times={},
        )
        ref = self.ray.put(shipped)
        states = self._all(lambda r: r.update.remote(ref), "the update")
        self._lr = states[0]["lr"]
        return merge_rank_metrics([s["metrics"] for s in states])

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        return self._all(lambda r: r.full_state_dict.remote(), "the weight gather")[0]

    def push_weights(self, engine: Any) -> None:
        """Gather the full weights into the driver's copy and hand it to the engine(s), woken
        first if it slept through the update."""
        self.model.load_state_dict(self.full_state_dict())
        if self.sleeper is not None and self.asleep:
            self.sleeper.wake()
            self.asleep = False
        engine.update_weights(self.model)

    def step_metrics(self, rollout: Rollout) -> dict[str, float]:
        return {}  # dense models only (MoE is refused)

    def lr(self) -> float:
        return self._lr

    def save_checkpoint(self, target: CheckpointTarget, step: int, extra: dict[str, Any]) -> Path:
        """Each rank writes its shard (DCP) into a temporary folder; the driver adds tokenizer,
        RNG and state.json, then renames the folder into place (as gspo.backend.checkpoint does)."""

        def write(tmp: Path) -> None:
            self._all(lambda r: r.save.remote(str(tmp)), f"the checkpoint of step {step}")
            self.model.config.save_pretrained(tmp)  # the architecture, for `gspo` tools
            if target.tokenizer is not None:
                target.tokenizer.save_pretrained(tmp)
            save_processor(self.model, target.tokenizer, tmp)  # a VL model's image processor too

        state = {"config": target.config, "ranks": len(self.ranks), **extra}
        return write_checkpoint(target.output_dir, step, write=write, state=state, keep=target.keep)

    def load_checkpoint(self, path: Path) -> dict[str, Any]:
        """Restore a checkpoint of any number of ranks (DCP reads each rank's pieces of the
        saved tensors) or of the local backend (converted to DCP form first, beside it)."""
        path = Path(path)
        state = load_state(path)
        source, tmp = path, None
        if not is_sharded(path):  # the local backend's: its optimizer by parameter index
            tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=".tmp-reshard-"))
            try:
                local_to_dcp(path, self.model, self.cfg, tmp)
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            source = tmp
        try:
            self._all(lambda r: r.load.remote(str(source)), f"loading {path}")
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
        set_rng_state(torch.load(path / "rng.pt", weights_only=False))
        self._lr = self._rank0(lambda r: r.lr.remote(), "lr")
        self.model.load_state_dict(self.full_state_dict())
        return state

    def export(self, directory: Path, tokenizer: Any) -> None:
        self.model.load_state_dict(self.full_state_dict())
        save_model(self.model, tokenizer, directory)

    def close(self) -> None:
        """Destroy the process groups, kill the rank actors, and stop Ray if this backend
        started it. Safe to call twice, and after a rank died."""
        ranks, self.ranks = self.ranks, []
        try:
            if ranks:  # a dead rank's close never returns: wait a bounded time
                closing = [r.close.remote() for r in ranks]
                self.ray.wait(closing, num_returns=len(closing), timeout=10)
        finally:
            for r in ranks:
                self.ray.kill(r)
            after, self.after_close = self.after_close, None
            if after is not None:  # placement groups, the session of whoever placed the ranks
                after()
            if self.owns_ray:
                stop_ray(self.ray)
