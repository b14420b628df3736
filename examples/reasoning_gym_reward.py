"""reasoning-gym's own scorer as a gspo reward: a task builder that draws problems from a
reasoning-gym procedural dataset, and a reward that calls that dataset's ``score_answer``.

Named on the command line, from the repository root (no launcher; needs the extra:
``pip install -e ".[reasoning-gym]"``)::

    gspo sft --task examples.reasoning_gym_reward:build --difficulty 2 --steps 300 \\
        --output-dir runs/rg-sft
    gspo train --task examples.reasoning_gym_reward:build --difficulty 2 --model runs/rg-sft \\
        --preset demo --steps 40 --output-dir runs/rg

(the README's "Your own code" section gives what they printed). ``--difficulty`` is the number
of digits per operand (1 to 4, default 1). At 1 there are only 200 problems and the training
split holds nearly all of those not held out: the same two commands without ``--difficulty 2``
memorized them (training reward 0.98 to 0.995 per 5 RL steps) while held-out greedy accuracy
was 0.035 after SFT and 0.055 after RL. The dataset is
``basic_arithmetic`` with two terms, + and - only, so the tiny character model that
``gspo train`` starts from can learn it on a CPU; change ``DATASET``/``CONFIG`` for another
reasoning-gym dataset (every one has ``score_answer``). Prompts are the bare expression
(``"5 - 3 ="``) for that tiny model; reasoning-gym's own question text is kept in each problem's
``meta["entry"]["question"]`` for a chat model.

reasoning-gym draws each problem from ``Random(seed + index)``, so two datasets whose seeds
differ by one share all but one problem: the held-out split is drawn from a distant seed and
its problems are removed from the training split.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from gspo import Example, Task

DATASET = "basic_arithmetic"
CONFIG: dict[str, Any] = dict(
    min_terms=2,
    max_terms=2,
    operators=("+", "-"),
    allow_parentheses=False,
    allow_negation=False,
)
TEST_SEED_OFFSET = 1_000_003  # far from the training seed (see the docstring)


def _reasoning_gym():
    try:
        import reasoning_gym
    except ImportError:
        raise ImportError(
            'this example needs reasoning-gym: pip install -e ".[reasoning-gym]"'
        ) from None
    return reasoning_gym


@cache
def _scorer(name: str) -> Any:
    """The dataset's ``score_answer(answer, entry) -> float`` (one instance per dataset)."""
    return _reasoning_gym().get_score_answer_fn(name)


def _examples(size: int, seed: int, digits: int) -> list[Example]:
    if size == 0:
        return []
    data = _reasoning_gym().create_dataset(
        DATASET, size=size, seed=seed, min_digits=digits, max_digits=digits, **CONFIG
    )
    out = []
    for entry in data:
        prompt = f"{entry['metadata'].get('expression', entry['question'])} ="
        out.append(Example(prompt, str(entry["answer"]), demo=str(entry["answer"]), meta={
            "entry": entry
        }))  # fmt: skip
    return out


def build(*, n_train: int, n_test: int, seed: int = 0, difficulty: int | None = None) -> Task:
    """A gspo task of ``DATASET`` problems: ``n_test`` held out, ``n_train`` to train on
    (fewer when the problem space is small: the held-out problems are taken out)."""
    digits = 1 if difficulty is None else difficulty
    if not 1 <= digits <= 4:
        raise ValueError(f"difficulty (digits per operand) must be in [1, 4], got {digits}")
    test = _examples(n_test, seed + TEST_SEED_OFFSET, digits)
    held_out = {ex.prompt for ex in test}
    train = [ex for ex in _examples(n_train, seed, digits) if ex.prompt not in held_out]
    return Task(
        "reasoning_gym",
        train,
        test,
        score,
        description=f"reasoning-gym {DATASET}, {digits}-digit operands (seed {seed})",
    )


def score(completion: str, example: Example) -> float:
    """reasoning-gym's verdict on the completion (its first line, stripped: the tiny model's
    whole answer) for the problem's entry."""
    entry = example.meta["entry"]
    answer = completion.strip().split("\n")[0].strip()
    return float(_scorer(entry["metadata"]["source_dataset"])(answer=answer, entry=entry))
