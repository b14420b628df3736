"""A slow trainer without sleeps, for the async tests: each update waits until the rollout
thread has run as far ahead as the staleness bound allows and is blocked at admission (or has
produced its last step). The thread is then K versions ahead at every update by construction,
whatever the machine's load, so tests assert on versions and counts, not on seconds."""

from __future__ import annotations

import threading

import gspo.orchestration.async_rollout as async_rollout
import gspo.orchestration.steps as steps_module

# A safety net against a hang in the code under test, never reached by a passing run.
HANG_S = 300.0


class BlockedProducer:
    """Counts the rollout thread's admission waits that blocked (the weights it needs are not
    published yet); ``wait`` returns once the thread is blocked or finished."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.blocked = 0  # admission waits that blocked
        self._pending = False  # blocked and not yet seen by an update
        self._finished = False

    def note_blocked(self) -> None:
        with self._cond:
            self.blocked += 1
            self._pending = True
            self._cond.notify_all()

    def note_finished(self) -> None:
        with self._cond:
            self._finished = True
            self._cond.notify_all()

    def wait(self) -> None:
        with self._cond:
            ok = self._cond.wait_for(lambda: self._pending or self._finished, timeout=HANG_S)
            assert ok, "the rollout thread neither blocked at the bound nor finished"
            self._pending = False


def hold_updates_until_the_producer_blocks(monkeypatch) -> BlockedProducer:
    """Patch the trainer's update step and the rollout thread (see the module docstring)."""
    probe = BlockedProducer()
    real_wait_for = async_rollout.WeightSync.wait_for
    real_main = async_rollout.RolloutThread._main
    real_update = steps_module.update

    def wait_for(self, version: int) -> float:
        if self._published < version and not self.stopped:
            probe.note_blocked()  # the trainer publishes `version` only after its next update
        return real_wait_for(self, version)

    def main(self) -> None:
        try:
            real_main(self)
        finally:
            probe.note_finished()

    def update(*args, **kwargs):
        probe.wait()
        return real_update(*args, **kwargs)

    monkeypatch.setattr(async_rollout.WeightSync, "wait_for", wait_for)
    monkeypatch.setattr(async_rollout.RolloutThread, "_main", main)
    monkeypatch.setattr(steps_module, "update", update)
    return probe
