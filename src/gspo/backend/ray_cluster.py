"""Starting (or joining) Ray with bounded resources, and finding free ports, before any work."""

from __future__ import annotations

import os
import socket
import tempfile
from typing import Any


def import_ray() -> Any:
    """``ray``, or an ImportError naming the install command."""
    try:
        import ray
    except ImportError as err:  # heavy extra: imported only when the Ray backend is asked for
        raise ImportError(
            "the Ray backend needs Ray: pip install 'gspo[ray]' (ray==2.60.0)"
        ) from err
    return ray


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_ray(
    address: str | None,
    num_cpus: int,
    object_store_bytes: int = 256 << 20,
    temp_dir: str | None = None,
) -> Any:
    """Join the cluster at ``address``, or start a private local Ray (bounded CPUs and object
    store, its own temp dir, no dashboard) so that other runs on the machine are untouched.
    ``temp_dir``: that private folder (None: $GSPO_RAY_TEMP_DIR, else a fresh one; Ray's
    socket paths must stay short, so keep it near /tmp)."""
    ray = import_ray()
    if ray.is_initialized():
        return ray
    if address:
        ray.init(address=address, log_to_driver=False)
    else:
        ray.init(
            num_cpus=num_cpus,
            object_store_memory=object_store_bytes,
            include_dashboard=False,
            log_to_driver=False,
            _temp_dir=temp_dir
            or os.environ.get("GSPO_RAY_TEMP_DIR")
            or tempfile.mkdtemp(prefix="gspo-ray-"),
        )
    return ray
