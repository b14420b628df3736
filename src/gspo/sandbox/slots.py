"""Dedicated sandbox uids: one per concurrent run, host-wide, and their cleanup.

RLIMIT_NPROC counts every process of a uid system-wide, and the teardown kills every process
of the run's uid, so two runs must never share a uid. A slot (uid) is held with an exclusive
``flock`` on a file in one fixed host-wide directory (:data:`LOCK_DIRS`, not under TMPDIR,
so trainers with different temporary directories still coordinate), and it is handed out
only while no process of that uid is alive, whoever started it: a slot with live processes
is skipped, never cleaned up by killing them.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import logging
import os
import signal
import subprocess
import sys
import threading
import time

logger = logging.getLogger("gspo.sandbox")

# The first that exists (or can be made) as a root-owned 0700 directory is used.
LOCK_DIRS = ("/run/gspo-sandbox", "/var/lock/gspo-sandbox", "/tmp/gspo-sandbox-slots")
# How long a run waits for a free slot before the sandbox reports an error.
WAIT_S = 300.0

_lock_dir: str | None = None
_history: collections.deque[tuple[int, float, float]] = collections.deque(maxlen=100_000)
_history_lock = threading.Lock()
_live = 0  # slots this process holds now, and the most it held at once (for tests)
_peak = 0


class SlotError(RuntimeError):
    """No usable slot (lock directory unusable, or every slot busy for too long)."""


def lock_dir() -> str:
    """The host-wide directory holding one lock file per sandbox uid (made on first use)."""
    global _lock_dir
    if _lock_dir is not None:
        return _lock_dir
    problems = []
    for path in LOCK_DIRS:
        if not os.path.isdir(os.path.dirname(path)):
            continue
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
        except OSError as exc:
            problems.append(f"{path}: {exc.strerror}")
            continue
        st = os.lstat(path)
        if st.st_uid != os.geteuid() or st.st_mode & 0o077 or not os.path.isdir(path):
            problems.append(f"{path} must be a directory owned by us with mode 0700")
            continue
        _lock_dir = path
        return path
    raise SlotError("no usable directory for sandbox uid locks: " + "; ".join(problems))


def processes_of(uid: int) -> list[int]:
    """Pids whose real or effective uid is ``uid`` (from /proc)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status", "rb") as f:
                for line in f:
                    if line.startswith(b"Uid:"):
                        if uid in {int(x) for x in line.split()[1:3]}:
                            pids.append(int(entry))
                        break
        except (OSError, ValueError):
            continue  # exited meanwhile
    return pids


def live_runs(reset_peak: bool = False) -> tuple[int, int]:
    """(runs of this process holding a uid now, the most at once since the last reset)."""
    global _peak
    with _history_lock:
        now, peak = _live, _peak
        if reset_peak:
            _peak = _live
        return now, peak


def run_history() -> list[tuple[int, float, float]]:
    """(uid, held from, held until) of this process's finished runs, in CLOCK_BOOTTIME
    seconds (the clock of a process's start time in /proc), so that a check for leftover
    processes can be limited to the runs it started."""
    with _history_lock:
        return list(_history)


class UidSlot:
    """Hold one uid of ``base_uid .. base_uid + slots - 1`` for the duration of a run."""

    def __init__(self, base_uid: int, slots: int, wait_s: float = WAIT_S) -> None:
        directory = lock_dir()
        start = (os.getpid() + threading.get_ident()) % slots  # spread the callers out
        deadline = time.monotonic() + wait_s
        delay = 0.005
        skipped: dict[int, list[int]] = {}
        while True:
            for i in range(slots):
                uid = base_uid + (start + i) % slots
                fd = os.open(
                    os.path.join(directory, f"{uid}.lock"),
                    os.O_RDWR | os.O_CREAT | os.O_CLOEXEC,
                    0o600,
                )
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    continue
                alive = processes_of(uid)
                if alive:  # someone else's process (or a leftover): never ours to kill
                    os.close(fd)
                    if uid not in skipped:
                        logger.warning(
                            "sandbox uid %d is free but has live processes %s; skipped",
                            uid,
                            alive[:5],
                        )
                    skipped[uid] = alive
                    continue
                self._fd, self.uid = fd, uid
                self._since = time.clock_gettime(time.CLOCK_BOOTTIME)
                global _live, _peak
                with _history_lock:
                    _live += 1
                    _peak = max(_peak, _live)
                return
            if time.monotonic() > deadline:
                raise SlotError(
                    f"no free sandbox uid in {base_uid}..{base_uid + slots - 1} after "
                    f"{wait_s:g} s (held by other runs, or with live processes: {skipped})"
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.1)

    def release(self) -> None:
        global _live
        if self._fd >= 0:
            with _history_lock:
                _history.append((self.uid, self._since, time.clock_gettime(time.CLOCK_BOOTTIME)))
                _live -= 1
            os.close(self._fd)  # closing releases the flock
            self._fd = -1


def kill_uid(uid: int) -> None:
    """Kill every process of the run's uid, including any that left the process group.

    Called with the slot held: since the slot was handed out with no process of the uid
    alive, every one found now belongs to this run.
    """
    for attempt in range(50):
        pids = processes_of(uid)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if attempt >= 2 and os.path.exists("/bin/sh"):
            # Something keeps forking: kill(-1) as that uid kills all its processes in one
            # pass that fork cannot race (the kernel holds the task list lock).
            as_uid(uid, ["/bin/sh", "-c", "kill -9 -1"])
        time.sleep(0.01)
    logger.warning("sandbox uid %d still has processes after cleanup: %s", uid, pids)


# Empties the uid's user and user-session keyrings (KEYCTL_CLEAR of KEY_SPEC_USER_KEYRING and
# KEY_SPEC_USER_SESSION_KEYRING), for runs that were killed before boot could do it.
_CLEAR_KEYRINGS = (
    "import ctypes, os\n"
    "nr = {'x86_64': 250, 'aarch64': 219}.get(os.uname().machine)\n"
    "if nr:\n"
    "    libc = ctypes.CDLL(None)\n"
    "    for spec in (-4, -5):\n"
    "        libc.syscall(ctypes.c_long(nr), ctypes.c_long(7), ctypes.c_long(spec))\n"
)


def clear_keyrings(uid: int) -> None:
    """Empty the uid's user keyrings (a helper process running as that uid)."""
    python = next(filter(_world_executable, (sys.executable, "/usr/bin/python3")), None)
    if python is None:
        logger.warning("no interpreter the sandbox uid can run; keyrings of %d not cleared", uid)
        return
    as_uid(uid, [python, "-I", "-S", "-c", _CLEAR_KEYRINGS])


def _world_executable(path: str) -> bool:
    """Whether any user can run ``path`` (every directory on the way searchable)."""
    path = os.path.realpath(path)
    try:
        if not os.stat(path).st_mode & 0o001:
            return False
        while path != "/":
            path = os.path.dirname(path)
            if not os.stat(path).st_mode & 0o001:
                return False
    except OSError:
        return False
    return True


def as_uid(uid: int, argv: list[str]) -> None:
    subprocess.run(
        argv,
        user=uid,
        group=uid,
        extra_groups=[],
        env={},
        cwd="/",
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,
        timeout=30,
    )
