"""Faults on Ray: a killed training rank or rollout worker ends the call with a message naming
it and the last checkpoint; close() leaves none of the session's processes.

Each test starts its own private Ray session (its own temp dir) and checks only the processes
of that session, so other Ray runs on the machine do not matter.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import pytest
import torch
from test_ray_backend import _batch, _cfg
from update_support import update_batch

from gspo.backend.base import CheckpointTarget
from gspo.compose.parts import build_policy_for
from gspo.rollout.base import GenerationRequest

if os.environ.get("GSPO_REQUIRE_RAY") != "1":
    pytest.importorskip("ray")

pytestmark = pytest.mark.slow  # needs Ray; the fast tier leaves it out (docs/testing.md)


def _session_processes(temp_dir: str) -> list[int]:
    """Live processes whose command line names this Ray session's private temp dir (raylet,
    GCS, ...)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if temp_dir in (proc / "cmdline").read_bytes().decode(errors="replace"):
                    pids.append(int(proc.name))
            except OSError:
                continue
    return [p for p in pids if _alive(p)]


def _descendants(root: int) -> list[int]:
    """Every live process below ``root`` (Ray's raylet and GCS are the driver's children, its
    workers the raylet's)."""
    children: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                ppid = int((proc / "stat").read_text().rsplit(") ", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(proc.name))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return [p for p in out if _alive(p)]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _wait_gone(pids: list[int], temp_dir: str, seconds: float = 20.0) -> list[int]:
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
    model, tokenizer = build_policy_for(cfg, torch.device("cpu"))
    rollout, advantages = _batch(model)
    temp_dir = tempfile.mkdtemp(prefix="gspo-ray-t-")  # this test's own Ray session
    backend = RayFSDPBackend(cfg, model, workers=2, output_dir=str(tmp_path), temp_dir=temp_dir)
    assert _session_processes(temp_dir)  # the scan sees the session's processes
    pids = list(backend.pids)
    started = _descendants(os.getpid())  # raylet, GCS, workers: all of this session
    assert set(pids) <= set(started)
    try:
        backend.update(update_batch(rollout, rollout.logprobs, advantages, 0))
        backend.save_checkpoint(CheckpointTarget(tmp_path, tokenizer, {}, 2), 1, {})
        os.kill(pids[1], signal.SIGKILL)
        with pytest.raises(WorkerLostError, match=r"training rank 1 .*step_000001"):
            backend.update(update_batch(rollout, rollout.logprobs, advantages, 1))
    finally:
        backend.close()
    assert not ray.is_initialized()
    assert _wait_gone(started, temp_dir) == []
    shutil.rmtree(temp_dir, ignore_errors=True)


def test_killed_rollout_worker_named_and_nothing_left(tmp_path):
    import ray

    from gspo.backend.ray_backend import WorkerLostError
    from gspo.orchestration.ray_parts import build_ray_parts
    from gspo.rollout.base import SamplingParams

    assert not ray.is_initialized()
    cfg = _cfg(output_dir=str(tmp_path), backend="ray", trainer_workers=1, rollout_workers=2)
    torch.manual_seed(0)
    model, tokenizer = build_policy_for(cfg, torch.device("cpu"))
    temp_dir = tempfile.mkdtemp(prefix="gspo-ray-t-")
    backend, pool = build_ray_parts(cfg, model, tokenizer, tmp_path, temp_dir=temp_dir)
    started = _descendants(os.getpid())
    try:
        assert set(pool.pids + backend.pids) <= set(started)
        prompts = [tokenizer.encode("1+2="), tokenizer.encode("3+4=")]
        params = SamplingParams(max_new_tokens=4)
        request = GenerationRequest(prompts, 2, params, torch.Generator().manual_seed(0))
        assert pool.generate(request).num_samples == 4
        os.kill(pool.pids[1], signal.SIGKILL)
        with pytest.raises(
            WorkerLostError, match=r"rollout worker 1 \(pid \d+\) died during generation.*none yet"
        ):
            pool.generate(GenerationRequest(prompts, 2, params, torch.Generator().manual_seed(0)))
    finally:
        pool.close()
        backend.close()  # placement groups and the session go with the backend
    assert not ray.is_initialized()
    assert _wait_gone(started, temp_dir) == []
    shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.mark.slow
def test_cli_killed_worker_stops_with_message_then_resumes(tmp_path):
    """`gspo train --backend ray`: SIGKILL the rollout worker mid-run; the run ends within a
    bounded time with the worker and the last checkpoint named (exit 3, no traceback), leaves
    no process, and --resume finishes the run."""
    import subprocess
    import sys

    out = tmp_path / "run"
    temp_dir = tempfile.mkdtemp(prefix="gspo-ray-t-")
    env = {**os.environ, "GSPO_RAY_TEMP_DIR": temp_dir, "PYTHONPATH": os.pathsep.join(sys.path)}
    args = [
        sys.executable, "-m", "gspo.interface.cli", "train", "--preset", "smoke", "--backend", "ray",
        "--trainer-workers", "2", "--rollout-workers", "1", "--steps", "40",
        "--checkpoint-every", "1", "--threads", "1", "--output-dir", str(out),
    ]  # fmt: skip
    child = subprocess.Popen(
        args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 120
        while not (out / "checkpoints" / "step_000002").is_dir():
            assert child.poll() is None and time.monotonic() < deadline, child.communicate()
            time.sleep(0.2)
        started = _descendants(child.pid)
        worker = [p for p in started if b"RolloutWorker" in Path(f"/proc/{p}/cmdline").read_bytes()]
        assert len(worker) == 1, started
        os.kill(worker[0], signal.SIGKILL)
        _, err = child.communicate(timeout=90)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 3, err[-3000:]
    assert "rollout worker 0" in err and "Last good checkpoint" in err and "--resume" in err
    assert "Traceback" not in err
    assert _wait_gone(started, temp_dir) == []
    done = subprocess.run([*args, "--resume"], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1] == 40
    shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.mark.slow
def test_sigkilled_driver_leaves_nothing_and_resumes_exactly(tmp_path):
    """SIGKILL `gspo train --backend ray` itself after its second checkpoint: every process it
    had started is gone within seconds (the watchdog), and --resume ends with the metrics and
    final weights of an unbroken run."""
    import subprocess
    import sys

    from safetensors.torch import load_file

    temp_dir = tempfile.mkdtemp(prefix="gspo-ray-t-")
    env = {**os.environ, "GSPO_RAY_TEMP_DIR": temp_dir, "PYTHONPATH": os.pathsep.join(sys.path)}

    def args(out):
        return [
            sys.executable, "-m", "gspo.interface.cli", "train", "--preset", "smoke", "--backend", "ray",
            "--trainer-workers", "2", "--rollout-workers", "1", "--steps", "6",
            "--checkpoint-every", "1", "--threads", "1", "--max-new-tokens", "8",
            "--overlong-buffer", "6", "--lr", "3e-3", "--output-dir", str(out),
        ]  # fmt: skip

    killed = tmp_path / "killed"
    child = subprocess.Popen(
        args(killed), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 120
        while not (killed / "checkpoints" / "step_000002").is_dir():
            assert child.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        started = _descendants(child.pid)
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=10)
    finally:
        if child.poll() is None:
            child.kill()
    assert len(started) >= 4  # Ray's own processes, 2 ranks, 1 worker, the watchdog
    assert _wait_gone(started, temp_dir, seconds=20) == []
    resumed = subprocess.run(
        [*args(killed), "--resume"], env=env, capture_output=True, text=True, timeout=300
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    unbroken = tmp_path / "unbroken"
    done = subprocess.run(args(unbroken), env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]

    def steps(out):
        records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        by_step = {r["step"]: r for r in records if "grad_norm" in r}  # a resumed step: last wins
        return {
            k: {m: v for m, v in r.items() if not m.startswith(("time/", "throughput/"))}
            for k, r in by_step.items()
        }

    a, b = steps(unbroken), steps(killed)
    assert sorted(a) == list(range(1, 7)) and a == b
    assert max(r["grad_norm"] for r in a.values()) > 0  # real updates, not zero gradients
    wa = load_file(str(unbroken / "final" / "model.safetensors"))
    wb = load_file(str(killed / "final" / "model.safetensors"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    shutil.rmtree(temp_dir, ignore_errors=True)


def test_a_rank_failing_because_its_peer_died_names_the_dead_peer():
    """Rank 0's collective fails first ("Connection reset by peer", a task error) while Ray has
    not yet reported rank 1's death: gather waits for the peers and names rank 1; a task error
    with no dead peer propagates as it is."""
    from types import SimpleNamespace

    from gspo.backend.ray_backend import WorkerLostError, gather

    class TaskError(Exception):
        pass

    class ActorError(Exception):
        pass

    def fake_ray(outcomes: dict):
        def wait(refs, num_returns=1, timeout=None):
            return list(refs[:num_returns]), list(refs[num_returns:])

        def get(ref):
            raise outcomes[ref]

        errors = SimpleNamespace(
            RayActorError=ActorError,
            WorkerCrashedError=ActorError,
            OutOfMemoryError=ActorError,
            RayTaskError=TaskError,
        )
        return SimpleNamespace(wait=wait, get=get, exceptions=errors)

    names = ["training rank 0", "training rank 1"]
    ray = fake_ray({"r0": TaskError("gloo: Connection reset by peer"), "r1": ActorError()})
    with pytest.raises(WorkerLostError, match="training rank 1 died during the update"):
        gather(ray, ["r0", "r1"], names, "the update", None)
    ray = fake_ray({"r0": TaskError("a bug of its own"), "r1": TaskError("same")})
    with pytest.raises(TaskError, match="a bug of its own"):
        gather(ray, ["r0", "r1"], names, "the update", None)
