"""Bounded-time calls of any reward function: :func:`with_timeout` runs each call in a daemon
thread or in a worker process that is killed on timeout; a late call raises
:class:`RewardTimeout` (``gspo.envs.rewards.score`` then scores it 0 and counts it)."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import pickle
import select
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from gspo.sandbox.cancel import CANCEL, CancelScope

# Any reward (completion, example) -> float; the example passes through untouched, so its
# type (``gspo.envs.tasks.Example``, a layer above) is not named here.
_Reward = Callable[[str, Any], float]

logger = logging.getLogger("gspo.sandbox")


class RewardTimeout(TimeoutError):
    """A reward call did not finish within its time bound."""


class RewardWorkerError(RuntimeError):
    """The worker process of a ``mode="process"`` reward died or could not be started."""


_abandoned_lock = None


def _count_abandoned(thread: Any) -> int:
    """Remember a timed-out reward thread; return how many of those are still running."""
    global _abandoned_lock
    if _abandoned_lock is None:
        _abandoned_lock = threading.Lock()
    with _abandoned_lock:
        _ABANDONED[:] = [t for t in _ABANDONED if t.is_alive()]
        _ABANDONED.append(thread)
        return len(_ABANDONED)


_ABANDONED: list[Any] = []
# How long a timed-out call waits for the teardown of the sandbox runs it cancelled.
_TEARDOWN_S = 30.0
# How long a process-mode worker gets to leave through its teardown before SIGKILL (a killed
# worker's runs still die with it: parent-death signals; its cgroups are swept later).
_TERM_GRACE_S = 3.0


def with_timeout(fn: _Reward, seconds: float, *, mode: str = "thread") -> _Reward:
    """``fn`` with each call bounded to ``seconds``; a late call raises :class:`RewardTimeout`.

    ``mode="thread"`` runs each call in a daemon thread: works for any callable and costs
    ~0.1 ms, but a timed-out call keeps running in the background (Python cannot stop a
    thread), and a call stuck inside C code that holds the GIL (a catastrophic regular
    expression, say) stalls the caller too. ``mode="process"`` runs calls in a worker process
    that is killed on timeout and restarted for the next call: it bounds everything, but
    ``fn`` and the examples must be picklable (module-level functions, ``functools.partial``
    of them) and ``fn`` cannot see the caller's later changes to global state.

    The result has the reward signature, so ``gspo.envs.rewards.score`` scores a timed-out call 0
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
    def __init__(self, fn: _Reward, seconds: float, name: str) -> None:
        self.fn, self.seconds, self.__name__ = fn, seconds, f"with_timeout({name})"

    def __call__(self, completion: str, example: Any) -> float:
        box: dict[str, Any] = {}
        done = threading.Event()
        scope = CancelScope()

        def target() -> None:
            CANCEL.set(scope)  # this thread's context: the sandbox runs the call makes
            try:
                box["value"] = self.fn(completion, example)
            except BaseException as exc:  # re-raised in the caller, which decides
                box["error"] = exc
            finally:
                done.set()

        thread = threading.Thread(target=target, name=self.__name__, daemon=True)
        thread.start()
        try:
            finished = done.wait(self.seconds)
        except BaseException:
            # The caller stops waiting (KeyboardInterrupt, e.g. a cancelled Ray task): so do
            # the call's sandbox runs.
            scope.cancel()
            scope.wait_idle(_TEARDOWN_S)
            raise
        if not finished:
            # Kill the call's sandbox runs and wait for their teardown, so that no run
            # outlives its caller and a slot is free again before the next call starts.
            scope.cancel()
            scope.wait_idle(_TEARDOWN_S)
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
import os, pickle, signal, struct, sys
# Asked to stop (a timed-out call): exit through the sandbox's teardown (finally blocks).
signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
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
def main():
    fn = recv()
    send(("ready", None))
    while True:
        completion, example = recv()
        try:
            send(("value", fn(completion, example)))
        except SystemExit:
            raise  # asked to stop (SIGTERM), or the caller closed the pipe
        except BaseException as exc:
            try:
                pickle.dumps(exc)
            except Exception:
                exc = RuntimeError(f"{type(exc).__name__}: {exc}")
            send(("error", exc))
try:
    main()
except SystemExit as exc:
    # The call's finally blocks (the sandbox's teardown) have run; skip the interpreter's
    # slow shutdown.
    os._exit(exc.code if isinstance(exc.code, int) else 0)
"""

_WORKER_START_TIMEOUT_S = 120.0  # importing the reward's module (and its imports) is not timed


class _ProcessTimeout:
    def __init__(self, fn: _Reward, seconds: float, name: str) -> None:
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
        try:
            self._proc.stdin.write(struct.pack("<Q", len(data)) + data)
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            self._kill()
            raise RewardWorkerError(f"reward worker of {self.__name__} died: {exc}") from None

    def _recv(self, timeout: float, *, starting: bool = False) -> tuple[str, Any]:
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
        # SIGTERM first: the worker leaves through run_python's teardown, so its sandbox run
        # is killed and its cgroup and slot freed; SIGKILL if it does not go (stuck in C).
        proc.terminate()
        try:
            code = proc.wait(_TERM_GRACE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        for stream in (proc.stdin, proc.stdout):
            with contextlib.suppress(OSError):
                stream.close()
        return code  # type: ignore[no-any-return]

    def __call__(self, completion: str, example: Any) -> float:
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
