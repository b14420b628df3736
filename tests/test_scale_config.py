"""The scale-out fields: bad values, incompatible options, Ray missing and an unreachable
cluster are clear errors before any work."""

from __future__ import annotations

import importlib.util
import os
import socket
import sys

import pytest

from gspo.compose.ray_check import check_backend_available
from gspo.config import ConfigError, TrainConfig, build


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(backend="slurm"), "backend must be one of local, ray"),
        (dict(trainer_workers=2), "trainer_workers=2 needs backend='ray'"),
        (dict(rollout_workers=1), "rollout_workers=1 needs backend='ray'"),
        (dict(ray_address="auto"), "ray_address needs backend='ray'"),
        (dict(backend="ray", trainer_workers=0), "trainer_workers must be >= 1"),
        (dict(backend="ray", placement="mixed"), "placement must be one of"),
        (dict(backend="ray", placement="colocated"), "set rollout_workers >= 1"),
        (dict(backend="ray", model="tiny-moe"), "does not support MoE"),
        (dict(backend="ray", lora_rank=4), "does not support LoRA"),
        (dict(activation_checkpointing=True), "activation_checkpointing need backend='ray'"),
        (dict(backend="ray", fsdp_param_dtype="int8"), "fsdp_param_dtype must be bfloat16"),
    ],
)
def test_bad_scale_fields(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        build(TrainConfig, overrides=overrides)


def test_ray_fields_build():
    cfg = build(TrainConfig, overrides=dict(backend="ray", trainer_workers=2, rollout_workers=1))
    assert (cfg.backend.backend, cfg.backend.trainer_workers, cfg.backend.rollout_workers) == (
        "ray",
        2,
        1,
    )
    check_backend_available(build(TrainConfig).backend)  # local: nothing to check


# Reaching a cluster needs Ray itself; without it the check stops at "Ray is not installed"
# (tested below). In CI (GSPO_REQUIRE_RAY=1) a missing Ray fails instead of skipping.
needs_ray = pytest.mark.skipif(
    importlib.util.find_spec("ray") is None and os.environ.get("GSPO_REQUIRE_RAY") != "1",
    reason="Ray is not installed (pip install -e '.[ray]')",
)


@needs_ray
@pytest.mark.slow
def test_unreachable_cluster_is_a_config_error():
    with socket.socket() as s:  # a port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = build(TrainConfig, overrides=dict(backend="ray", ray_address=f"ray://127.0.0.1:{port}"))
    with pytest.raises(ConfigError, match=f"nothing answers at 127.0.0.1:{port}"):
        check_backend_available(cfg.backend, timeout_s=1.0)


def test_ray_missing_is_a_config_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    cfg = build(TrainConfig, overrides=dict(backend="ray"))
    with pytest.raises(ConfigError, match=r"needs Ray, which is not installed: pip install"):
        check_backend_available(cfg.backend)
