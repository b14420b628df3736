"""Resharding a distributed (DCP) checkpoint in one process, without Ray: gspo's own FSDP2 ranks
(:class:`gspo.backend.fsdp.FSDPRank`) run as threads of this process, over gloo on a FileStore
in tmp_path (no ports). A checkpoint of 2 ranks is read back by 1 rank, by the local backend
(no process group) and, rewritten by 1 rank, by 2 ranks again; a local checkpoint is read by 2
ranks. Every reader ends with the full state the writer saved, bit for bit: weights, AdamW's
moments and step count, and the LR schedule. (test_ray_reshard.py runs the same layouts as
Ray actors and continues training from them.)"""

from __future__ import annotations

import contextlib
import copy
import threading
from pathlib import Path

import pytest
import torch
from update_support import update_batch

from gspo.backend.base import CheckpointTarget
from gspo.backend.checkpoint import write_checkpoint
from gspo.backend.fsdp import FSDPRank
from gspo.backend.local import LocalBackend
from gspo.config import TrainConfig, build
from gspo.models.policy import build_policy
from gspo.rollout.base import Rollout

# The thread-local process-group world of PyTorch's own multi-threaded distributed tests: each
# thread gets its own default group. Private API, so its absence skips rather than fails.
threaded_pg = pytest.importorskip(
    "torch.testing._internal.distributed.multi_threaded_pg",
    reason="this torch has no thread-local process groups (multi_threaded_pg)",
)
if not hasattr(torch._C._distributed_c10d, "_set_thread_isolation_mode"):
    pytest.skip(
        "this torch has no thread-isolation mode for process groups", allow_module_level=True
    )

JOIN_TIMEOUT_S = 600  # a rank stuck in a collective (its peer died) fails the test, not hangs it


def _cfg() -> TrainConfig:
    # threads left at 0: FSDPRank would set torch's thread count for the whole test process.
    values = dict(micro_batch_size=1, device="cpu", lr=1e-3, dtype="float64")
    return build(TrainConfig, preset="smoke", overrides=values)


def _batch(model, n: int = 6) -> tuple[Rollout, torch.Tensor]:
    """A hand-made rollout whose engine log-probs are the policy's own, and its advantages."""
    from gspo.models.logprobs import token_logprobs

    g = torch.Generator().manual_seed(5)
    prompt_ids = torch.randint(3, 20, (n, 3), generator=g)  # [N, P]
    completion_ids = torch.randint(3, 20, (n, 5), generator=g)  # [N, L]
    lengths = torch.tensor([5, 3, 4, 5, 2, 5])
    completion_mask = (torch.arange(5)[None, :] < lengths[:, None]).long()  # [N, L]
    with torch.no_grad():
        current, _ = token_logprobs(
            model, prompt_ids, torch.ones_like(prompt_ids), completion_ids, completion_mask
        )  # [N, L]
    rollout = Rollout(
        prompt_ids=prompt_ids,
        prompt_mask=torch.ones_like(prompt_ids),
        completion_ids=completion_ids,
        completion_mask=completion_mask,
        logprobs=current * completion_mask,  # [N, L]
        finish_reasons=["length"] * n,
        prompt_index=torch.arange(n),
    )
    return rollout, torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0], dtype=torch.float64)


@contextlib.contextmanager
def _thread_local_groups():
    threaded_pg._install_threaded_pg()
    torch._C._distributed_c10d._set_thread_isolation_mode(True)
    try:
        yield
    finally:
        torch._C._distributed_c10d._set_thread_isolation_mode(False)
        threaded_pg._uninstall_threaded_pg()


def _world(n: int, cfg, weights: dict, store_path: Path, fn) -> list:
    """``fn(rank)`` on each of ``n`` FSDPRanks (threads), built from ``weights``: their results."""
    import torch.distributed as dist

    store = dist.FileStore(str(store_path), n)
    results, errors = [None] * n, []

    def work(r: int) -> None:
        rank = FSDPRank(cfg, r, n)
        rank._store = store  # what rendezvous() leaves on rank 0, here shared by all
        try:
            rank.setup("", weights)
            results[r] = fn(rank)
        except BaseException as err:  # re-raised in the test's thread below
            errors.append(err)
        finally:
            rank.close()

    with _thread_local_groups():
        threads = [threading.Thread(target=work, args=(r,), daemon=True) for r in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(JOIN_TIMEOUT_S)
    assert not any(t.is_alive() for t in threads), "a rank hung in a collective"
    if errors:
        raise errors[0]
    return results


def _full_state(model, optimizer) -> dict:
    """Weights and optimizer state by parameter name, whole tensors (FSDP2 shards gathered)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    weights, optim = get_state_dict(model, optimizer, options=opts)
    return {"model": weights, "optim": optim}


def _rank_state(rank: FSDPRank) -> dict:
    """A rank's full state (every rank must call: the gather is a collective) and its LR."""
    return {**_full_state(rank.model, rank.optimizer), "lr": rank.lr()}


def _flat(tree, prefix: str = "") -> dict:
    if isinstance(tree, dict):
        return {k: v for key, sub in tree.items() for k, v in _flat(sub, f"{prefix}{key}.").items()}
    if isinstance(tree, list | tuple):
        return {k: v for i, sub in enumerate(tree) for k, v in _flat(sub, f"{prefix}{i}.").items()}
    return {prefix.rstrip("."): tree}


def _assert_same(got: dict, want: dict, what: str) -> None:
    got, want = _flat(got), _flat(want)
    assert got.keys() == want.keys(), what
    for key, value in want.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(got[key], value), (what, key)
        else:
            assert got[key] == value, (what, key)


def test_a_sharded_checkpoint_reads_back_whole_on_other_rank_counts(tmp_path):
    cfg = _cfg()
    torch.manual_seed(0)
    model, _ = build_policy(cfg.model, torch.device("cpu"), seed=cfg.run.seed)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    rollout, advantages = _batch(model)

    def train_and_save(into: Path):
        def fn(rank: FSDPRank) -> dict:
            rank.update(update_batch(rollout, rollout.logprobs, advantages))  # Adam moments != 0
            rank.save(str(into))
            return _rank_state(rank)

        return fn

    # 2 ranks update once and write a checkpoint (one shard each), as RayFSDPBackend does.
    saved: list = []

    def write(tmp: Path) -> None:
        saved.extend(_world(2, cfg, weights, tmp_path / "s2", train_and_save(tmp)))

    state = {"config": {}, "ranks": 2}
    path2 = write_checkpoint(tmp_path / "two", 1, write=write, state=state, keep=2)
    assert sorted(p.name for p in (path2 / "dcp").glob("*.distcp")) == [
        "__0_0.distcp",
        "__1_0.distcp",
    ]
    want = saved[0]  # rank 0's: the gathered full state (cpu_offload leaves the others empty)
    steps = [v for k, v in _flat(want["optim"]).items() if k.endswith(".step")]
    moments = [v for k, v in _flat(want["optim"]).items() if k.endswith(".exp_avg_sq")]
    assert steps and all(float(s) == 2 for s in steps)  # smoke: 2 minibatches, 2 Adam steps
    assert moments and all(float(m.abs().max()) > 0 for m in moments)

    def load(path: Path):
        def fn(rank: FSDPRank) -> dict:
            rank.load(str(path))
            return _rank_state(rank)

        return fn

    # 2 ranks -> 1 rank.
    (one,) = _world(1, cfg, weights, tmp_path / "s1", load(path2))
    _assert_same(one, want, "2 ranks -> 1 rank")

    # 2 ranks -> the local backend (one process, no process group).
    local = LocalBackend(cfg, copy.deepcopy(model), torch.device("cpu"))
    assert local.load_checkpoint(path2)["ranks"] == 2
    _assert_same(
        {**_full_state(local.model, local.optimizer), "lr": local.lr()}, want, "2 ranks -> local"
    )

    # 1 rank rewrites it (one shard), and 2 ranks read that.
    def load_and_save(into: Path):
        def fn(rank: FSDPRank) -> None:
            rank.load(str(path2))
            rank.save(str(into))

        return fn

    path1 = tmp_path / "one"
    path1.mkdir()
    _world(1, cfg, weights, tmp_path / "s3", load_and_save(path1))
    assert [p.name for p in (path1 / "dcp").glob("*.distcp")] == ["__0_0.distcp"]
    again = _world(2, cfg, weights, tmp_path / "s4", load(path1))
    _assert_same(again[0], want, "2 -> 1 -> 2 ranks")


def test_a_local_checkpoint_reads_back_whole_on_two_ranks(tmp_path):
    from gspo.backend.reshard import local_to_dcp

    cfg = _cfg()
    torch.manual_seed(0)
    model, _ = build_policy(cfg.model, torch.device("cpu"), seed=cfg.run.seed)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    rollout, advantages = _batch(model)
    local = LocalBackend(cfg, copy.deepcopy(model), torch.device("cpu"))
    local.update(update_batch(rollout, rollout.logprobs, advantages))
    path = local.save_checkpoint(CheckpointTarget(tmp_path / "local", None, {}, 2), 1, {})
    want = {**_full_state(local.model, local.optimizer), "lr": local.lr()}
    converted = tmp_path / "converted"
    converted.mkdir()
    local_to_dcp(path, copy.deepcopy(model), cfg, converted)  # what RayFSDPBackend.load runs

    def load(rank: FSDPRank) -> dict:
        rank.load(str(converted))
        return _rank_state(rank)

    two = _world(2, cfg, weights, tmp_path / "s", load)
    _assert_same(two[0], want, "local -> 2 ranks")
