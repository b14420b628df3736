"""Image prompts' pixel inputs on Ray: one object-store copy per step, read by reference.

A step's pixel inputs (:class:`gspo.models.vision.PixelInputs`, one entry per prompt, shared by
its group) are the largest thing a step sends: 40 KB per ``shapes`` prompt against a few hundred
bytes of token ids. Pickled into every task payload they would travel once per rollout worker,
once per training rank and once per pass (recompute, reference, update). Instead the driver
``ray.put``\\s them once per step and every payload carries the ``ObjectRef``: the rollout workers
read it and slice their prompts' share, the FSDP2 ranks read it and index each row's prompt,
exactly as the local backend indexes the tensors it holds.

Why the object store and not image file paths run through the processor on each worker: the
pixels are made once, by the driver's processor, so the workers' generation and the ranks'
forwards take the very tensors the local backend takes (no second processor run to agree with
the first), and prompts without a file (the ``shapes`` task draws its images in memory, data
files may hold bytes) need no temp files.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import Any

from ..rollout.base import PIXELS, Rollout


class PixelRefs:
    """The object-store copy of the latest pixel inputs put (one slot): the rollout workers and
    the training ranks of a step share it. Holding the inputs keeps the ref alive until the
    next step's replace them."""

    def __init__(self, ray: Any) -> None:
        self.ray = ray
        self._last: tuple[Any, Any] | None = None  # (pixel inputs, their ObjectRef)

    def ref(self, pixels: Any) -> Any:
        """The ``ObjectRef`` of ``pixels`` (put on first sight of this very object)."""
        if self._last is None or self._last[0] is not pixels:
            self._last = (pixels, self.ray.put(pixels))
        return self._last[1]

    def by_reference(self, rollout: Rollout) -> Rollout:
        """``rollout`` with its pixel inputs replaced by their ``ObjectRef`` (itself when it
        has none): what a task payload carries."""
        pixels = rollout.extras.get(PIXELS)
        if pixels is None or is_ref(pixels):
            return rollout
        return replace(rollout, extras={**rollout.extras, PIXELS: self.ref(pixels)})


def is_ref(value: Any) -> bool:
    """Whether ``value`` is a Ray ``ObjectRef`` (no ObjectRef exists unless Ray is imported)."""
    ray = sys.modules.get("ray")
    return ray is not None and isinstance(value, ray.ObjectRef)


def resolve(value: Any) -> Any:
    """(In an actor) the object behind ``value`` when it is an ``ObjectRef``, else ``value``."""
    if not is_ref(value):
        return value
    import ray

    return ray.get(value)


def with_pixels(rollout: Rollout) -> Rollout:
    """(In an actor) ``rollout`` with an ``ObjectRef`` in place of its pixel inputs read back."""
    pixels = rollout.extras.get(PIXELS)
    if not is_ref(pixels):
        return rollout
    return replace(rollout, extras={**rollout.extras, PIXELS: resolve(pixels)})
