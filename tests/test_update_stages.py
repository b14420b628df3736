"""The update reads as the loop does: ``TrainingBackend.update`` takes the loop's batch, and
``update_policy`` is a short list of named stages, none of which knows about MoE routing or
image inputs (they reach the forward through ``gspo.models.forward_inputs``)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import gspo.backend.update as update_module
from gspo.backend.base import TrainingBackend
from gspo.backend.fsdp import FSDPRank
from gspo.backend.local import LocalBackend
from gspo.rollout.base import RolloutBatch

STAGES = ("update_policy", "minibatches", "micro_batches", "micro_batch_step", "micro_batch_loss",
          "optimizer_step")  # fmt: skip


def _functions() -> dict[str, ast.FunctionDef]:
    tree = ast.parse(Path(update_module.__file__).read_text())
    return {n.name: n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}


def test_every_function_of_the_update_is_short():
    long = {
        name: f.end_lineno - f.lineno + 1
        for name, f in _functions().items()
        if f.end_lineno - f.lineno + 1 > 45
    }
    assert not long, f"functions over 45 lines in backend/update.py: {long}"


def test_the_stages_have_no_moe_or_image_branch():
    functions = _functions()
    for name in STAGES:
        names = {n.id for n in ast.walk(functions[name]) if isinstance(n, ast.Name)}
        names |= {n.attr for n in ast.walk(functions[name]) if isinstance(n, ast.Attribute)}
        assert not {n for n in names if "moe" in n.lower() or "pixel" in n.lower()}, name


def test_every_backend_update_takes_the_batch():
    for owner in (TrainingBackend, LocalBackend, FSDPRank):
        # Once a Ray actor of the class has been made in this process (an earlier Ray test),
        # Ray's tracing wraps its methods with a keyword-only `_ray_trace_ctx`: not the protocol.
        params = [p for p in inspect.signature(owner.update).parameters if p != "_ray_trace_ctx"]
        assert params == ["self", "batch"], owner
    assert "step" in {f.name for f in RolloutBatch.__dataclass_fields__.values()}
