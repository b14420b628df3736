"""Per-run control groups for the sandbox: one memory bound and one task bound per run.

RLIMIT_AS bounds each process, not the run: memory that no process maps (tmpfs files, shared
memory) or that many processes hold together escapes it. A cgroup charges all of it, page
cache and tmpfs/shmem pages included, to the run. Each run gets its own cgroup, created here
by the caller before the run starts, joined by the boot stage (so everything the run starts
is inside it from its first instruction), and emptied and removed at teardown.

Backends, first that works wins (``detect``):

* ``v2``: the unified hierarchy. The caller's own cgroup (or ``parent`` given by the user)
  must offer ``memory`` and ``pids`` in ``cgroup.subtree_control`` (delegated), or let us
  enable them there; ``memory.max``, ``memory.swap.max = 0``, ``pids.max``.
* ``v1``: the legacy ``memory`` and ``pids`` hierarchies (hybrid hosts such as this
  project's machines, where the v2 tree has no controllers). ``memory.limit_in_bytes`` (and
  ``memory.memsw.limit_in_bytes`` where swap accounting exists), ``pids.max``. Both count
  tmpfs and shared memory pages like v2 does.
* none: the sandbox falls back to per-process limits; ``Isolation.missing`` says why.

CPU, where the host offers it (v2 ``cpu`` delegated, or the v1 ``cpu`` and ``cpuacct``
hierarchies): each run is its own group for the scheduler, so a run gets the same share of a
busy CPU whether it has one process or eight (a run cannot take CPU from its neighbours by
forking spinners), a quota of :data:`RUN_CPUS` cores, and a CPU-time counter covering every
process of the run, which the caller reads to enforce the run's CPU-time limit.

Only the standard library; nothing here runs inside the sandbox.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass

logger = logging.getLogger("gspo.sandbox")

_MOUNTINFO = "/proc/self/mountinfo"
_SELF_CGROUP = "/proc/self/cgroup"


@dataclass(frozen=True)
class Backend:
    """Where per-run cgroups are made: ``version`` and one parent directory per hierarchy."""

    version: str
    """``v2`` or ``v1``."""
    parents: tuple[str, ...]
    """v2: (parent,); v1: (memory parent, pids parent)."""
    cpu_parents: tuple[str, ...] = ()
    """v1: the cpu and cpuacct parents (one if they are mounted together); v2: (parent,) when
    the cpu controller is enabled for children; () when there is no CPU control."""


# CPU quota of one run, in cores: a run cannot use more than this, whatever it forks.
RUN_CPUS = 1
_PERIOD_US = 100_000


def _mounts() -> list[tuple[str, str, str, set[str]]]:
    """(mount point, root inside the hierarchy, fstype, super options) of cgroup mounts."""
    found = []
    with open(_MOUNTINFO) as f:
        for line in f:
            fields = line.split()
            sep = fields.index("-")
            fstype, super_opts = fields[sep + 1], fields[sep + 3]
            if fstype in ("cgroup", "cgroup2"):
                found.append((fields[4], fields[3], fstype, set(super_opts.split(","))))
    return found


def _own_paths() -> dict[str, str]:
    """Controller name ('' for v2) -> this process's cgroup path, from /proc/self/cgroup."""
    paths = {}
    with open(_SELF_CGROUP) as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for name in controllers.split(",") if controllers else [""]:
                paths[name] = path
    return paths


def _join(mount: str, root: str, path: str) -> str:
    if root != "/" and path.startswith(root):
        path = path[len(root) :]
    return os.path.normpath(mount + "/" + path.lstrip("/"))


def _v2_parent(parent: str | None) -> tuple[str | None, str]:
    """A v2 directory whose children get memory and pids controllers, or (None, reason)."""
    if parent is None:
        mount = next((m for m in _mounts() if m[2] == "cgroup2"), None)
        own = _own_paths().get("")
        if mount is None or own is None:
            return None, "no cgroup v2 hierarchy"
        parent = _join(mount[0], mount[1], own)
    try:
        with open(os.path.join(parent, "cgroup.controllers")) as f:
            available = set(f.read().split())
        control = os.path.join(parent, "cgroup.subtree_control")
        with open(control) as f:
            enabled = set(f.read().split())
    except OSError as exc:
        return None, f"v2 {parent}: {exc.strerror}"
    wanted = {"memory", "pids"}
    if not wanted <= available:
        return None, f"v2 {parent} offers {sorted(available) or 'no controllers'}, not memory+pids"
    if "cpu" in available:
        wanted.add("cpu")
    if not wanted <= enabled:
        try:
            with open(control, "w") as f:
                f.write(" ".join("+" + c for c in sorted(wanted - enabled)))
        except OSError as exc:
            # EBUSY: the parent holds processes (the "no internal processes" rule); run the
            # trainer in a delegated cgroup (systemd-run --scope -p Delegate=yes) instead.
            if "cpu" in wanted - enabled and {"memory", "pids"} <= enabled:
                return parent, ""  # memory and pids are there; runs go without CPU control
            return None, f"v2 {parent}: cannot enable memory+pids for children ({exc.strerror})"
    return parent, ""


def _v1_cpu_parents() -> tuple[str, ...]:
    """The v1 cpu and cpuacct parent directories, or () if either hierarchy is missing."""
    own = _own_paths()
    parents: list[str] = []
    for controller in ("cpu", "cpuacct"):
        mount = next((m for m in _mounts() if m[2] == "cgroup" and controller in m[3]), None)
        if mount is None or controller not in own:
            return ()
        path = _join(mount[0], mount[1], own[controller])
        if path not in parents:
            parents.append(path)
    return tuple(parents)


def _v1_parents() -> tuple[tuple[str, str] | None, str]:
    own = _own_paths()
    parents = []
    for controller in ("memory", "pids"):
        mount = next((m for m in _mounts() if m[2] == "cgroup" and controller in m[3]), None)
        if mount is None or controller not in own:
            return None, f"no cgroup v1 {controller} hierarchy"
        parents.append(_join(mount[0], mount[1], own[controller]))
    return (parents[0], parents[1]), ""


def _probe(backend: Backend) -> str:
    """'' if a child cgroup can be made and removed under every parent, else why not."""
    name = f"gspo-sandbox-probe-{os.getpid()}-{threading.get_ident()}"
    for parent in backend.parents:
        path = os.path.join(parent, name)
        try:
            os.mkdir(path)
        except FileExistsError:
            pass
        except OSError as exc:
            return f"{backend.version} {parent}: {exc.strerror}"
        with contextlib.suppress(OSError):
            os.rmdir(path)
    return ""


_detected: dict[str | None, tuple[Backend | None, str]] = {}
_detect_lock = threading.Lock()


def detect(parent: str | None = None) -> tuple[Backend | None, str]:
    """The backend per-run cgroups will use (cached), or (None, why there is none)."""
    with _detect_lock:
        if parent not in _detected:
            _detected[parent] = _detect(parent)
            backend = _detected[parent][0]
            if backend is not None:
                sweep_stale(backend)
        return _detected[parent]


def sweep_stale(backend: Backend) -> None:
    """Remove the empty run cgroups of callers that died without their teardown (SIGKILL):
    their runs died with them (parent-death signals), their directories stayed."""
    for parent in {*backend.parents, *backend.cpu_parents}:
        try:
            names = os.listdir(parent)
        except OSError:
            continue
        for name in names:
            fields = name.split("-")
            if not name.startswith("gspo-sandbox-") or len(fields) < 4:
                continue
            try:
                os.kill(int(fields[2]), 0)
                continue  # its caller lives (or the pid is someone else's now)
            except (ValueError, PermissionError):
                continue
            except ProcessLookupError:
                pass
            with contextlib.suppress(OSError):
                os.rmdir(os.path.join(parent, name))


def _detect(parent: str | None) -> tuple[Backend | None, str]:
    if not os.path.exists(_SELF_CGROUP):
        return None, "no cgroups on this system"
    reasons = []
    v2, why = _v2_parent(parent)
    if v2 is not None:
        backend = Backend("v2", (v2,))
        why = _probe(backend)
        if not why:
            if _v2_cpu_enabled(v2):
                backend = Backend("v2", (v2,), (v2,))
            return backend, ""
    reasons.append(why)
    if parent is None:
        v1, why = _v1_parents()
        if v1 is not None:
            backend = Backend("v1", v1)
            why = _probe(backend)
            if not why:
                cpu = _v1_cpu_parents()
                if cpu and not _probe(Backend("v1", cpu)):
                    backend = Backend("v1", v1, cpu)
                return backend, ""
        reasons.append(why)
    return None, "; ".join(reasons)


def _v2_cpu_enabled(parent: str) -> bool:
    try:
        with open(os.path.join(parent, "cgroup.subtree_control")) as f:
            return "cpu" in f.read().split()
    except OSError:
        return False


_counter = itertools.count()


class RunCgroup:
    """The cgroup(s) of one run. ``procs_files`` are written by the boot stage with its pid."""

    def __init__(self, backend: Backend, memory_bytes: int, pids_max: int) -> None:
        self.backend = backend
        name = f"gspo-sandbox-{os.getpid()}-{next(_counter)}-{os.urandom(4).hex()}"
        self.dirs = [os.path.join(parent, name) for parent in backend.parents]
        self.cpu_dirs = [os.path.join(parent, name) for parent in backend.cpu_parents]
        self.dirs += [path for path in self.cpu_dirs if path not in self.dirs]
        try:
            for path in self.dirs:
                os.mkdir(path, 0o755)
            if backend.version == "v2":
                path = self.dirs[0]
                self._write(path, "memory.max", memory_bytes)
                self._write(path, "memory.swap.max", 0, optional=True)
                self._write(path, "pids.max", pids_max)
                if self.cpu_dirs:
                    self._write(path, "cpu.max", f"{RUN_CPUS * _PERIOD_US} {_PERIOD_US}")
            else:
                memory, pids = self.dirs[:2]
                self._write(memory, "memory.limit_in_bytes", memory_bytes)
                self._write(memory, "memory.memsw.limit_in_bytes", memory_bytes, optional=True)
                self._write(pids, "pids.max", pids_max)
                if self.cpu_dirs:
                    self._write(self.cpu_dirs[0], "cpu.cfs_period_us", _PERIOD_US)
                    self._write(self.cpu_dirs[0], "cpu.cfs_quota_us", RUN_CPUS * _PERIOD_US)
        except OSError:
            self.remove()
            raise
        self.procs_files = [os.path.join(path, "cgroup.procs") for path in self.dirs]

    @property
    def cpu_controlled(self) -> bool:
        """Whether the run has a CPU share, quota and CPU-time counter of its own."""
        return bool(self.cpu_dirs)

    def cpu_counter(self) -> tuple[str, str] | None:
        """The file of the run's CPU counter and its unit (``us``: cgroup v2 ``cpu.stat``,
        ``ns``: v1 ``cpuacct.usage``), for the test harness to read per test."""
        if not self.cpu_dirs:
            return None
        if self.backend.version == "v2":
            return os.path.join(self.cpu_dirs[0], "cpu.stat"), "us"
        return os.path.join(self.cpu_dirs[-1], "cpuacct.usage"), "ns"

    def cpu_usage_s(self) -> float | None:
        """CPU seconds used so far by every process of the run (None without CPU control)."""
        if not self.cpu_dirs:
            return None
        try:
            if self.backend.version == "v2":
                with open(os.path.join(self.cpu_dirs[0], "cpu.stat")) as f:
                    stat = dict(line.split() for line in f if line.strip())
                return int(stat["usage_usec"]) / 1e6
            with open(os.path.join(self.cpu_dirs[-1], "cpuacct.usage")) as f:
                return int(f.read()) / 1e9
        except (OSError, ValueError, KeyError):
            return None

    @staticmethod
    def _write(directory: str, name: str, value: int | str, *, optional: bool = False) -> None:
        path = os.path.join(directory, name)
        if optional and not os.path.exists(path):
            return
        with open(path, "w") as f:
            f.write(str(value))

    def pids(self) -> list[int]:
        found: set[int] = set()
        for path in self.dirs:
            with contextlib.suppress(OSError), open(os.path.join(path, "cgroup.procs")) as f:
                found.update(int(line) for line in f if line.strip())
        return sorted(found)

    def memory_limit_hit(self) -> bool:
        """Whether the run ran into its memory bound (an OOM kill or a refused charge)."""
        memory = self.dirs[0]
        try:
            if self.backend.version == "v2":
                with open(os.path.join(memory, "memory.events")) as f:
                    events = dict(line.split() for line in f if line.strip())
                return int(events.get("max", 0)) > 0 or int(events.get("oom_kill", 0)) > 0
            counts = []
            for name in ("memory.failcnt", "memory.memsw.failcnt"):
                with contextlib.suppress(FileNotFoundError), open(os.path.join(memory, name)) as f:
                    counts.append(int(f.read()))
            with open(os.path.join(memory, "memory.oom_control")) as f:
                control = dict(line.split() for line in f if line.strip())
            counts.append(int(control.get("oom_kill", 0)))
            return any(counts)
        except (OSError, ValueError):
            return False

    def kill_all(self, timeout_s: float = 5.0) -> bool:
        """SIGKILL every process in the run's cgroup until it is empty; True if it emptied."""
        kill_file = os.path.join(self.dirs[0], "cgroup.kill")
        deadline = time.monotonic() + timeout_s
        while True:
            pids = self.pids()
            if not pids:
                return True
            if self.backend.version == "v2" and os.path.exists(kill_file):
                with contextlib.suppress(OSError), open(kill_file, "w") as f:
                    f.write("1")
            else:
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                return False
            time.sleep(0.005)

    def remove(self) -> None:
        """Remove the cgroup directories (after ``kill_all``); retries while tasks exit."""
        for path in self.dirs:
            for _ in range(200):
                try:
                    os.rmdir(path)
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    error = exc
                    time.sleep(0.005)
            else:
                logger.warning("sandbox cgroup %s not removed: %s", path, error)
