"""Built-in task 2: a guessing game with higher/lower feedback.

The environment hides a number in [1, 2^d - 1]; each policy turn is a guess, answered with
"higher " or "lower " (or "invalid " for anything that is not a number). A right guess on turn
k ends the episode with reward 1 - ``turn_cost`` x (k - 1) (at least ``turn_cost``), so it is
scored by success and by the number of turns; an episode that never finds the number scores 0,
and an invalid guess costs ``turn_cost`` as a turn reward. (Charging every wrong guess as a turn
reward instead pays the policy to end episodes early, e.g. by a cut turn: GSPO learned that.)
Plain-text form::

    prompt "guess 1-63:"   turn "32 "  env "higher "  turn "48 "  env "lower " ...  turn "45"

(a plain-text guess ends at its space, the stop string; chat turns end at end-of-turn).

Demonstrations (for the SFT cold start) are binary searches, replies included (SFT has no loss
mask). Chat models get the replies as user messages.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from gspo.envs.tasks.base import Example, Task
from gspo.envs.tasks.synthetic import DIFFICULTIES, TASKS, split_of

from .base import Step, register_env
from .calculator import final_answer_reward


def binary_search(target: int, high: int) -> list[tuple[int, str]]:
    """(guess, reply) of a binary search for ``target`` in [1, high] (the last reply '')."""
    lo, hi, out = 1, high, []
    while True:
        mid = (lo + hi) // 2
        if mid == target:
            return [*out, (mid, "")]
        if mid < target:
            out.append((mid, "higher"))
            lo = mid + 1
        else:
            out.append((mid, "lower"))
            hi = mid - 1


DESCRIPTION = (
    "Guess a hidden number with higher/lower feedback: 'guess 1-63:' -> '32 ', 'higher ', ... "
    "Difficulty = bits (range 1..2^d-1). Multi-turn; success on turn k scores 1 - 0.1(k-1)."
)


def make_guess_task(
    *, n_train: int, n_test: int, seed: int = 0, difficulty: int | None = None
) -> Task:
    """Every problem has the same prompt (the game's range), so problems repeat; the hidden
    numbers of train and test are disjoint (split by ``split_of`` of the number)."""
    bits = 4 if difficulty is None else difficulty
    if not 2 <= bits <= 10:
        raise ValueError(f"difficulty of task 'guess' must be in [2, 10], got {bits}")
    splits: dict[str, list[Example]] = {"train": [], "test": []}
    for split, n in (("train", n_train), ("test", n_test)):
        rng = random.Random(f"guess/{bits}/{seed}/{split}")
        targets = [t for t in range(1, 2**bits) if split_of(str(t)) == split]
        if n and not targets:
            raise ValueError(f"task 'guess' at difficulty {bits} has no {split} numbers")
        splits[split] = [_sample_for(rng.choice(targets), bits) for _ in range(n)]
    return Task("guess", splits["train"], splits["test"], final_answer_reward,
                f"{DESCRIPTION} (difficulty {bits}, seed {seed})")  # fmt: skip


def _sample_for(target: int, bits: int) -> Example:
    high = 2**bits - 1
    demo = "".join(f"{g} {r} " if r else str(g) for g, r in binary_search(target, high))
    return Example(prompt=f"guess 1-{high}:", answer=str(target), demo=demo, meta={"high": high})


TASKS["guess"] = make_guess_task
DIFFICULTIES["guess"] = (2, 4, 10)


@dataclass
class _State:
    target: int
    turns: int = 0


class GuessEnv:
    """Success: the number was found (whatever the turn); an episode cut by a limit earns
    ``cut_reward`` 0.0, as one that never finds the number."""

    multi_turn = True
    cut_reward = 0.0

    def __init__(self, *, plain: bool, turn_cost: float = 0.1) -> None:
        self.name = "guess"
        self.plain = plain
        self.stop_strings: tuple[str, ...] = (" ",) if plain else ()
        self.turn_cost = turn_cost

    def reset(self, example: Example) -> _State:
        return _State(int(example.answer))

    def _won(self, turns: int) -> float:
        return max(self.turn_cost, 1.0 - self.turn_cost * (turns - 1))

    def _reply(self, word: str) -> list[dict[str, str]]:
        return [{"role": "user", "content": f"{word} " if self.plain else word}]

    def step(self, state: _State, text: str, finished: bool) -> Step:
        state.turns += 1
        try:
            guess = int(text.strip())
        except ValueError:
            return Step(done=False, messages=self._reply("invalid"), turn_reward=-self.turn_cost)
        if guess == state.target:
            return Step(done=True, reward=self._won(state.turns), success=True)
        word = "higher" if guess < state.target else "lower"
        return Step(done=False, messages=self._reply(word))


@register_env("guess")
def guess_env(task: Task, opts, chat: bool) -> GuessEnv:
    return GuessEnv(plain=not chat)
