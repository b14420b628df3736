"""Joining a Ray cluster the way Ray users start one (``ray start --head``), not only the
private Ray a run starts for itself.

- **Authentication.** Ray 2.60 turns token authentication on for ``ray start --head`` when a
  token exists on the machine (``~/.ray/auth_token``, which any earlier ``ray.init()`` writes),
  and a driver must then connect in token mode. Ray switches a driver to token mode by itself
  only for ``address='auto'``; with ``HOST:PORT`` it connects without the token and fails after
  20 s. :func:`use_token_if_available` does what ``auto`` does for every address: token mode
  when ``RAY_AUTH_MODE`` is unset and a token is at hand (``RAY_AUTH_TOKEN``,
  ``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``). A token-mode driver also joins a cluster
  started without authentication (measured with Ray 2.60), so nothing is lost by it.
- **'auto'.** Ray's own ``auto`` joins any Ray running on the machine, another gspo run's
  private instance included. :func:`resolve_address` picks among the clusters whose nodes run
  here, leaving out those whose temp dir carries :data:`PRIVATE_MARK` (written by
  :func:`gspo.backend.ray_cluster.start_ray` into every private instance's temp dir).
"""

from __future__ import annotations

import os
from pathlib import Path

from gspo.config.fields import ConfigError

PRIVATE_MARK = "gspo-private-ray"
"""File in a private Ray's temp dir: this instance belongs to one gspo run; 'auto' skips it."""

DEFAULT_TEMP_DIR = "/tmp/ray"
"""Where ``ray start`` keeps its files (and ``ray_current_cluster``, the address it started)
unless ``--temp-dir`` or RAY_TMPDIR says otherwise."""


def token_path() -> Path:
    """Where Ray 2.60 reads the token from (``RAY_AUTH_TOKEN_PATH``, else ``~/.ray/auth_token``)."""
    return Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")


def token_available() -> bool:
    if os.environ.get("RAY_AUTH_TOKEN", "").strip():
        return True
    try:
        return bool(token_path().read_text().strip())
    except OSError:
        return False


def use_token_if_available() -> bool:
    """Whether the driver connects in token mode; switches to it (for this process and the
    processes it starts) when ``RAY_AUTH_MODE`` is unset and a token is available. An explicit
    ``RAY_AUTH_MODE`` is left as the user set it."""
    mode = os.environ.get("RAY_AUTH_MODE")
    if mode is not None:
        return mode.lower() == "token"
    if not token_available():
        return False
    os.environ["RAY_AUTH_MODE"] = "token"
    try:  # Ray caches its config at import: reload it so this process sees the mode too
        from ray._raylet import Config

        Config.initialize("")
    except (ImportError, AttributeError):
        pass
    return True


def connect_hint(address: str) -> str:
    """What to check when joining ``address`` failed (one line, for the error message)."""
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "token":
        where = "RAY_AUTH_TOKEN" if os.environ.get("RAY_AUTH_TOKEN") else str(token_path())
        return (
            f"is the cluster running, and is this machine's token ({where}) the head's? "
            "(`ray get-auth-token` on the head prints it)"
        )
    return (
        "if the cluster uses token authentication (Ray 2.60's default for `ray start --head` "
        f"once a token exists), copy the head's token (`ray get-auth-token` there) to "
        f"{token_path()} or set RAY_AUTH_TOKEN"
    )


def _raylets() -> list[list[str]]:
    """The command lines of the Ray nodes (raylet processes) running on this machine."""
    found = []
    proc = Path("/proc")
    if proc.is_dir():
        for entry in proc.iterdir():
            if not entry.name.isdigit():
                continue
            try:
                args = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:  # gone meanwhile, or not ours to read
                continue
            if args and os.path.basename(args[0]) == "raylet":
                found.append(" ".join(args).split())
        return found
    try:  # not Linux: psutil (Ray ships it)
        import psutil
    except ImportError:
        return found
    for p in psutil.process_iter(["cmdline"]):
        args = p.info.get("cmdline") or []
        if args and os.path.basename(args[0]) == "raylet":
            found.append(" ".join(args).split())
    return found


def _flag(args: list[str], *names: str) -> str | None:
    for arg in args:
        for name in names:
            if arg.startswith(name + "="):
                value = arg.split("=", 1)[1]
                if value and value != "None":
                    return value
    return None


def local_clusters() -> dict[str, bool]:
    """{GCS address: private} of every Ray cluster with a node on this machine; private: the
    node's temp dir holds :data:`PRIVATE_MARK` (a gspo run's own instance)."""
    clusters: dict[str, bool] = {}
    for args in _raylets():
        gcs = _flag(args, "--gcs-address", "--gcs_address")
        if gcs is None:
            continue
        temp = _flag(args, "--temp-dir", "--temp_dir")
        private = temp is not None and (Path(temp) / PRIVATE_MARK).exists()
        clusters[gcs] = clusters.get(gcs, False) or private
    return clusters


def _last_started() -> str | None:
    """The address the last ``ray start --head`` with the default temp dir wrote."""
    base = os.environ.get("RAY_TMPDIR")
    path = Path(base, "ray") if base else Path(DEFAULT_TEMP_DIR)
    try:
        return (path / "ray_current_cluster").read_text().strip() or None
    except OSError:
        return None


def resolve_address(address: str | None) -> str | None:
    """The cluster address to join: ``address`` itself, or for 'auto' the one cluster started
    with ``ray start`` on this machine (``RAY_ADDRESS`` first, as Ray does), never a gspo run's
    private instance. ConfigError in one line when there is none or more than one."""
    if address != "auto":
        return address
    env = os.environ.get("RAY_ADDRESS", "")
    if env and env != "auto":
        return env
    clusters = local_clusters()
    public = sorted(a for a, private in clusters.items() if not private)
    skipped = len(clusters) - len(public)
    note = f" ({skipped} private Ray instance(s) of gspo runs left out)" if skipped else ""
    last = _last_started()
    if last in public:
        return last
    if len(public) == 1:
        return public[0]
    if not public:
        raise ConfigError(
            f"ray_address 'auto': no Ray cluster started with 'ray start' runs on this "
            f"machine{note}; start one (ray start --head) or pass its HOST:PORT"
        )
    raise ConfigError(
        f"ray_address 'auto': {len(public)} Ray clusters run on this machine "
        f"({', '.join(public)}){note}; pass the one to join as --ray-address HOST:PORT"
    )
