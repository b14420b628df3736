"""TextArena's single-player games as gspo tasks and multi-turn environments:
``--task textarena:ID`` (e.g. ``textarena:GuessTheNumber-v0``, ``textarena:Wordle-v0``).

* The game is TextArena's raw environment (``ID-raw`` where TextArena registers one: without
  its LLM wrappers, which repeat the whole history in each observation); each problem is a
  TextArena seed, the train and test seeds disjoint.
* ``reset`` creates the episode's game and returns its first observation as the opening (the
  policy's prompt); each policy turn is one move, passed to the game as the model wrote it (the
  game parses it: TextArena's moves are in square brackets, ``[10]``, so a turn stops at its
  first ``]``), answered with the game's new messages (an invalid move's reason included).
* The episode's reward is TextArena's (1 for a win; a lost game's partial credit, e.g.
  GuessTheNumber's 1 - distance / range); success is a win only: reward >= :data:`WIN`. An
  episode gspo cuts (``--max-turns``, ``--max-total-tokens``) before the game ends earns 0.
* Plain-text (tiny char) models see a compact rendering where one is defined
  (:data:`COMPACT`: TextArena's instructions do not fit a tiny model's 256 positions), else
  the game's own text; chat models always see the game's own text.
* Demonstrations (``gspo sft``) where a scripted player exists (:data:`PLAYERS`:
  GuessTheNumber's binary search); other games' rows have none.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gspo.envs.base import INTEGRATION_ENVS, Opening, Step
from gspo.envs.tasks.base import Example, Task
from gspo.envs.tasks.synthetic import INTEGRATION_TASKS

from .options import import_extra

PREFIX = "textarena"
INSTALL = "pip install 'gspo[textarena]'"
WIN = 1.0
"""TextArena pays 1 for a win only; a lost game's partial credit is below it."""
TEST_SEEDS = 500_000
"""The test split's seeds start this far above the training split's."""


def _textarena() -> Any:
    return import_extra("textarena", PREFIX, "TextArena", INSTALL)


def raw_id(env_id: str) -> str:
    """The TextArena id to make: ``ID-raw`` where registered, else ``ID`` (ValueError if
    TextArena has neither, with the closest id)."""
    _textarena()  # its install line when missing
    from textarena.envs.registration import ENV_REGISTRY

    if env_id in ENV_REGISTRY:
        return env_id if f"{env_id}-raw" not in ENV_REGISTRY else f"{env_id}-raw"
    close = difflib.get_close_matches(env_id, list(ENV_REGISTRY), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise ValueError(f"--task {PREFIX}:{env_id}: TextArena has no environment {env_id!r}{hint}")


def _game(env_id: str, seed: int) -> Any:
    """A fresh single-player game of ``env_id`` (ValueError naming it when it cannot be one)."""
    make = _textarena().make
    name = raw_id(env_id)
    try:  # some games load data files here (Wordle: nltk's word lists, downloaded once)
        game = make(name)
    except Exception as exc:
        why = " ".join(str(exc).split())[:200]
        raise ValueError(f"--task {PREFIX}:{env_id}: TextArena could not make it "
                         f"({type(exc).__name__}: {why})") from None  # fmt: skip
    try:
        game.reset(num_players=1, seed=seed)
    except Exception as exc:  # TextArena's check of the player count (its own exception types)
        raise ValueError(f"--task {PREFIX}:{env_id}: not a single-player game "
                         f"({type(exc).__name__}: {exc})") from None  # fmt: skip
    return game


def _messages(observation: list[tuple[Any, ...]], player: int) -> list[str]:
    """The game's messages of an observation (the player's own moves are already its turns)."""
    return [str(msg) for sender, msg, *_ in observation if sender != player]


@dataclass(frozen=True)
class Compact:
    """A plain-text rendering of a game for tiny models: its opening, and the message patterns
    replaced by their first group ("The target number is lower." -> "lower")."""

    opening: Callable[[Any], str]
    hints: tuple[re.Pattern[str], ...]

    def message(self, text: str) -> str:
        for hint in self.hints:
            found = hint.fullmatch(text.strip())
            if found:
                return found.group(1)
        return text


def _family(env_id: str) -> str:
    return env_id.split("-", 1)[0]


COMPACT: dict[str, Compact] = {
    "GuessTheNumber": Compact(
        lambda game: f"guess [{game.min_number}-{game.max_number}]:",
        (re.compile(r"The target number is (higher|lower)\."),),
    )
}
"""Compact plain-text renderings, by game family (the id before its first '-')."""


def _binary_search(game: Any) -> str:
    """GuessTheNumber won by binary search, in plain mode (reads the hidden number)."""
    target, lo, hi, out = game.game_number, game.min_number, game.max_number, []
    while True:
        mid = (lo + hi) // 2
        if mid == target:
            return "".join(out) + f"[{mid}]"
        out.append(f"[{mid}] {'higher' if mid < target else 'lower'} ")
        lo, hi = (mid + 1, hi) if mid < target else (lo, mid - 1)


PLAYERS: dict[str, Callable[[Any], str]] = {"GuessTheNumber": _binary_search}
"""Scripted players by game family: a plain-mode demonstration of a game just reset."""


@dataclass
class _Episode:
    game: Any
    player: int


class TextArenaEnv:
    """A TextArena single-player game as a gspo multi-turn environment (see the module doc)."""

    multi_turn = True
    cut_reward = 0.0
    """An episode gspo cuts (its turn or token limit) before the game ends earns nothing."""

    def __init__(self, env_id: str, *, chat: bool = False) -> None:
        self.name = f"{PREFIX}:{env_id}"
        self.env_id = env_id
        self.chat = chat
        self.compact = None if chat else COMPACT.get(_family(env_id))
        self.stop_strings: tuple[str, ...] = ("]",)  # a move ends at its closing bracket
        self.games_created = 0

    def _text(self, messages: list[str]) -> str:
        if self.compact is None:
            return "\n".join(messages)
        return " " + " ".join(map(self.compact.message, messages)) + " "

    def reset(self, example: Example) -> Opening:
        game = _game(self.env_id, int(example.meta["seed"]))
        self.games_created += 1
        player, observation = game.get_observation()
        if self.compact is not None:
            text = self.compact.opening(game)
        else:
            text = "\n".join(_messages(observation, player))
        return Opening(_Episode(game, player), [{"role": "user", "content": text}])

    def step(self, state: _Episode, text: str, finished: bool) -> Step:
        done, _ = state.game.step(text)
        if not done:
            player, observation = state.game.get_observation()
            state.player = player
            reply = self._text(_messages(observation, player))
            return Step(done=False, messages=[{"role": "user", "content": reply}])
        rewards, _ = state.game.close()
        reward = float(rewards[state.player])
        return Step(done=True, reward=reward, success=reward >= WIN)


def make_env(task: Task, opts: Any, chat: bool) -> TextArenaEnv:
    """The environment of a ``textarena:ID`` task."""
    return TextArenaEnv(task.name.partition(":")[2], chat=chat)


def _no_reward(completion: str, example: Example) -> float:
    """The task's reward outside its environment: none (the game scores its episodes)."""
    return 0.0


def build(
    env_id: str, *, n_train: int, n_test: int, seed: int = 0, difficulty: int | None = None
) -> Task:
    """The task ``textarena:ENV_ID``: problems are TextArena seeds, train and test disjoint.
    A row's prompt is the game's opening in plain mode (the environment's opening replaces it
    in episodes); train rows carry a demonstration where :data:`PLAYERS` has a player."""
    if difficulty is not None:
        raise ValueError(f"--task {PREFIX}:{env_id}: --difficulty does not apply (choose the "
                         "game's variant by its id, e.g. GuessTheNumber-v0-hardcore)")  # fmt: skip
    family = _family(env_id)
    compact, player = COMPACT.get(family), PLAYERS.get(family)
    base = 1_000_000 * seed
    _game(env_id, base)  # an unknown or multi-player id fails here, before any row

    def rows(first: int, n: int, demos: bool) -> list[Example]:
        out = []
        for s in range(first, first + n):
            game = _game(env_id, s)
            p, observation = game.get_observation()
            prompt = compact.opening(game) if compact else "\n".join(_messages(observation, p))
            demo = player(game) if demos and player is not None else None
            out.append(Example(prompt, "", demo=demo, meta={"seed": s, "problem": f"seed {s}"}))
        return out

    return Task(f"{PREFIX}:{env_id}", rows(base, n_train, True), rows(base + TEST_SEEDS, n_test, False),
                _no_reward, f"TextArena {env_id} (seed {seed})")  # fmt: skip


INTEGRATION_TASKS[PREFIX] = build
INTEGRATION_ENVS[PREFIX] = make_env
