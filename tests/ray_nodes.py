"""Ray nodes started as Ray users start them (``ray start``), for tests: each node with its own
temp dir, free ports picked at run time and custom resources, and a stop that ends only this
node's processes (``ray stop`` has no address: it stops every Ray on the machine, other
people's included).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

RAY = [sys.executable, "-m", "ray.scripts.scripts"]
"""The `ray` command of this Python (the script Ray installs runs the same ``main``)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def auth_env(token_dir: Path) -> dict[str, str]:
    """The environment of a cluster with token authentication on (Ray 2.60's default once a
    token exists), its token in a file of its own (not the user's ~/.ray/auth_token)."""
    token = token_dir / "auth_token"
    token.write_text(uuid.uuid4().hex)
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}


class RayNode:
    """One ``ray start`` node (``head``, or a worker joining ``address``)."""

    def __init__(
        self,
        *,
        cpus: int,
        resources: dict[str, float],
        env: dict[str, str],
        address: str | None = None,
    ):
        # Ray's socket paths must stay short: a folder right under /tmp.
        self.temp_dir = tempfile.mkdtemp(prefix="gspo-rn-", dir="/tmp")
        self.head = address is None
        ports = {
            "--node-manager-port": free_port(),
            "--object-manager-port": free_port(),
            "--dashboard-agent-listen-port": free_port(),
            "--dashboard-agent-grpc-port": free_port(),
            "--metrics-export-port": free_port(),
            "--runtime-env-agent-port": free_port(),
        }
        cmd = [
            *RAY,
            "start",
            f"--temp-dir={self.temp_dir}",
            f"--num-cpus={cpus}",
            f"--resources={json.dumps(resources)}",
            "--disable-usage-stats",
        ]
        if self.head:
            self.port = free_port()
            self.address = f"127.0.0.1:{self.port}"
            ports.update({"--ray-client-server-port": free_port(), "--dashboard-port": free_port()})
            cmd += [
                "--head",
                f"--port={self.port}",
                "--include-dashboard=false",
                "--object-store-memory=200000000",
            ]
        else:
            self.address = address
            cmd += [f"--address={address}", "--object-store-memory=200000000"]
        cmd += [f"{k}={v}" for k, v in ports.items()]
        full_env = {**os.environ, **env}
        full_env.pop("RAY_ADDRESS", None)
        started = subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=120)
        if started.returncode != 0:
            self.stop()
            raise RuntimeError(f"ray start failed ({started.returncode}): {started.stderr[-2000:]}")

    def pids(self) -> list[int]:
        """This node's processes: those whose command line names its temp dir."""
        mark = (f"={self.temp_dir}", f"{self.temp_dir}/session_")
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                args = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue
            if any(a.endswith(mark[0]) or mark[1] in a for a in args):
                found.append(int(entry.name))
        return found

    def stop(self, grace_s: float = 5.0) -> None:
        """SIGTERM this node's processes, SIGKILL what is left after ``grace_s``, remove its
        temp dir. Never touches another cluster."""
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 1.0)):
            pids = self.pids()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):  # ended meanwhile
                    os.kill(pid, sig)
            deadline = time.monotonic() + wait
            while pids and time.monotonic() < deadline and self.pids():
                time.sleep(0.1)
        shutil.rmtree(self.temp_dir, ignore_errors=True)
