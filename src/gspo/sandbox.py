"""Run untrusted, model-written Python in a contained process; bound the time of any reward.

Two tools live here:

* :func:`run_python` runs a program in a separate process with a wall-clock and CPU time
  limit, an address-space limit, a process-count limit, a file-size limit, a fresh private
  working directory, no network and no view of the caller's files. :func:`code_reward` builds
  on it: it extracts the code from a completion, runs it against the unit tests stored in
  ``example.meta`` and returns the share of tests passed. What is and is not guaranteed is
  written down in ``docs/sandbox.md``; :func:`isolation` says which mechanisms are active on
  the machine at hand.
* :func:`with_timeout` wraps any reward function so that a call that hangs raises
  :class:`RewardTimeout` after a bound (``gspo.rewards.score`` then scores it 0 and counts it).

How a run is contained (Linux, as root; see ``docs/sandbox.md`` for the fallbacks):

    caller ──Popen──► boot (root, own session) ──unshare(mnt, net, pid, ipc, uts)──► fork
        ──► init (pid 1 of a new pid namespace): builds a tmpfs root with the system and
            Python directories bind-mounted read-only, pivots into it, then forks
        ──► program: rlimits, setuid to a dedicated unprivileged uid, no_new_privs, exec python

The boot stage is this very file run as a script (``python -I -S sandbox.py``), so it needs
nothing beyond the standard library and never runs in the (possibly multi-threaded) caller:
``preexec_fn`` is not used because it is unsafe in a process with threads.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gspo.sandbox_cgroup import RunCgroup
from gspo.sandbox_cgroup import detect as detect_cgroup
from gspo.sandbox_compare import loads as _loads
from gspo.sandbox_compare import outputs_match, parse_results, short_repr, values_match
from gspo.sandbox_python import SYSTEM_DIRS
from gspo.sandbox_python import python_dirs as interpreter_dirs
from gspo.sandbox_slots import SlotError, UidSlot, clear_keyrings, kill_uid

if TYPE_CHECKING:
    from gspo.tasks.base import Example, RewardFn

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_CONFIG",
    "Isolation",
    "RewardTimeout",
    "RewardWorkerError",
    "RunResult",
    "SandboxConfig",
    "SandboxError",
    "TestReport",
    "code_reward",
    "extract_code",
    "isolation",
    "outputs_match",
    "run_python",
    "run_tests",
    "with_timeout",
]


class SandboxError(RuntimeError):
    """The sandbox itself could not be set up (not raised for anything the program does)."""


# --------------------------------------------------------------------------------------------
# Configuration and results
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SandboxConfig:
    """Limits for one sandboxed run. The defaults suit competitive-programming solutions."""

    timeout_s: float = 10.0
    """Wall-clock limit of the program (the CPU-time limit is this, rounded up, plus 1 s)."""
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
    """Install the seccomp filter of :mod:`gspo.sandbox_seccomp` (x86_64 and aarch64)."""
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

    @property
    def ok(self) -> bool:
        """Exited by itself with status 0."""
        return self.returncode == 0 and not self.timed_out and not self.output_limit


# --------------------------------------------------------------------------------------------
# Caller side
# --------------------------------------------------------------------------------------------

# Python-level fallback for machines without a network namespace: refuse sockets and new
# processes from inside the interpreter. Weak by design (ctypes is blocked too, but a C
# extension or a bug in the hook's coverage gets past it); docs/sandbox.md says so.
_AUDIT_PRELUDE = r"""
import sys
def _gspo_guard(event, args, _blocked=("socket.", "subprocess.", "os.exec", "os.posix_spawn",
        "os.spawn", "os.system", "os.fork", "os.forkpty", "ctypes.", "_posixsubprocess")):
    if event.startswith(_blocked) and event != "socket.gethostname":
        raise PermissionError("sandbox: " + event + " is not allowed")
sys.addaudithook(_gspo_guard)
del _gspo_guard
_path = sys.argv[1]
sys.argv = sys.argv[1:]
with open(_path, "rb") as _f:
    _code = compile(_f.read(), _path, "exec")
del _f, _path
exec(_code, {"__name__": "__main__", "__file__": sys.argv[0], "__builtins__": __builtins__})
"""


# Imported from the package directory, so the boot stage uses its cached bytecode rather than
# compiling a script on every run.
_PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_BOOT_COMMAND = (
    f"import sys; sys.path.insert(0, {_PACKAGE_PARENT!r}); "
    "from gspo._sandbox_boot import main; main()"
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
    With ``result_channel``, the program finds a writable file descriptor number in the
    environment variable ``GSPO_RESULT_FD`` whose data comes back as :attr:`RunResult.result`
    (used by the test harness so that results do not mix with the program's own output).

    Never raises for anything the program does (crash, hang, bomb, attack); raises
    :class:`SandboxError` if the sandbox cannot be set up, and ValueError for bad arguments.
    """
    import selectors
    import shutil
    import signal
    import subprocess
    import tempfile
    import time

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

    try:
        slot = UidSlot(config.base_uid, config.uid_slots) if is_root else None
    except SlotError as exc:
        raise SandboxError(str(exc)) from None
    uid = slot.uid if slot is not None else None
    cgroup, cgroup_missing = _make_cgroup(config)
    workspace = tempfile.mkdtemp(prefix="gspo-sandbox-")
    status_r = status_w = result_r = result_w = -1
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
            python_dirs, hidden_dirs = interpreter_dirs(python, config.site_packages)
        except (OSError, ValueError, subprocess.SubprocessError) as exc:
            raise SandboxError(str(exc)) from None
        cwd = os.path.join(workspace, "work")  # used only without a mount namespace
        os.chmod(workspace, 0o711)  # the sandbox uid may traverse to its own cwd, no more
        flags = ["-I", "-B"] + ([] if config.site_packages else ["-S"])
        argv = [python, *flags, "main.py", *args]
        # Used by the boot stage instead of argv if it cannot create a network namespace.
        audit_argv = [python, *flags, "-c", _AUDIT_PRELUDE, "main.py", *args]
        cpu_s = math.ceil(config.timeout_s) + 1
        spec = {
            "caller_pid": os.getpid(),
            "cgroup_procs": cgroup.procs_files if cgroup is not None else [],
            "missing_before": cgroup_missing,
            "seccomp": config.seccomp,
            "status_fd": status_w,
            "result_fd": result_w if result_channel else None,
            "uid": uid,
            "gid": uid,
            "namespaces": config.namespaces,
            "require_isolation": config.require_isolation,
            "python": python,
            "argv": argv,
            "audit_argv": audit_argv,
            "system_dirs": SYSTEM_DIRS,
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
        if result_w >= 0:
            os.close(result_w)
            result_w = -1

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
        started = exited = False
        timed_out = output_limit = False
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = started and not exited
                break
            for key, _ in selector.select(timeout=min(remaining, 0.5)):
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
                            deadline = time.monotonic() + config.timeout_s
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
        if cgroup is not None:
            cgroup.kill_all()
            memory_limit = cgroup.memory_limit_hit()
            cgroup.remove()
        if uid is not None:
            kill_uid(uid)
            if not boot_finished:  # killed before boot's teardown cleared the uid's keyrings
                clear_keyrings(uid)
        for fd in (status_r, status_w, result_r, result_w):
            if fd >= 0:
                os.close(fd)
        if slot is not None:
            slot.release()
        shutil.rmtree(workspace, ignore_errors=True)

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


# --------------------------------------------------------------------------------------------
# Unit tests against model-written code
# --------------------------------------------------------------------------------------------

_FENCE_RE = None  # compiled lazily: importing re is not free and the boot stage never needs it


def extract_code(completion: str) -> str:
    """The program in a completion: the last fenced code block, preferring Python ones.

    ````` ```python ... ``` ````` (also ``py`` / ``python3``) wins over an unlabelled or other
    fence; a final fence left open (a truncated completion) counts up to the end; text without
    any fence is taken as code as it is.
    """
    import re

    global _FENCE_RE
    if _FENCE_RE is None:
        _FENCE_RE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
    blocks = [(m.group(1).lower(), m.group(2)) for m in _FENCE_RE.finditer(completion)]
    if not blocks:
        return completion.strip("\n")
    python_blocks = [code for lang, code in blocks if lang in ("python", "py", "python3")]
    return (python_blocks or [code for _, code in blocks])[-1].strip("\n")


def _decode_test_cases(value: Any, field_name: str) -> list[dict[str, Any]]:
    """LiveCodeBench-style test cases: a list, a JSON string, or base64(zlib(pickle(JSON)))."""
    if isinstance(value, list):
        cases = value
    elif isinstance(value, str):
        try:
            cases = json.loads(value)
        except json.JSONDecodeError:
            cases = json.loads(_unpickle_string(value, field_name))
    else:
        raise ValueError(f"meta[{field_name!r}] must be a list or a JSON string")
    if not isinstance(cases, list) or not all(
        isinstance(c, dict) and "input" in c and "output" in c for c in cases
    ):
        raise ValueError(f"meta[{field_name!r}] must be a list of {{'input', 'output'}} objects")
    return cases


def _unpickle_string(text: str, field_name: str) -> str:
    """Decode LiveCodeBench's compressed private tests without running pickle's code paths.

    They are base64(zlib(pickle(json_string))). An unpickler that resolves no global at all
    can only build plain values, so a hostile data file cannot execute code through it.
    """
    import base64
    import binascii
    import io
    import pickle
    import zlib

    class _NoGlobals(pickle.Unpickler):
        def find_class(self, module: str, name: str) -> Any:
            raise pickle.UnpicklingError(f"refusing to load global {module}.{name}")

    try:
        raw = zlib.decompress(base64.b64decode(text, validate=False))
        value = _NoGlobals(io.BytesIO(raw)).load()
    except (binascii.Error, zlib.error, pickle.UnpicklingError, EOFError, ValueError) as exc:
        raise ValueError(
            f"meta[{field_name!r}] is neither JSON nor base64(zlib(pickle(JSON))): {exc}"
        ) from None
    if not isinstance(value, str):
        raise ValueError(f"meta[{field_name!r}] decodes to {type(value).__name__}, not a string")
    return value


@dataclass(frozen=True)
class TestSuite:
    """The unit tests of one problem, in one of three forms (see :meth:`from_meta`)."""

    kind: str
    """``assert`` (statements run after the solution), ``stdio`` (stdin -> expected stdout) or
    ``call`` (arguments -> expected return value of ``func_name``)."""
    cases: tuple[Any, ...]
    """Statements (assert), stdin texts (stdio) or argument lists (call)."""
    expected: tuple[Any, ...] = ()
    """Expected stdout texts (stdio) or return values (call); never sent into the sandbox."""
    func_name: str | None = None

    __test__ = False  # not a pytest class

    def __len__(self) -> int:
        return len(self.cases)

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any]) -> TestSuite:
        """Read the tests from ``Example.meta``; ValueError if there are none or they are bad.

        Accepted layouts, first match wins:

        * ``tests``: a list of Python statements (usually ``assert f(2) == 4``), each one test,
          run in the namespace the solution defined (HumanEval / MBPP style);
        * ``inputs`` and ``outputs``: equal-length lists of stdin texts and expected stdout;
        * ``test_cases``, or LiveCodeBench's ``public_test_cases`` + ``private_test_cases``: a
          list (or JSON string) of ``{"input", "output", "testtype"}`` objects. ``testtype``
          ``stdin`` compares stdout; ``functional`` calls ``func_name`` (from
          ``meta["func_name"]`` or the JSON ``meta["metadata"]``) on the JSON values of the
          input's lines, on ``Solution()`` if the code defines that class (LeetCode style),
          and compares the return value with the JSON output.
        """
        if "tests" in meta:
            tests = meta["tests"]
            if isinstance(tests, str):
                tests = [tests]
            if not isinstance(tests, list) or not all(isinstance(t, str) for t in tests):
                raise ValueError("meta['tests'] must be a list of Python statements")
            if not tests:
                raise ValueError("meta['tests'] is empty")
            return cls("assert", tuple(tests))
        if "inputs" in meta or "outputs" in meta:
            inputs, outputs = meta.get("inputs"), meta.get("outputs")
            if not (isinstance(inputs, list) and isinstance(outputs, list)):
                raise ValueError("meta['inputs'] and meta['outputs'] must both be lists")
            if len(inputs) != len(outputs) or not inputs:
                raise ValueError(
                    f"meta['inputs'] ({len(inputs)}) and meta['outputs'] ({len(outputs)}) "
                    "must be non-empty and of equal length"
                )
            return cls("stdio", tuple(map(str, inputs)), tuple(map(str, outputs)))
        keys = [k for k in ("test_cases", "public_test_cases", "private_test_cases") if k in meta]
        if not keys:
            raise ValueError(
                "no tests in example.meta: expected 'tests', 'inputs'/'outputs' or "
                f"'test_cases' (have: {', '.join(map(str, meta)) or 'nothing'})"
            )
        cases = [c for k in keys if meta[k] for c in _decode_test_cases(meta[k], k)]
        if not cases:
            raise ValueError(f"{' and '.join(keys)} hold no test cases")
        types = {str(c.get("testtype", "stdin")) for c in cases}
        if len(types) != 1 or not types <= {"stdin", "functional"}:
            raise ValueError(f"test cases must all be 'stdin' or all 'functional', got {types}")
        if types == {"stdin"}:
            return cls(
                "stdio",
                tuple(str(c["input"]) for c in cases),
                tuple(str(c["output"]) for c in cases),
            )
        func_name = meta.get("func_name")
        if func_name is None and meta.get("metadata"):
            metadata = meta["metadata"]
            metadata = json.loads(metadata) if isinstance(metadata, str) else metadata
            func_name = metadata.get("func_name") if isinstance(metadata, dict) else None
        if not isinstance(func_name, str) or not func_name.isidentifier():
            raise ValueError("functional test cases need meta['func_name'] (or metadata.func_name)")
        try:
            args = tuple(
                [_loads(line) for line in str(c["input"]).split("\n") if line.strip()]
                for c in cases
            )
            expected = tuple(_loads(str(c["output"])) for c in cases)
        except (ValueError, RecursionError, ArithmeticError) as exc:
            raise ValueError(f"functional test case is not JSON: {exc}") from None
        return cls("call", args, expected, func_name)


@dataclass(frozen=True)
class TestReport:
    """Outcome of running a :class:`TestSuite` against one program."""

    passed: tuple[bool, ...]
    errors: tuple[str | None, ...]
    """Why each failed test failed (None for a pass), for logs and debugging."""
    run: RunResult

    __test__ = False

    @property
    def fraction(self) -> float:
        return sum(self.passed) / len(self.passed) if self.passed else 0.0

    @property
    def all_passed(self) -> bool:
        return bool(self.passed) and all(self.passed)


# Runs inside the sandbox as main.py. It executes the solution once (or once per stdin test),
# and reports each test on the result channel, tagged with a per-run nonce so that text the
# solution writes there by accident or on purpose is not taken for a result. Expected outputs
# of stdio / call tests never enter the sandbox: the caller compares.
_HARNESS = r"""
import builtins, io, json, os, signal, sys, threading, time

def main():
    if hasattr(sys, "set_int_max_str_digits"):
        sys.set_int_max_str_digits(0)  # answers may be integers of any length
    out = os.fdopen(int(os.environ.pop("GSPO_RESULT_FD")), "w", encoding="utf-8")
    with open("tests.json", encoding="utf-8") as f:
        cfg = json.load(f)
    os.remove("tests.json")
    nonce, kind, cases, limit = cfg["nonce"], cfg["kind"], cfg["cases"], cfg["timeout_s"]
    value_cap = cfg["value_chars"]

    def report(i, ok, value=None, error=None):
        line = json.dumps({"nonce": nonce, "i": i, "ok": ok, "value": value, "error": error},
                          default=repr)
        out.write(line + "\n")
        out.flush()

    class TestTimeout(BaseException):
        pass

    def on_alarm(signum, frame):
        raise TestTimeout(f"over the {limit} s time limit")

    signal.signal(signal.SIGALRM, on_alarm)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a too-large write raises instead of killing

    def bounded(fn):
        signal.setitimer(signal.ITIMER_REAL, limit)
        try:
            value = fn()
            # Like interpreter exit, wait for threads the code started (solutions often run
            # main() in a thread with a bigger stack for deep recursion).
            end = time.monotonic() + limit
            for t in threading.enumerate():
                if t is not threading.current_thread() and not t.daemon:
                    t.join(max(0.0, end - time.monotonic()))
            return value
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)

    def describe(exc):
        text = f"{type(exc).__name__}: {exc}"
        return text if len(text) <= 500 else text[:500] + "..."

    # Under python -S the site module's exit() / quit() are missing; solutions use them.
    builtins.exit = builtins.quit = sys.exit
    sys.argv = ["solution.py"]
    with open("solution.py", encoding="utf-8", errors="replace") as f:
        source = f.read()
    try:
        code = compile(source, "solution.py", "exec")
    except BaseException as exc:
        for i in range(len(cases)):
            report(i, False, error="does not compile: " + describe(exc))
        return
    devnull = open(os.devnull, "w")

    if kind in ("assert", "call"):
        namespace = {"__name__": "solution", "__builtins__": builtins}
        sys.stdout = devnull  # the solution's prints are not the answer here
        try:
            bounded(lambda: exec(code, namespace))
            if kind == "call":
                name = cfg["func_name"]
                cls = namespace.get("Solution")
                if isinstance(cls, type) and hasattr(cls, name):
                    target = getattr(cls(), name)
                else:
                    target = namespace[name]
        except BaseException as exc:
            for i in range(len(cases)):
                report(i, False, error="solution failed: " + describe(exc))
            return
        for i, case in enumerate(cases):
            try:
                if kind == "assert":
                    test = compile(case, f"<test {i}>", "exec")
                    bounded(lambda: exec(test, namespace))
                    report(i, True)
                else:
                    value = bounded(lambda: target(*case))
                    report(i, True, value=value)
            except BaseException as exc:
                report(i, False, error=describe(exc))
        return

    # stdio: a fresh namespace per test; fd 0 / fd 1 point at files so that open(0),
    # sys.stdin.buffer and os.write(1, ...) all behave as in a real run.
    for i, text in enumerate(cases):
        with open("stdin.txt", "w", encoding="utf-8") as f:
            f.write(text)
        # In this order, whichever of fd 0 / fd 1 the last test closed (open(0) does when
        # collected), each file ends up on the right descriptor.
        for path, flags, target in (
            ("stdin.txt", os.O_RDONLY, 0),
            ("stdout.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 1),
        ):
            fd = os.open(path, flags, 0o600)
            if fd != target:
                os.dup2(fd, target)
                os.close(fd)
        sys.stdin = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
        sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8")
        error = None
        try:
            bounded(lambda: exec(code, {"__name__": "__main__", "__builtins__": builtins}))
        except SystemExit as exc:
            if exc.code not in (None, 0):
                error = f"exit status {exc.code}"
        except BaseException as exc:
            error = describe(exc)
        try:
            sys.stdout.flush()
        except BaseException as exc:
            error = error or describe(exc)
        sys.stdout = devnull
        with open("stdout.txt", "rb") as f:
            value = f.read(value_cap).decode("utf-8", "replace")
        report(i, error is None, value=value, error=error)

main()
"""


def run_tests(
    code: str,
    suite: TestSuite,
    *,
    test_timeout_s: float = 2.0,
    total_timeout_s: float | None = None,
    config: SandboxConfig | None = None,
) -> TestReport:
    """Run ``suite`` against ``code`` in one sandboxed process; never raises for the code.

    Each test gets ``test_timeout_s`` (a SIGALRM inside the sandbox); the whole run is bounded
    by ``total_timeout_s`` (default: ``test_timeout_s`` per test plus 2 s), which also covers
    a solution that blocks the alarm. Tests not reported before the run ends fail.
    """
    import dataclasses
    import secrets

    if not (math.isfinite(test_timeout_s) and test_timeout_s > 0):
        raise ValueError(f"test_timeout_s must be positive, got {test_timeout_s!r}")
    n = len(suite)
    if total_timeout_s is None:
        total_timeout_s = test_timeout_s * n + 2.0
    config = dataclasses.replace(config or DEFAULT_CONFIG, timeout_s=total_timeout_s)
    nonce = secrets.token_hex(16)
    # Room for the expected answer and then some, so a right answer is never cut short, and
    # the whole result channel stays under the output cap.
    longest = max((len(str(e)) for e in suite.expected), default=0)
    value_chars = max(2 * longest + 1024, 4096)
    payload = {
        "nonce": nonce,
        "kind": suite.kind,
        "cases": list(suite.cases),
        "func_name": suite.func_name,
        "timeout_s": test_timeout_s,
        "value_chars": value_chars,
    }
    run = run_python(
        _HARNESS,
        files={"solution.py": code, "tests.json": json.dumps(payload)},
        config=config,
        result_channel=True,
    )
    reports, problems = parse_results(run.result, nonce, n)
    passed: list[bool] = []
    errors: list[str | None] = []
    for i in range(n):
        record = reports.get(i)
        if record is None:
            reason = "no result"
            if run.timed_out:
                reason = f"run exceeded {total_timeout_s:g} s"
            elif run.output_limit:
                reason = "output limit exceeded"
            elif run.error:
                reason = run.error
            elif run.returncode not in (0, None):
                reason = f"harness exited with status {run.returncode}: {run.stderr[-300:]}"
            if problems:
                reason += "; malformed result records: " + "; ".join(problems)
            passed.append(False)
            errors.append(reason)
            continue
        ok = record["ok"]
        error = record.get("error")
        value = record.get("value")
        if ok and suite.kind == "stdio":
            ok = isinstance(value, str) and outputs_match(value, suite.expected[i])
            error = None if ok else "wrong output"
        elif ok and suite.kind == "call":
            ok = values_match(value, suite.expected[i])
            error = None if ok else f"returned {short_repr(value)}"
        passed.append(ok)
        errors.append(
            None if ok else short_repr(error, 500) if not isinstance(error, str) else error
        )
    return TestReport(tuple(passed), tuple(errors), run)


def code_reward(
    completion: str,
    example: Example,
    *,
    all_or_nothing: bool = False,
    test_timeout_s: float = 2.0,
    total_timeout_s: float | None = None,
    config: SandboxConfig | None = None,
) -> float:
    """Share of the example's unit tests that the completion's code passes, in the sandbox.

    The code is :func:`extract_code` of the completion; the tests come from ``example.meta``
    (see :meth:`TestSuite.from_meta`). With ``all_or_nothing``, 1.0 only if every test passes.
    No code scores 0.0. Example data without usable tests raises ValueError (a data problem,
    which :func:`gspo.rewards.score` counts as an error). Select options for a registry with
    ``functools.partial(code_reward, all_or_nothing=True)``.
    """
    suite = TestSuite.from_meta(example.meta)
    code = extract_code(completion)
    if not code.strip():
        return 0.0
    report = run_tests(
        code,
        suite,
        test_timeout_s=test_timeout_s,
        total_timeout_s=total_timeout_s,
        config=config,
    )
    if report.run.error is not None:
        logger.warning("code_reward: sandbox problem: %s", report.run.error)
    return (1.0 if report.all_passed else 0.0) if all_or_nothing else report.fraction


code_reward.uses_sandbox = True  # type: ignore[attr-defined]  # gspo.rewards.reward_workers


# --------------------------------------------------------------------------------------------
# Bounded-time calls of any reward function
# --------------------------------------------------------------------------------------------


class RewardTimeout(TimeoutError):
    """A reward call did not finish within its time bound."""


class RewardWorkerError(RuntimeError):
    """The worker process of a ``mode="process"`` reward died or could not be started."""


_abandoned_lock = None


def _count_abandoned(thread: Any) -> int:
    """Remember a timed-out reward thread; return how many of those are still running."""
    import threading

    global _abandoned_lock
    if _abandoned_lock is None:
        _abandoned_lock = threading.Lock()
    with _abandoned_lock:
        _ABANDONED[:] = [t for t in _ABANDONED if t.is_alive()]
        _ABANDONED.append(thread)
        return len(_ABANDONED)


_ABANDONED: list[Any] = []


def with_timeout(fn: RewardFn, seconds: float, *, mode: str = "thread") -> RewardFn:
    """``fn`` with each call bounded to ``seconds``; a late call raises :class:`RewardTimeout`.

    ``mode="thread"`` runs each call in a daemon thread: works for any callable and costs
    ~0.1 ms, but a timed-out call keeps running in the background (Python cannot stop a
    thread), and a call stuck inside C code that holds the GIL (a catastrophic regular
    expression, say) stalls the caller too. ``mode="process"`` runs calls in a worker process
    that is killed on timeout and restarted for the next call: it bounds everything, but
    ``fn`` and the examples must be picklable (module-level functions, ``functools.partial``
    of them) and ``fn`` cannot see the caller's later changes to global state.

    The result has the reward signature, so ``gspo.rewards.score`` scores a timed-out call 0
    and counts it as an error. Call ``.close()`` on a process-mode reward to stop its worker
    (it also stops when the caller exits).
    """
    if not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"seconds must be a positive number, got {seconds!r}")
    if not callable(fn):
        raise ValueError(f"not a reward function: {fn!r}")
    name = getattr(fn, "__name__", repr(fn))
    if mode == "thread":
        return _ThreadTimeout(fn, float(seconds), name)
    if mode == "process":
        return _ProcessTimeout(fn, float(seconds), name)
    raise ValueError(f"mode must be 'thread' or 'process', got {mode!r}")


class _ThreadTimeout:
    def __init__(self, fn: RewardFn, seconds: float, name: str) -> None:
        self.fn, self.seconds, self.__name__ = fn, seconds, f"with_timeout({name})"

    def __call__(self, completion: str, example: Example) -> float:
        import threading

        box: dict[str, Any] = {}
        done = threading.Event()

        def target() -> None:
            try:
                box["value"] = self.fn(completion, example)
            except BaseException as exc:  # re-raised in the caller, which decides
                box["error"] = exc
            finally:
                done.set()

        thread = threading.Thread(target=target, name=self.__name__, daemon=True)
        thread.start()
        if not done.wait(self.seconds):
            running = _count_abandoned(thread)
            logger.warning(
                "reward %s exceeded %g s; scored as an error (%d timed-out reward threads "
                "still running)",
                self.__name__,
                self.seconds,
                running,
            )
            raise RewardTimeout(f"{self.__name__} exceeded {self.seconds:g} s")
        if "error" in box:
            raise box["error"]
        return box["value"]

    def close(self) -> None:
        """Nothing to release (for symmetry with the process mode)."""


# The worker: reads length-prefixed pickles (the function first, then (completion, example)
# pairs) on stdin and answers on the original stdout; the reward's own prints go to stderr.
_WORKER = r"""
import os, pickle, struct, sys
sys.path[:] = pickle.loads(bytes.fromhex(sys.argv[1]))
inp = os.fdopen(os.dup(0), "rb")
out = os.fdopen(os.dup(1), "wb")
os.dup2(2, 1)
def recv():
    head = inp.read(8)
    if len(head) < 8:
        sys.exit(0)
    return pickle.loads(inp.read(struct.unpack("<Q", head)[0]))
def send(obj):
    try:
        data = pickle.dumps(obj)
    except Exception as exc:
        data = pickle.dumps(("error", RuntimeError(f"unpicklable reward result: {exc!r}")))
    out.write(struct.pack("<Q", len(data)) + data)
    out.flush()
fn = recv()
send(("ready", None))
while True:
    completion, example = recv()
    try:
        send(("value", fn(completion, example)))
    except BaseException as exc:
        try:
            pickle.dumps(exc)
        except Exception:
            exc = RuntimeError(f"{type(exc).__name__}: {exc}")
        send(("error", exc))
"""

_WORKER_START_TIMEOUT_S = 120.0  # importing the reward's module (and its imports) is not timed


class _ProcessTimeout:
    def __init__(self, fn: RewardFn, seconds: float, name: str) -> None:
        import pickle
        import threading

        try:
            self._fn_bytes = pickle.dumps(fn)
        except Exception as exc:
            raise ValueError(
                f"mode='process' needs a picklable reward (a module-level function or a "
                f"functools.partial of one); {name} is not: {exc}. Use mode='thread'."
            ) from None
        self.seconds, self.__name__ = seconds, f"with_timeout({name})"
        self._lock = threading.Lock()
        self._proc: Any = None

    def _start(self) -> None:
        import pickle
        import subprocess

        self._proc = subprocess.Popen(
            [sys.executable, "-c", _WORKER, pickle.dumps(sys.path).hex()],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        self._send_raw(self._fn_bytes)
        kind, _ = self._recv(_WORKER_START_TIMEOUT_S, starting=True)
        if kind != "ready":  # pragma: no cover - protocol violation
            raise RewardWorkerError(f"reward worker sent {kind!r} instead of 'ready'")

    def _send_raw(self, data: bytes) -> None:
        import struct

        try:
            self._proc.stdin.write(struct.pack("<Q", len(data)) + data)
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            self._kill()
            raise RewardWorkerError(f"reward worker of {self.__name__} died: {exc}") from None

    def _recv(self, timeout: float, *, starting: bool = False) -> tuple[str, Any]:
        import pickle
        import select
        import struct
        import time

        stdout = self._proc.stdout
        deadline = time.monotonic() + timeout
        data = b""
        need = 8
        header_done = False
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._kill()
                if starting:
                    raise RewardWorkerError(f"reward worker of {self.__name__} did not start")
                raise RewardTimeout(f"{self.__name__} exceeded {self.seconds:g} s")
            ready, _, _ = select.select([stdout], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(stdout.fileno(), need - len(data))
            if not chunk:
                code = self._kill()
                raise RewardWorkerError(
                    f"reward worker of {self.__name__} exited (status {code}) during a call"
                )
            data += chunk
            if len(data) == need:
                if header_done:
                    return pickle.loads(data)  # type: ignore[no-any-return]
                need = struct.unpack("<Q", data)[0]
                data = b""
                header_done = True

    def _kill(self) -> int | None:
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        proc.kill()
        code = proc.wait()
        for stream in (proc.stdin, proc.stdout):
            with contextlib.suppress(OSError):
                stream.close()
        return code  # type: ignore[no-any-return]

    def __call__(self, completion: str, example: Example) -> float:
        import pickle

        with self._lock:
            if self._proc is None:
                self._start()
            try:
                request = pickle.dumps((completion, example))
            except Exception as exc:
                raise ValueError(f"example is not picklable for mode='process': {exc}") from None
            self._send_raw(request)
            try:
                kind, value = self._recv(self.seconds)
            except RewardTimeout:
                logger.warning(
                    "reward %s exceeded %g s; worker killed, scored as an error",
                    self.__name__,
                    self.seconds,
                )
                raise
            if kind == "error":
                raise value
            return value  # type: ignore[no-any-return]

    def close(self) -> None:
        """Stop the worker process (a later call starts a new one)."""
        with self._lock:
            self._kill()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self._kill()
