"""Ending runs whose caller stopped waiting: :class:`CancelScope` and the :data:`CANCEL` context
variable that :func:`gspo.sandbox.run.run_python` watches."""

from __future__ import annotations

import contextvars
import threading

from gspo.sandbox.config import SandboxError


class CancelScope:
    """Lets a caller that stops waiting (a timeout, a cancelled task, an exception) end the
    runs it started. ``with_timeout`` sets one in the thread that runs the reward
    (``CANCEL.set(scope)``); once :meth:`cancel` is called, every run of that context is
    killed within 0.05 s (``run._POLL_S``), its slot freed, and ``run_python`` raises
    :class:`SandboxError`; :meth:`wait_idle` returns when their teardown is done. So runs
    never outlive their callers, and live runs never outnumber the callers' workers.

    A context variable is not inherited by threads a reward starts itself: runs made there
    are not cancelled (they still end at their own limits)."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._cancelled = False
        self._runs = 0

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def cancel(self) -> None:
        with self._changed:
            self._cancelled = True

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no run of this scope is alive (torn down); False if time ran out."""
        with self._changed:
            return self._changed.wait_for(lambda: self._runs == 0, timeout_s)

    def _enter(self) -> None:
        with self._changed:
            if self._cancelled:
                raise SandboxError("run cancelled: its caller stopped waiting (not started)")
            self._runs += 1

    def _exit(self) -> None:
        with self._changed:
            self._runs -= 1
            self._changed.notify_all()


CANCEL: contextvars.ContextVar[CancelScope | None] = contextvars.ContextVar(
    "gspo_sandbox_cancel", default=None
)
