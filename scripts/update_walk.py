"""The walk of one batch through the local update: where a `RolloutBatch` goes, in order, from
the loop's `steps.update` to the optimizer step, as docs/architecture.md counts it.

    python scripts/update_walk.py

Runs one step of the `smoke` preset with one minibatch (so one micro-batch and one optimizer
step) and records, with `sys.setprofile`, every call of a gspo function that receives the batch
or a piece of it (a `RolloutBatch`, `Rollout`, `MicroBatch`, the forward's inputs or result, a
minibatch's counts, or a tensor). Not counted as stops: property reads, comprehensions, the
metrics accumulator, and what runs inside the three leaves (`token_logprobs`: the model's
forward; `policy_loss`: the objective; `optimizer_step`, a stop even though it takes the
minibatch's loss as a float). Printed: the stops in order; a return each time the next stop is
called from a place the batch had left for a deeper one; the places (distinct functions); the
names (parameters of every stop, and locals of the stops above the leaves, that hold a piece).
"""

from __future__ import annotations

import inspect
import os
import sys
import tempfile

import torch

import gspo
import gspo.orchestration.steps as steps_module
from gspo.compose.train import train
from gspo.config import TrainConfig, build

ROOT = os.path.dirname(gspo.__file__)
LEAVES = (
    "models.logprobs.token_logprobs",
    "core.losses.policy_loss",
    "backend.update.optimizer_step",
)
PIECES = ("RolloutBatch", "Rollout", "MicroBatch", "ForwardInputs", "Forward", "_Counts")
PROPERTIES = ("policy_mask", "num_samples", "tokens", "whole_width")
stack: list[tuple[str, bool]] = []
stops: list[tuple[str, str | None, list[str]]] = []
names: set[str] = set()


def piece(value) -> bool:
    if type(value).__name__ in PIECES or isinstance(value, torch.Tensor):
        return True
    return (
        isinstance(value, tuple) and bool(value) and all(isinstance(x, torch.Tensor) for x in value)
    )


def place(code) -> str:
    module = os.path.relpath(code.co_filename, ROOT)[:-3].replace("/", ".")
    return f"{module}.{getattr(code, 'co_qualname', code.co_name)}"


def profile(frame, event, arg):
    code = frame.f_code
    if not code.co_filename.startswith(ROOT):
        return
    if event == "call":
        here = place(code)
        count = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & inspect.CO_VARARGS)
        got = [a for a in code.co_varnames[:count] if piece(frame.f_locals.get(a))]
        skip = (
            any(s[0] in LEAVES for s in stack if s[1])
            or "<" in here
            or here.rsplit(".", 1)[-1] in PROPERTIES
            or ".Accumulator." in here
        )
        stop = (bool(got) or here in LEAVES) and not skip
        if stop:
            parent = next((s[0] for s in reversed(stack) if s[1]), None)
            stops.append((here, parent, got))
            names.update(got)
        stack.append((here, stop))
    elif event == "return" and stack:
        here, stop = stack.pop()
        if stop and here not in LEAVES:
            names.update(k for k, v in frame.f_locals.items() if k != "self" and piece(v))


def main() -> None:
    original = steps_module.update
    done = []

    def traced(parts, state, batch):
        if done:
            return original(parts, state, batch)
        sys.setprofile(profile)
        try:
            return original(parts, state, batch)
        finally:
            sys.setprofile(None)
            done.append(True)

    steps_module.update = traced
    overrides = dict(output_dir=tempfile.mkdtemp(), steps=1, eval_every=0, progress=False)
    cfg = build(
        TrainConfig, preset="smoke", overrides=dict(overrides, threads=1, num_minibatches=1)
    )
    train(cfg)
    returns = 0
    for i, (here, parent, got) in enumerate(stops):
        if i and parent != stops[i - 1][0]:
            returns += 1
            print(f"     (back in {parent})")
        print(f"{i + 1:3d} {here}  <- {', '.join(got) or '(the minibatch loss, a float)'}")
    places = len({here for here, _, _ in stops})
    print(f"stops {len(stops)}; places {places}; returns to a place already left {returns}; "
          f"names {len(names)}: {', '.join(sorted(names))}")  # fmt: skip


if __name__ == "__main__":
    main()
