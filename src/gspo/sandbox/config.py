"""The sandbox's configuration and results: :class:`SandboxConfig` (limits of one run),
:class:`Isolation` (which mechanisms a run got), :class:`RunResult` and :class:`SandboxError`."""

from __future__ import annotations

import math
from dataclasses import dataclass


class SandboxError(RuntimeError):
    """The sandbox itself could not be set up (not raised for anything the program does)."""


@dataclass(frozen=True)
class SandboxConfig:
    """Limits for one sandboxed run. The defaults suit competitive-programming solutions."""

    timeout_s: float = 10.0
    """CPU-time limit of the run: every process it starts, counted together by its cgroup
    (without a cgroup's CPU counter, per process: RLIMIT_CPU, this rounded up plus 1 s). A
    busy machine slows a run down but does not use up its limit."""
    wall_timeout_s: float | None = None
    """Wall-clock backstop of the run (a program that sleeps or blocks uses no CPU); None:
    ``10 * timeout_s + 5`` (:func:`gspo.sandbox.run.wall_backstop_s`), well above what
    a run within its CPU limit needs on a loaded machine."""
    memory_mb: int = 512
    """Address-space limit (RLIMIT_AS) of each sandboxed process."""
    max_processes: int = 8
    """Processes + threads the sandbox uid may have at once (RLIMIT_NPROC; needs a dedicated
    uid, i.e. running as root, or a user namespace)."""
    max_output_bytes: int = 1 << 20
    """Cap on each of stdout, stderr and the result channel; a program exceeding it is killed."""
    max_file_mb: int = 16
    """Largest file the program may write (RLIMIT_FSIZE)."""
    tmpfs_mb: int = 64
    """Size of the private tmpfs holding the working directory, /tmp and /dev/shm."""
    max_open_files: int = 64
    """RLIMIT_NOFILE."""
    python: str | None = None
    """Interpreter to run; None: ``sys.executable``."""
    site_packages: bool = False
    """Let the program import installed packages (numpy...). Off: ``python -S`` and, with a
    mount namespace, the site-packages directories are hidden behind empty mounts."""
    base_uid: int = 61000
    """First uid of the range of dedicated sandbox uids (one per concurrent run; root only)."""
    uid_slots: int = 64
    """How many concurrent runs get their own uid (base_uid ... base_uid + uid_slots - 1)."""
    require_isolation: bool = False
    """Raise :class:`SandboxError` rather than run with any mechanism missing (no network
    namespace, no mount namespace, no dedicated uid, no pid namespace)."""
    namespaces: bool = True
    """Use Linux namespaces. Off only to exercise the fallbacks (tests) or where unsharing is
    known to misbehave; the program then sees the host filesystem (as the sandbox uid)."""
    seccomp: bool = True
    """Install the seccomp filter of :mod:`gspo.sandbox.seccomp` (x86_64 and aarch64)."""
    cgroup: bool = True
    """Put each run in its own cgroup (v2, else v1 memory + pids) where the host allows it."""
    cgroup_parent: str | None = None
    """A delegated cgroup v2 directory to create run cgroups in; None: the caller's own."""
    run_memory_mb: int = 1024
    """Memory of the whole run with a cgroup: all its processes, its tmpfs files, shared
    memory and page cache together (memory.max, or memory.limit_in_bytes on v1)."""

    def validate(self) -> None:
        """Raise ValueError listing every bad field."""
        problems = []
        if not (math.isfinite(self.timeout_s) and self.timeout_s > 0):
            problems.append(f"timeout_s must be a positive number, got {self.timeout_s!r}")
        wall = self.wall_timeout_s
        if wall is not None and not (math.isfinite(wall) and wall > 0):
            problems.append(f"wall_timeout_s must be a positive number or None, got {wall!r}")
        for name in (
            "memory_mb",
            "max_processes",
            "max_output_bytes",
            "max_file_mb",
            "tmpfs_mb",
            "max_open_files",
            "uid_slots",
            "run_memory_mb",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                problems.append(f"{name} must be a positive integer, got {value!r}")
        if self.memory_mb < 64:
            problems.append(
                f"memory_mb must be at least 64 (Python needs it), got {self.memory_mb}"
            )
        if self.run_memory_mb < 64:
            problems.append(f"run_memory_mb must be at least 64, got {self.run_memory_mb}")
        if self.max_open_files < 16:
            problems.append(f"max_open_files must be at least 16, got {self.max_open_files}")
        if not 1000 <= self.base_uid <= 2**31 - 1 - self.uid_slots:
            problems.append(f"base_uid must be an unused uid >= 1000, got {self.base_uid}")
        if problems:
            raise ValueError("invalid SandboxConfig: " + "; ".join(problems))


DEFAULT_CONFIG = SandboxConfig()


@dataclass(frozen=True)
class Isolation:
    """Which containment mechanisms a run actually got (reported by the boot stage)."""

    mechanisms: frozenset[str]
    """Subset of: ``uid`` (dedicated unprivileged uid), ``userns`` (user namespace, non-root),
    ``mountns`` (private tmpfs root; caller's files invisible), ``netns`` (no network),
    ``pidns`` (own pid namespace; all descendants die with it), ``ipcns``, ``utsns``,
    ``nproc`` (RLIMIT_NPROC applied), ``no_new_privs``, ``seccomp`` (the system-call filter),
    ``keyring`` (fresh session keyring; user keyrings cleared), ``cgroup`` (a per-run cgroup
    bounding the memory and tasks of the whole run), ``audit_hook`` (the weak fallback
    that blocks sockets and subprocesses from inside Python when there is no netns)."""
    missing: tuple[str, ...] = ()
    """Why each wanted mechanism is absent, as ``"name: reason"``."""

    @property
    def network_blocked(self) -> bool:
        return "netns" in self.mechanisms

    @property
    def files_hidden(self) -> bool:
        return "mountns" in self.mechanisms

    @property
    def processes_bounded(self) -> bool:
        return "nproc" in self.mechanisms or "cgroup" in self.mechanisms

    @property
    def run_memory_bounded(self) -> bool:
        return "cgroup" in self.mechanisms

    def summary(self) -> str:
        """One line saying which guarantees hold (logged once per process)."""
        memory = (
            "whole-run memory bounded by a cgroup (tmpfs, shared memory and page cache count)"
            if self.run_memory_bounded
            else "memory bounded per process only (RLIMIT_AS; no cgroup)"
        )
        line = f"sandbox: active {', '.join(sorted(self.mechanisms)) or 'nothing'}; {memory}"
        return line + (f"; missing: {'; '.join(self.missing)}" if self.missing else "")


@dataclass(frozen=True)
class RunResult:
    """What a sandboxed program did."""

    returncode: int | None
    """Exit status; negative -N if it died of signal N; None if the sandbox killed it."""
    stdout: str
    stderr: str
    timed_out: bool
    """Killed at its CPU-time limit or its wall-clock backstop (it did not exit by itself)."""
    output_limit: bool
    """Killed for writing more than ``max_output_bytes`` to a stream."""
    duration_s: float
    isolation: Isolation
    result: bytes = b""
    """What the program wrote to the result channel (file descriptor ``GSPO_RESULT_FD``)."""
    error: str | None = None
    """Set when the sandbox ended without reporting the program's exit status (init killed
    from outside, e.g. by the kernel's OOM killer). Setup failures raise SandboxError."""
    memory_limit: bool = False
    """The run reached its cgroup memory bound (``run_memory_mb``)."""
    cpu_s: float | None = None
    """CPU seconds used by all the run's processes (None without a cgroup CPU counter)."""

    @property
    def ok(self) -> bool:
        """Exited by itself with status 0."""
        return self.returncode == 0 and not self.timed_out and not self.output_limit
