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
        self._active = False  # a rollout thread was started (K = 0 runs build none)

    def note_started(self) -> None:
        with self._cond:
            self._active, self._pending, self._finished = True, False, False

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
            if not self._active:
                return
            ok = self._cond.wait_for(lambda: self._pending or self._finished, timeout=HANG_S)
            assert ok, "the rollout thread neither blocked at the bound nor finished"
            self._pending = False


def hold_updates_until_the_producer_blocks(monkeypatch) -> BlockedProducer:
    """Patch the trainer's update step and the rollout thread (see the module docstring)."""
    probe = BlockedProducer()
    real_wait_for = async_rollout.WeightSync.wait_for
    real_start = async_rollout.RolloutThread.start
    real_main = async_rollout.RolloutThread._main
    real_update = steps_module.update

    def start(self) -> None:
        probe.note_started()
        real_start(self)

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
    monkeypatch.setattr(async_rollout.RolloutThread, "start", start)
    monkeypatch.setattr(async_rollout.RolloutThread, "_main", main)
    monkeypatch.setattr(steps_module, "update", update)
    return probe


def new_weights_inside_each_generation(monkeypatch, target=None) -> list[int]:
    """A slow producer without sleeps. The trainer's update of step s waits until the rollout
    thread has sampled the first token of step s + 1 (or finished); that token's sampling waits
    until the trainer publishes newer weights. So every step after the first is generated
    ahead of the trainer and gets new weights inside its generation (mid-turn for episodes),
    by construction. Returns the steps that waited for new weights.

    ``target`` (owner, attribute) is the generation's unit of work on the rollout thread:
    ``sample_next`` of the torch producer (``gspo.rollout.torch_decode``) by default, ``RayWorkers.generate_chunk`` (one
    chunk on the Ray workers) for Ray."""
    import gspo.rollout.torch_decode as decode_module

    owner, name = target or (decode_module, "sample_next")

    cond = threading.Condition()
    waited: list[int] = []
    state: dict = {"started": -1, "finished": False, "updates": 0, "first": False}
    real_start = async_rollout.RolloutThread.start
    real_main = async_rollout.RolloutThread._main
    real_sample = getattr(owner, name)
    real_update = steps_module.update

    def start(self) -> None:
        produce = self.produce

        def tracked(step, weights):
            with cond:
                state.update(step=step, weights=weights, first=True)
            return produce(step, weights)

        self.produce = tracked
        with cond:
            state.update(active=True, started=-1, finished=False, updates=0)
        real_start(self)

    def main(self) -> None:
        try:
            real_main(self)
        finally:
            with cond:
                state["finished"] = True
                cond.notify_all()

    def sample_next(*args, **kwargs):
        if state["first"] and threading.current_thread().name == "gspo-rollout":
            with cond:
                state["first"] = False
                step, weights = state["step"], state["weights"]
                state["started"] = step
                cond.notify_all()
            published = weights._published
            if published < step:  # the trainer can finish step `published` and publish more
                waited.append(step)
                with weights._cond:
                    ok = weights._cond.wait_for(
                        lambda: weights._published > published or weights.stopped, HANG_S
                    )
                assert ok, "the trainer published no new weights"
        return real_sample(*args, **kwargs)

    def update(*args, **kwargs):
        with cond:
            step = state["updates"]
            state["updates"] += 1
            # K = 0 builds no rollout thread: nothing to wait for.
            ok = not state.get("active") or cond.wait_for(
                lambda: state["started"] > step or state["finished"], HANG_S
            )
        assert ok, "the rollout thread neither started the next step nor finished"
        return real_update(*args, **kwargs)

    monkeypatch.setattr(async_rollout.RolloutThread, "start", start)
    monkeypatch.setattr(async_rollout.RolloutThread, "_main", main)
    monkeypatch.setattr(owner, name, sample_next)
    monkeypatch.setattr(steps_module, "update", update)
    return waited
