"""Before any work: is the scale-out backend the config asks for usable on this machine (Ray
installed, the cluster reachable)? The fields themselves are plain data in
:mod:`gspo.config.scale`."""

from __future__ import annotations

import socket

from ..backend.ray_connect import resolve_address
from ..config import ConfigError
from ..config.options_train import BackendOptions


def check_backend_available(cfg: BackendOptions, timeout_s: float = 3.0) -> None:
    """Before any work: Ray importable (backend='ray') and ``ray_address`` reachable."""
    if cfg.backend != "ray":
        return

    try:
        import ray  # noqa: F401
    except ImportError:
        raise ConfigError(
            "backend='ray' needs Ray, which is not installed: pip install 'gspo[ray]' (ray==2.60.0)"
        ) from None
    # 'auto': the cluster started with `ray start` here, never a run's private instance.
    address = resolve_address(cfg.ray_address)
    if address:
        host, port = _host_port(address)
        try:
            with socket.create_connection((host, port), timeout=timeout_s):
                pass
        except OSError as err:
            raise ConfigError(
                f"ray_address {address!r}: nothing answers at {host}:{port} ({err}); start the "
                "cluster (ray start --head) or leave ray_address unset for a local Ray"
            ) from None


def _host_port(address: str) -> tuple[str, int]:
    """(host, port) of 'ray://host:port', 'host:port' or 'host' (Ray's default port 6379)."""
    rest = address.split("://", 1)[-1]
    host, _, port = rest.rpartition(":")
    if not host:
        return rest, 6379
    try:
        return host, int(port)
    except ValueError:
        raise ValueError(f"ray_address {address!r}: expected host:port") from None
