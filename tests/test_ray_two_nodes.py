"""A Ray cluster of two nodes on this machine, started as Ray users start one (`ray start
--head`, then `ray start --address=...`, each node with 1 CPU and a custom resource of its
own), with Ray 2.60's default token authentication: `gspo train --ray-address HOST:PORT`
joins it with no environment variable set by hand, places its 2 training ranks one per node,
and writes the same metrics and final weights as the local run at the same seed. Ranks that
the cluster cannot hold are refused in one line.

Each node has its own temp dir and free ports; the test stops only its own nodes' processes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

if os.environ.get("GSPO_REQUIRE_RAY") != "1":
    pytest.importorskip("ray")

from ray_nodes import RayNode
from test_ray_train import WEIGHT_TOL, _cfg, _compare, _final_weights, _records

pytestmark = pytest.mark.slow  # needs Ray; the fast tier leaves it out (docs/testing.md)

# The same run as test_ray_train's _cfg, as command-line flags.
FLAGS = [
    "--preset", "smoke", "--device", "cpu", "--dtype", "float64", "--threads", "1",
    "--steps", "3", "--eval-every", "3", "--n-test", "4", "--micro-batch-size", "3",
    "--lr", "3e-3", "--max-new-tokens", "8", "--overlong-buffer", "6",
]  # fmt: skip


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """(head, home): two `ray start` nodes; the token in home/.ray/auth_token, where Ray
    keeps it by default (a home of the test's own, not the user's)."""
    home = tmp_path_factory.mktemp("home")
    (home / ".ray").mkdir()
    (home / ".ray" / "auth_token").write_text(os.urandom(16).hex())
    # No RAY_AUTH_MODE: `ray start --head` turns token authentication on because a token
    # exists, as on any machine where Ray ran before.
    env = {"HOME": str(home)}
    nodes = []
    try:
        nodes.append(RayNode(cpus=1, resources={"node_a": 1}, env=env))
        # A node joining by address does not switch to token mode by itself (Ray 2.60's `ray
        # start --address` connects without the token unless RAY_AUTH_MODE=token): as documented.
        worker_env = {**env, "RAY_AUTH_MODE": "token"}
        nodes.append(
            RayNode(cpus=1, resources={"node_b": 1}, env=worker_env, address=nodes[0].address)
        )
        yield nodes[0], home
    finally:
        for node in reversed(nodes):
            node.stop()


def _gspo(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["HOME"] = str(home)
    src = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "gspo.interface.cli", "train", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_two_nodes_train_like_the_local_run(cluster, tmp_path):
    from gspo.compose.train import train

    head, home = cluster
    local = train(_cfg(tmp_path, "local"))
    out = tmp_path / "two-nodes"
    run = _gspo(
        home,
        *FLAGS,
        "--backend", "ray", "--trainer-workers", "2", "--ray-address", head.address,
        "--output-dir", str(out),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    placed = [line for line in run.stderr.splitlines() if line.startswith("ray: ")]
    assert len(placed) == 1 and "2 training ranks on 2 nodes" in placed[0], run.stderr[-3000:]
    assert "node_a" in placed[0] and "node_b" in placed[0]
    worst = _compare(_records(local.output_dir), _records(out))
    wl, wr = _final_weights(local.output_dir), _final_weights(out)
    diff = max(float((wl[k] - wr[k]).abs().max()) for k in wl)
    print(f"two nodes (2 ranks) vs local: metrics rel {worst:.1e}, final weights {diff:.1e}")
    print(placed[0])
    assert diff < WEIGHT_TOL
    assert all(torch.isfinite(v).all() for v in wr.values())


def test_ranks_the_cluster_cannot_hold_are_refused_in_one_line(cluster, tmp_path):
    head, home = cluster
    run = _gspo(
        home,
        *FLAGS,
        "--backend", "ray", "--trainer-workers", "3", "--ray-address", head.address,
        "--output-dir", str(tmp_path / "too-big"),
    )  # fmt: skip
    assert run.returncode == 2, run.stderr[-3000:]
    last = run.stderr.strip().splitlines()[-1]
    assert "Traceback" not in run.stderr
    assert "3 training ranks x 1 CPU = 3 CPU" in last, run.stderr[-3000:]
    assert "the cluster has 2 CPU on 2 nodes" in last
