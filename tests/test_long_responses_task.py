"""experiments/long_responses.py's ``chain`` task (claim 2's long-response regime): the demo
scores 1, the reward's per-character arithmetic on hand-made completions, the lengths the
experiment relies on, and the trainer resolving the task by reference."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

EXPERIMENTS = Path(__file__).resolve().parent.parent / "experiments"


@pytest.fixture(scope="module")
def chain():
    sys.path.insert(0, str(EXPERIMENTS))
    try:
        import long_responses

        yield long_responses
    finally:
        sys.path.remove(str(EXPERIMENTS))


def test_demo_scores_one_and_lengths(chain):
    example = chain.sample_chain(random.Random(0), 86)
    assert len(example.demo) == 258 and len(example.prompt) == 260
    assert chain.chain_reward(example.demo, example) == 1.0
    assert example.demo[-1] == example.answer


def test_reward_by_hand(chain):
    # start 3; *7 -> 1; +4 -> 5
    example = chain.Example(
        prompt="3|*7|+4=", answer="5", meta={"start": 3, "ops": [("*", 7), ("+", 4)]}
    )
    assert chain.chain_reward("*71+45", example) == 1.0
    # a wrong first digit costs one character; the second step is checked against the 2 written
    assert chain.chain_reward("*72+46", example) == pytest.approx(5 / 6)
    assert chain.chain_reward("*72+45", example) == pytest.approx(4 / 6)
    assert chain.chain_reward("*71", example) == pytest.approx(3 / 6)  # stopped early
    assert chain.chain_reward("*71+45+45", example) == pytest.approx(6 / 9)  # ran on
    assert chain.chain_reward("", example) == 0.0


def test_splits_are_deterministic_and_distinct(chain):
    a = chain.chain_task(n_train=20, n_test=10, seed=3, difficulty=12)
    b = chain.chain_task(n_train=20, n_test=10, seed=3, difficulty=12)
    assert [e.prompt for e in a.train] == [e.prompt for e in b.train]
    assert not {e.prompt for e in a.train} & {e.prompt for e in a.test}


def test_the_trainer_resolves_the_task_by_reference(chain):
    from gspo.envs.tasks.synthetic import make_task

    task = make_task("long_responses:chain_task", n_train=4, n_test=2, difficulty=5)
    assert task.name == "chain" and len(task.train[0].demo) == 15
