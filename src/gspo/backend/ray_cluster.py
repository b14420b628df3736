"""Starting (or joining) Ray with bounded resources, and finding free ports, before any work."""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from gspo.config.fields import ConfigError

from .ray_connect import PRIVATE_MARK, connect_hint, resolve_address, use_token_if_available


def import_ray() -> Any:
    """``ray``, or an ImportError naming the install command."""
    try:
        import ray
    except ImportError as err:  # heavy extra: imported only when the Ray backend is asked for
        raise ImportError(
            "the Ray backend needs Ray: pip install 'gspo[ray]' (ray==2.60.0)"
        ) from err
    return ray


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
        return join_ray(ray, address)
    chosen = temp_dir or os.environ.get("GSPO_RAY_TEMP_DIR")
    ours = chosen is None
    if chosen is None:
        chosen = tempfile.mkdtemp(prefix="gspo-ray-")
        _SESSION["remove"] = chosen  # ours: removed by stop_ray
        # An exit that skips stop_ray (an error before the backend owns Ray, a second Ctrl-C)
        # still removes it; a SIGKILL leaves it to the watchdog below.
        atexit.register(_stop_at_exit, ray)
    # 'auto' (gspo.backend.ray_connect) never joins an instance whose temp dir holds this mark.
    Path(chosen).mkdir(parents=True, exist_ok=True)
    Path(chosen, PRIVATE_MARK).write_text(f"{os.getpid()}\n")
    # include_dashboard=False does not stop Ray 2.60 from starting dashboard.py (the head, with
    # only its usage-stats module) and waiting for it to register (~1 s of ray.init's 4.5 s
    # here), nor the raylet's DashboardAgent and RuntimeEnvAgent: no public option skips them
    # (only patching ray._private.node.Node.start_api_server, which we do not).
    try:
        ray.init(
            num_cpus=num_cpus,
            object_store_memory=object_store_bytes,
            include_dashboard=False,
            log_to_driver=False,
            _temp_dir=chosen,
        )
    except BaseException:
        stop_ray(ray)
        raise
    # A driver killed without stop_ray (SIGKILL) would leave some of Ray's processes running:
    # a watchdog in its own session kills them once this process is gone.
    _SESSION["watchdog"] = subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).with_name("ray_watchdog.py")),
            str(os.getpid()),
            *([chosen] if ours else []),  # the watchdog removes our temp dir after a SIGKILL
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    return ray


def join_ray(ray: Any, address: str) -> Any:
    """Join the cluster at ``address`` ('auto': the one started with ``ray start`` here, never
    a run's private instance), in token mode when a token is at hand (Ray 2.60's default
    authentication for ``ray start --head``); one line naming the address if that fails."""
    resolved = resolve_address(address)
    use_token_if_available()
    try:
        ray.init(address=resolved, log_to_driver=False)
    except (ConnectionError, ray.exceptions.AuthenticationError) as err:
        shown = resolved if resolved == address else f"{resolved} (from {address!r})"
        raise ConfigError(
            f"ray_address: could not join the Ray cluster at {shown}: {err}; {connect_hint(shown)}"
        ) from None
    return ray


def stop_ray(ray: Any) -> None:
    """Shut down the Ray this process started (its watchdog and, when start_ray made it, its
    temp dir too); a cluster joined by address is only disconnected from."""
    if ray.is_initialized():
        ray.shutdown()
    watchdog = _SESSION.pop("watchdog", None)
    if watchdog is not None:
        watchdog.kill()
        watchdog.wait()
    remove = _SESSION.pop("remove", None)
    if remove is not None:
        shutil.rmtree(remove, ignore_errors=True)


def _stop_at_exit(ray: Any) -> None:
    if "remove" in _SESSION or "watchdog" in _SESSION:
        stop_ray(ray)


_SESSION: dict[str, Any] = {}
"""The local Ray this process started: its watchdog process and the temp dir to remove."""
