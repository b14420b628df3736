"""Faults on Ray: a killed training rank or rollout worker ends the call with a message naming
it and the last checkpoint; close() leaves none of the session's processes.

Each test starts its own private Ray session (its own temp dir) and checks only the processes
of that session, so other Ray runs on the machine do not matter.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import pytest
import torch
from test_ray_backend import _batch, _cfg

from gspo.build import build_policy

if os.environ.get("GSPO_REQUIRE_RAY") != "1":
    pytest.importorskip("ray")


def _session_processes(temp_dir: str) -> list[int]:
    """Live processes whose command line names this Ray session's private temp dir."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if temp_dir in (proc / "cmdline").read_bytes().decode(errors="replace"):
                    pids.append(int(proc.name))
            except OSError:
                continue
    return pids


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0]
    except OSError:
        return False
    return state != "Z"


def _wait_gone(pids: list[int], temp_dir: str, seconds: float = 15.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        left = [p for p in pids if _alive(p)] + _session_processes(temp_dir)
        if not left:
            return []
        time.sleep(0.25)
    return left


def test_killed_rank_named_and_nothing_left(tmp_path):
    """The backend starts its own Ray here: close() must leave none of its processes."""
    import ray

    from gspo.backend.ray_backend import RayFSDPBackend, WorkerLostError

    assert not ray.is_initialized()
    cfg = _cfg(output_dir=str(tmp_path))
    torch.manual_seed(0)
    model, tokenizer = build_policy(cfg, torch.device("cpu"))
    rollout, advantages = _batch(model)
    temp_dir = tempfile.mkdtemp(prefix="gspo-ray-t-")  # this test's own Ray session
    backend = RayFSDPBackend(cfg, model, workers=2, output_dir=str(tmp_path), temp_dir=temp_dir)
    assert _session_processes(temp_dir)  # the scan sees the session's processes
    pids = list(backend.pids)
    try:
        backend.update(rollout, rollout.logprobs, advantages, 0)
        backend.save_checkpoint(tmp_path, 1, tokenizer=tokenizer, config={}, keep=2, extra={})
        os.kill(pids[1], signal.SIGKILL)
        with pytest.raises(WorkerLostError, match=r"training rank 1 .*step_000001"):
            backend.update(rollout, rollout.logprobs, advantages, 1)
    finally:
        backend.close()
    assert not ray.is_initialized()
    assert _wait_gone(pids, temp_dir) == []
    shutil.rmtree(temp_dir, ignore_errors=True)
