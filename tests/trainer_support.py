"""Helpers shared by test_trainer.py and the files split from it.

Imported by name: pytest puts tests/ on sys.path.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import gspo.compose.train as trainer_module
from gspo.config import TrainConfig, build
from gspo.envs.tasks.base import Example, Task

TIMING_PREFIXES = ("time/", "throughput/")


def even_share(text: str, example: Example) -> float:
    """Reward: the fraction of characters with an even code point (varied under a random model)."""
    return sum(ord(c) % 2 == 0 for c in text) / len(text) if text else 0.0


def even_task() -> Task:
    examples = [Example(prompt=f"{i}+{7 * i % 10}=", answer="") for i in range(16)]
    return Task("even", train=examples[:12], test=examples[12:], reward=even_share)


@pytest.fixture(autouse=True)
def _even_task(monkeypatch):
    monkeypatch.setattr(trainer_module, "build_task", lambda cfg: even_task())


def make_cfg(out: Path, **overrides) -> TrainConfig:
    base = {"device": "cpu", "threads": 0, "output_dir": str(out)}
    return build(TrainConfig, preset="smoke", overrides={**base, **overrides})


def train_records(history: list[dict]) -> list[dict]:
    """Train-step records only (eval records carry eval/ keys and no reward)."""
    return [r for r in history if "reward/mean" in r]


def without_timing(record: dict) -> dict:
    return {k: v for k, v in record.items() if not k.startswith(TIMING_PREFIXES)}
