"""Watch a driver that started a local Ray; when it dies without shutting Ray down (SIGKILL,
OOM), kill what it had started, so that no Ray or worker process outlives the run.

Run as a script (stdlib only, no package import): ``python ray_watchdog.py DRIVER_PID
[TEMP_DIR]`` (TEMP_DIR: the driver's private Ray folder, removed after the kill), in its
own session so that a signal to the driver's process group spares it. Every 0.5 s it records
the driver's process tree (pid and start time, read from /proc). Once the driver is gone it
stops (SIGSTOP) every recorded process that still has the same start time (no reused pid is
hit), adds the descendants they made since the last record (a worker the raylet started in
the last 0.5 s: missing it left two processes alive in one CI run), repeats until no new one
appears, then sends SIGKILL to all. Ray's own clean-up misses some of them: measured, its
dashboard and runtime-env agents were still running 30 s after the driver was killed. Linux
only (elsewhere it exits at once).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import time
from pathlib import Path

POLL_S = 0.5


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time) of a live process, None if gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] == "Z":
        return None
    return int(fields[1]), int(fields[19])


def tree(roots: list[int], skip: int) -> dict[int, int]:
    """{pid: start time} of every live process below any of ``roots`` but ``skip``'s."""
    children: dict[int, list[int]] = {}
    starts: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            info = _stat(int(entry.name))
            if info is not None:
                children.setdefault(info[0], []).append(int(entry.name))
                starts[int(entry.name)] = info[1]
    out: dict[int, int] = {}
    todo = list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            if child != skip:
                out[child] = starts[child]
                todo.append(child)
    return out


def _same(pid: int, start: int) -> bool:
    """Whether ``pid`` is still the process recorded with that start time."""
    info = _stat(pid)
    return info is not None and info[1] == start


def _signal(pid: int, start: int, sig: int) -> None:
    if _same(pid, start):
        with contextlib.suppress(OSError):  # gone meanwhile
            os.kill(pid, sig)


def reap(seen: dict[int, int], skip: int) -> dict[int, int]:
    """SIGKILL the recorded processes and whatever they started since they were recorded;
    returns all of them. Each is stopped first so that none starts another meanwhile."""
    seen = dict(seen)
    stopped: set[int] = set()
    while True:  # stop what was recorded, then what those made since; until nothing is new
        for pid in set(seen) - stopped:
            _signal(pid, seen[pid], signal.SIGSTOP)
            stopped.add(pid)
        alive = [pid for pid in seen if _same(pid, seen[pid])]
        new = {pid: start for pid, start in tree(alive, skip=skip).items() if pid not in seen}
        if not new:
            break
        seen.update(new)
    for pid, start in seen.items():
        _signal(pid, start, signal.SIGKILL)
    return seen


def watch(driver: int, temp_dir: str | None = None) -> None:
    if not Path("/proc").is_dir():
        return
    me = os.getpid()
    seen: dict[int, int] = {}
    while _stat(driver) is not None:
        seen = tree([driver], skip=me)
        time.sleep(POLL_S)
    seen = reap(seen, skip=me)
    if temp_dir:  # the driver's private Ray folder: removed once nothing writes into it
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_same(pid, start) for pid, start in seen.items()):
            time.sleep(0.05)
        shutil.rmtree(temp_dir, ignore_errors=True)


if __name__ == "__main__":
    watch(int(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else None)
