"""Joining Ray clusters as Ray users start them, without a cluster: token mode when a token is
at hand, 'auto' leaving out gspo's private instances, the one-line placement refusal, and a
Ray run resumed in one process with ``--backend local`` alone. The real two-node cluster is
tests/test_ray_two_nodes.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from gspo.backend import ray_connect
from gspo.compose.resume import follow_layout, resume_config
from gspo.config import ConfigError, TrainConfig, to_dict


def _raylet(gcs: str, temp: Path) -> list[str]:
    """A raylet's command line as /proc shows it (the flags 'auto' reads)."""
    return ["/x/ray/core/src/ray/raylet/raylet", f"--gcs-address={gcs}", f"--temp-dir={temp}"]


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """Ray nodes on a fake machine: no RAY_ADDRESS, no `ray start` address file."""
    nodes: list[list[str]] = []
    monkeypatch.setattr(ray_connect, "_raylets", lambda: nodes)
    monkeypatch.setattr(ray_connect, "DEFAULT_TEMP_DIR", str(tmp_path / "ray"))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.delenv("RAY_TMPDIR", raising=False)

    def node(name: str, gcs: str, private: bool) -> None:
        temp = tmp_path / name
        temp.mkdir()
        if private:
            (temp / ray_connect.PRIVATE_MARK).write_text("1\n")
        nodes.append(_raylet(gcs, temp))

    return node


def test_auto_never_joins_a_private_instance(machine):
    machine("run1", "10.0.0.1:40001", private=True)  # another gspo run's own Ray
    with pytest.raises(ConfigError, match=r"no Ray cluster started with .ray start.*1 private"):
        ray_connect.resolve_address("auto")
    machine("head", "10.0.0.1:6379", private=False)
    machine("worker", "10.0.0.1:6379", private=False)  # a second node of the same cluster
    assert ray_connect.resolve_address("auto") == "10.0.0.1:6379"
    assert ray_connect.resolve_address("10.0.0.9:7000") == "10.0.0.9:7000"  # given: kept


def test_auto_with_two_clusters_asks_which(machine, tmp_path, monkeypatch):
    machine("a", "10.0.0.1:6379", private=False)
    machine("b", "10.0.0.1:6380", private=False)
    with pytest.raises(ConfigError, match="2 Ray clusters run on this machine"):
        ray_connect.resolve_address("auto")
    # The last `ray start --head` wrote its address: that one, as Ray does.
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text("10.0.0.1:6380\n")
    assert ray_connect.resolve_address("auto") == "10.0.0.1:6380"
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.2:6379")  # the environment first, as Ray does
    assert ray_connect.resolve_address("auto") == "10.0.0.2:6379"


def test_the_private_ray_a_run_starts_is_marked(monkeypatch, tmp_path):
    """start_ray writes the mark before ray.init (checked without starting Ray)."""
    from gspo.backend import ray_cluster

    class Stop(Exception):
        pass

    class FakeRay:
        def is_initialized(self):
            return False

        def init(self, **kw):
            assert (Path(kw["_temp_dir"]) / ray_connect.PRIVATE_MARK).is_file()
            raise Stop

        def shutdown(self):
            pass

    monkeypatch.setattr(ray_cluster, "import_ray", lambda: FakeRay())
    with pytest.raises(Stop):
        ray_cluster.start_ray(None, num_cpus=1, temp_dir=str(tmp_path / "r"))


def test_token_mode_when_a_token_is_at_hand(monkeypatch, tmp_path):
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "none"))
    assert not ray_connect.use_token_if_available()
    assert "RAY_AUTH_MODE" not in os.environ
    (tmp_path / "token").write_text("abc\n")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "token"))
    assert ray_connect.use_token_if_available()
    assert os.environ["RAY_AUTH_MODE"] == "token"
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # the user's explicit choice stands
    assert not ray_connect.use_token_if_available()


class _Cluster:
    """What placement_options reads from Ray: two nodes of 1 CPU."""

    def cluster_resources(self):
        return {"CPU": 2.0}

    def nodes(self):
        return [
            {"Alive": True, "NodeManagerAddress": "10.0.0.1", "Resources": {"CPU": 1.0}},
            {"Alive": True, "NodeManagerAddress": "10.0.0.2", "Resources": {"CPU": 1.0}},
        ]


def test_unplaceable_resources_are_refused_in_one_line():
    pytest.importorskip("ray")  # placement_options imports ray.util
    from gspo.config import build
    from gspo.config.train import TrainConfig
    from gspo.orchestration.ray_parts import placement_options

    cfg = build(TrainConfig, overrides=dict(backend="ray", trainer_workers=2, rollout_workers=1))
    with pytest.raises(ConfigError) as err:
        placement_options(_Cluster(), cfg)
    message = str(err.value)
    assert "\n" not in message
    assert "2 training ranks x 1 CPU + 1 rollout worker x 1 CPU = 3 CPU" in message
    assert "the cluster has 2 CPU on 2 nodes (10.0.0.1: 1, 10.0.0.2: 1)" in message


def _saved_ray_run(tmp_path: Path) -> Path:
    """A run folder whose latest checkpoint was written by 2 Ray ranks + 1 rollout worker."""
    cfg = TrainConfig.of(
        output_dir=str(tmp_path / "run"),
        backend="ray",
        trainer_workers=2,
        rollout_workers=1,
        reward_placement="ray",
        steps=4,
    )
    ckpt = tmp_path / "run" / "checkpoints" / "step_000002"
    ckpt.mkdir(parents=True)
    (ckpt / "state.json").write_text(json.dumps({"config": to_dict(cfg), "step": 2}))
    return tmp_path / "run"


def test_a_ray_run_resumes_locally_with_backend_local_alone(tmp_path):
    run = _saved_ray_run(tmp_path)
    printed: list[str] = []
    cfg = resume_config(run, {"backend": "local"}, echo=printed.append)
    assert (cfg.backend.backend, cfg.backend.trainer_workers, cfg.backend.rollout_workers) == (
        "local",
        1,
        0,
    )
    assert cfg.backend.reward_placement == "auto"
    assert "  changed on resume: rollout_workers 1 -> 0" in printed
    # Flags given explicitly still win (and a real change of sampling streams is refused).
    with pytest.raises(ConfigError, match="rollout_workers: 1 -> 2"):
        resume_config(run, {"backend": "local", "rollout_workers": 2}, echo=printed.append)
    assert follow_layout({"backend": "local"}, {"backend": "ray"}) == {}  # local -> Ray: valid


@pytest.mark.slow
def test_a_real_private_ray_is_seen_and_left_out():
    """A private Ray started by start_ray (in another process, as another run's would be) is
    found among this machine's raylets with its GCS address and marked private."""
    import subprocess
    import sys

    if os.environ.get("GSPO_REQUIRE_RAY") != "1":
        pytest.importorskip("ray")
    start = (
        "import time\n"
        "from gspo.backend import ray_cluster\n"
        "ray = ray_cluster.start_ray(None, num_cpus=1)\n"
        "print(ray.get_runtime_context().gcs_address, flush=True)\n"
        "time.sleep(600)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", start], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        gcs = proc.stdout.readline().strip()
        assert gcs, "the private Ray did not start"
        assert ray_connect.local_clusters().get(gcs) is True
    finally:
        proc.terminate()  # its atexit and watchdog stop the Ray it started
        proc.wait(timeout=60)
