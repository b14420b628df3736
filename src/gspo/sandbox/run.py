"""The caller side of one sandboxed run: :func:`run_python` writes the run's spec, starts the
boot stage (:mod:`gspo.sandbox.boot`) in a fresh interpreter, watches its output and
status pipe under the time and output bounds, then tears everything down; :func:`isolation`
says which mechanisms runs get on this machine."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import Any

from gspo.sandbox.cancel import CANCEL, CancelScope
from gspo.sandbox.cgroup import RunCgroup
from gspo.sandbox.cgroup import detect as detect_cgroup
from gspo.sandbox.config import (
    DEFAULT_CONFIG,
    Isolation,
    RunResult,
    SandboxConfig,
    SandboxError,
)
from gspo.sandbox.interpreter import python_dirs as interpreter_dirs
from gspo.sandbox.interpreter import system_dirs
from gspo.sandbox.slots import SlotError, UidSlot, clear_keyrings, kill_uid

logger = logging.getLogger("gspo.sandbox")


# How often a run's CPU time and its caller's cancel event are looked at.
_POLL_S = 0.05
WALL_FACTOR = 10.0
WALL_SLACK_S = 5.0


def wall_backstop_s(cpu_s: float) -> float:
    """The wall-clock backstop for a CPU-time limit: far above what a run within its limit
    needs when it gets a tenth of a core (a busy machine), so only a program that sleeps or
    blocks meets it."""
    return WALL_FACTOR * cpu_s + WALL_SLACK_S


# Python-level fallback for machines without a network namespace: refuse sockets and new
# processes from inside the interpreter. Weak by design (ctypes is blocked too, but a C
# extension or a bug in the hook's coverage gets past it); docs/sandbox.md says so.
AUDIT_HOOK = r"""
import sys
def _gspo_guard(event, args, _blocked=("socket.", "subprocess.", "os.exec", "os.posix_spawn",
        "os.spawn", "os.system", "os.fork", "os.forkpty", "ctypes.", "_posixsubprocess")):
    if event.startswith(_blocked) and event != "socket.gethostname":
        raise PermissionError("sandbox: " + event + " is not allowed")
sys.addaudithook(_gspo_guard)
del _gspo_guard
"""
_AUDIT_PRELUDE = (
    AUDIT_HOOK
    + r"""
_path = sys.argv[1]
sys.argv = sys.argv[1:]
with open(_path, "rb") as _f:
    _code = compile(_f.read(), _path, "exec")
del _f, _path
exec(_code, {"__name__": "__main__", "__file__": sys.argv[0], "__builtins__": __builtins__})
"""
)


# Imported from the package directory, so the boot stage uses its cached bytecode rather than
# compiling a script on every run. The parent packages are registered as bare stubs (their
# directory only): their __init__ files (gspo's, the whole sandbox's) are not run, so boot
# imports nothing but its own modules and the standard library, as when it was one file.
_SANDBOX_DIR = os.path.dirname(os.path.abspath(__file__))
_PACKAGE_DIRS = (
    ("gspo", os.path.dirname(_SANDBOX_DIR)),
    ("gspo.sandbox", _SANDBOX_DIR),
)
_BOOT_COMMAND = (
    "import sys\n"
    f"for name, path in {_PACKAGE_DIRS!r}:\n"
    "    package = type(sys)(name)\n"
    "    package.__path__ = [path]\n"
    "    sys.modules[name] = package\n"
    "from gspo.sandbox.boot import main; main()"
)


_SAFE_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


def run_python(
    code: str,
    *,
    stdin: str | bytes = b"",
    files: Mapping[str, str | bytes] | None = None,
    args: Sequence[str] = (),
    config: SandboxConfig | None = None,
    result_channel: bool = False,
) -> RunResult:
    """Run ``code`` as a Python program in the sandbox and return what it did.

    ``stdin`` is fed to the program; ``files`` (flat names -> contents) are placed in its
    working directory next to the program (``main.py``); ``args`` become ``sys.argv[1:]``.
    With ``result_channel``, the program is the trusted test harness
    (:mod:`gspo.sandbox.judge`): it finds a writable file descriptor number in the
    environment variable ``GSPO_RESULT_FD`` whose data comes back as :attr:`RunResult.result`,
    a readable one of the run's cgroup CPU counter in ``GSPO_CPU_FD`` (unit ``GSPO_CPU_UNIT``,
    ``us`` or ``ns``) when there is one, and, where the sandbox falls back to the audit hook,
    ``GSPO_AUDIT_HOOK=1`` instead of the hook: it installs :data:`AUDIT_HOOK` in the
    processes it starts for untrusted code.

    Never raises for anything the program does (crash, hang, bomb, attack); raises
    :class:`SandboxError` if the sandbox cannot be set up, and ValueError for bad arguments.
    With a :class:`~gspo.sandbox.cancel.CancelScope` in :data:`CANCEL` (set by
    ``with_timeout``), the run is killed as soon as the scope is cancelled.
    """
    config = config or DEFAULT_CONFIG
    config.validate()
    files = dict(files or {})
    for name in files:
        if not name or name.startswith(".") or not set(name) <= _SAFE_NAME_CHARS:
            raise ValueError(f"file names must be plain names like 'data.txt', got {name!r}")
        if name == "main.py":
            raise ValueError("'main.py' is the program itself; choose another file name")
    python = os.path.abspath(config.python or sys.executable)
    if not os.path.isfile(python):
        raise SandboxError(f"interpreter not found: {python}")
    is_root = os.geteuid() == 0
    scope = CANCEL.get()
    if scope is None:
        return _run(code, stdin, files, args, config, result_channel, python, is_root, None)
    scope._enter()
    try:
        return _run(code, stdin, files, args, config, result_channel, python, is_root, scope)
    finally:
        scope._exit()


def _run(
    code: str,
    stdin: str | bytes,
    files: dict[str, str | bytes],
    args: Sequence[str],
    config: SandboxConfig,
    result_channel: bool,
    python: str,
    is_root: bool,
    cancel: CancelScope | None,
) -> RunResult:

    try:
        slot = UidSlot(config.base_uid, config.uid_slots) if is_root else None
    except SlotError as exc:
        raise SandboxError(str(exc)) from None
    uid = slot.uid if slot is not None else None
    cgroup, cgroup_missing = _make_cgroup(config)
    workspace = tempfile.mkdtemp(prefix="gspo-sandbox-")
    status_r = status_w = result_r = result_w = cpu_fd = -1
    stdout_fd = stderr_fd = -1
    streams: dict[int, bytearray] = {}
    proc: subprocess.Popen[bytes] | None = None
    memory_limit = False
    try:
        files_dir = os.path.join(workspace, "files")
        # Root-only (0700): without a mount namespace the program could otherwise read the
        # originals of its inputs, the harness's nonce among them, through ../files.
        os.mkdir(files_dir, 0o700)
        for name, content in {"main.py": code, **files}.items():
            data = content.encode() if isinstance(content, str) else bytes(content)
            with open(os.path.join(files_dir, name), "wb") as f:
                f.write(data)
        stdin_path = os.path.join(workspace, "stdin")
        with open(os.open(stdin_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
            f.write(stdin.encode() if isinstance(stdin, str) else bytes(stdin))
        status_r, status_w = os.pipe()
        pass_fds = [status_w]
        if result_channel:
            result_r, result_w = os.pipe()
            pass_fds.append(result_w)
        try:
            python_dirs, hidden_dirs, python = interpreter_dirs(python, config.site_packages)
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            raise SandboxError(str(exc)) from None
        cwd = os.path.join(workspace, "work")  # used only without a mount namespace
        os.chmod(workspace, 0o711)  # the sandbox uid may traverse to its own cwd, no more
        flags = ["-I", "-B"] + ([] if config.site_packages else ["-S"])
        argv = [python, *flags, "main.py", *args]
        # Used by the boot stage instead of argv if it cannot create a network namespace.
        audit_argv = [python, *flags, "-c", _AUDIT_PRELUDE, "main.py", *args]
        cpu_counter = cgroup.cpu_counter() if cgroup is not None and result_channel else None
        if cpu_counter is not None:
            cpu_fd = os.open(cpu_counter[0], os.O_RDONLY)
            pass_fds.append(cpu_fd)
        if result_channel:
            audit_argv = argv  # the harness installs the hook in its workers itself
        cpu_s = math.ceil(config.timeout_s) + 1
        spec = {
            "caller_pid": os.getpid(),
            "cgroup_procs": cgroup.procs_files if cgroup is not None else [],
            "missing_before": cgroup_missing,
            "seccomp": config.seccomp,
            "status_fd": status_w,
            "result_fd": result_w if result_channel else None,
            "cpu_fd": cpu_fd if cpu_counter is not None else None,
            "cpu_unit": cpu_counter[1] if cpu_counter is not None else None,
            "uid": uid,
            "gid": uid,
            "namespaces": config.namespaces,
            "require_isolation": config.require_isolation,
            "python": python,
            "argv": argv,
            "audit_argv": audit_argv,
            "system_dirs": system_dirs(),
            "python_dirs": python_dirs,
            "hidden_dirs": hidden_dirs,
            "files_dir": files_dir,
            "new_root": os.path.join(workspace, "root"),
            "cwd": cwd,
            "tmpdir": cwd,
            "tmpfs_mb": config.tmpfs_mb,
            "cpu_s": cpu_s,
            "memory_bytes": config.memory_mb << 20,
            "file_bytes": config.max_file_mb << 20,
            "nofile": config.max_open_files,
            "nofile_before": 1024,
            "nproc": config.max_processes,
        }
        spec_path = os.path.join(workspace, "spec.json")
        with open(os.open(spec_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            json.dump(spec, f)
        wall_s = config.wall_timeout_s or wall_backstop_s(config.timeout_s)
        cpu_start: float | None = None
        start = time.monotonic()
        with open(stdin_path, "rb") as stdin_file:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-B", "-c", _BOOT_COMMAND, spec_path],
                stdin=stdin_file,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=pass_fds,
                start_new_session=True,  # its own process group, killed as one on timeout
                env={},
                cwd="/",
            )
        os.close(status_w)
        status_w = -1
        for fd in (result_w, cpu_fd):
            if fd >= 0:
                os.close(fd)
        result_w = cpu_fd = -1

        assert proc.stdout is not None and proc.stderr is not None
        stdout_fd, stderr_fd = proc.stdout.fileno(), proc.stderr.fileno()
        selector = selectors.DefaultSelector()
        for fd in (stdout_fd, stderr_fd, status_r, result_r):
            if fd >= 0:
                os.set_blocking(fd, False)
                selector.register(fd, selectors.EVENT_READ)
                streams[fd] = bytearray()
        status_buf = streams[status_r]
        messages: list[dict[str, Any]] = []
        # The clock starts once the program is about to exec, so boot overhead on a loaded
        # machine does not eat into its time; booting itself gets a generous bound.
        deadline = start + 30.0
        started = exited = cancelled = False
        timed_out = output_limit = False
        while selector.get_map():
            if cancel is not None and cancel.cancelled:
                cancelled = True
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = started and not exited
                break
            if started and not exited and cgroup is not None and cpu_start is not None:
                used = cgroup.cpu_usage_s()
                if used is not None and used - cpu_start > config.timeout_s:
                    timed_out = True  # the whole run's CPU time, every process counted
                    break
            for key, _ in selector.select(timeout=min(remaining, _POLL_S)):
                fd = key.fd  # type: ignore[assignment]
                try:
                    chunk = os.read(fd, 65536)
                except BlockingIOError:
                    continue
                if not chunk:
                    selector.unregister(fd)
                    continue
                buf = streams[fd]
                buf += chunk
                if fd == status_r:
                    while b"\n" in status_buf:
                        line, _, rest = bytes(status_buf).partition(b"\n")
                        status_buf[:] = rest
                        messages.append(json.loads(line))
                        if messages[-1].get("started") and not started:
                            started = True
                            deadline = time.monotonic() + wall_s
                            if cgroup is not None:
                                cpu_start = cgroup.cpu_usage_s()
                        exited = exited or "exit" in messages[-1]
                elif len(buf) > config.max_output_bytes:
                    del buf[config.max_output_bytes :]
                    output_limit = True
            if output_limit:
                break
            if proc.poll() is not None and status_r not in selector.get_map():
                # Boot and init are gone, so the program is too: drain briefly, then stop
                # (a descendant that kept our pipes open is killed below).
                deadline = min(deadline, time.monotonic() + 0.2)
        selector.close()
        duration = time.monotonic() - start
    finally:
        boot_finished = proc is not None and proc.poll() is not None
        if proc is not None:
            # The group id is boot's pid, which stays ours until we reap it below.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
        cpu_used: float | None = None
        if cgroup is not None:
            cgroup.kill_all()
            memory_limit = cgroup.memory_limit_hit()
            cpu_used = cgroup.cpu_usage_s()
            cgroup.remove()
        if uid is not None:
            kill_uid(uid)
            if not boot_finished:  # killed before boot's teardown cleared the uid's keyrings
                clear_keyrings(uid)
        for fd in (status_r, status_w, result_r, result_w, cpu_fd):
            if fd >= 0:
                os.close(fd)
        if slot is not None:
            slot.release()
        shutil.rmtree(workspace, ignore_errors=True)
    if cancelled:
        raise SandboxError("run cancelled: its caller stopped waiting (run killed)")

    isolation_info = Isolation(frozenset(), ("boot failed",))
    returncode: int | None = None
    error: str | None = None
    for message in messages:
        if "isolation" in message:
            isolation_info = Isolation(frozenset(message["isolation"]), tuple(message["missing"]))
        if "error" in message:
            error = message["error"]
        if "exit" in message and not timed_out and not output_limit:
            returncode = message["exit"] if message["signal"] is None else -message["signal"]
    stderr = streams.get(stderr_fd, bytearray())
    # Only boot, init and the pre-exec stage write "error" (the program never holds the status
    # pipe), so it always means the program did not run: a sandbox problem, not a score of 0.
    if error is not None:
        if "required isolation" in error:
            raise SandboxError(error)
        raise SandboxError(f"sandbox setup failed: {error}; boot stderr: {bytes(stderr[-2000:])!r}")
    if not started:
        raise SandboxError(f"sandbox failed to start; boot stderr: {bytes(stderr[-2000:])!r}")
    _log_summary_once(isolation_info)
    if returncode is None and not (timed_out or output_limit):
        error = "the sandbox ended without reporting the program's exit status"
    return RunResult(
        returncode=returncode,
        stdout=bytes(streams.get(stdout_fd, b"")).decode("utf-8", "replace"),
        stderr=bytes(stderr).decode("utf-8", "replace"),
        timed_out=timed_out,
        output_limit=output_limit,
        duration_s=duration,
        isolation=isolation_info,
        result=bytes(streams[result_r]) if result_r in streams else b"",
        error=error,
        memory_limit=memory_limit,
        cpu_s=cpu_used,
    )


_summary_logged = False


def _log_summary_once(info: Isolation) -> None:
    """The startup line: which guarantees hold here (a warning when some are missing)."""
    global _summary_logged
    if not _summary_logged:
        _summary_logged = True
        (logger.warning if info.missing else logger.info)("%s", info.summary())


def _make_cgroup(config: SandboxConfig) -> tuple[RunCgroup | None, list[str]]:
    """The run's cgroup, or None and the reason for ``Isolation.missing``."""
    if not config.cgroup:
        return None, ["cgroup: disabled (SandboxConfig.cgroup=False)"]
    backend, why = detect_cgroup(config.cgroup_parent)
    if backend is None:
        return None, [f"cgroup: {why}"]
    try:
        # Boot and init are in it too, so the task bound has room for them.
        return RunCgroup(backend, config.run_memory_mb << 20, config.max_processes + 2), []
    except OSError as exc:
        return None, [f"cgroup: creating the run's cgroup failed: {exc}"]


_isolation_cache: dict[SandboxConfig, Isolation] = {}


def isolation(config: SandboxConfig | None = None) -> Isolation:
    """The mechanisms a sandboxed run gets on this machine (runs a trivial program once)."""
    config = config or DEFAULT_CONFIG
    if config not in _isolation_cache:
        _isolation_cache[config] = run_python("pass", config=config).isolation
    return _isolation_cache[config]
