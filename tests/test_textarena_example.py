"""examples/textarena_guess.py: TextArena's GuessTheNumber through the driver with a scripted
policy (it guesses 1, 2, 3, ... in turn): the opening is the game's first observation, the game
is created once per episode, success is a win only (a lost game's partial credit is not), and an
episode gspo cuts earns the environment's cut_reward. Skips without TextArena."""

from __future__ import annotations

import importlib
import os
import re
import sys
from pathlib import Path

import pytest
from envs_support import TOK, ScriptedEngine

from gspo.envs.driver import Limits, run_episodes
from gspo.envs.trajectory import PlainEncoder
from gspo.rollout.base import SamplingParams

if os.environ.get("GSPO_REQUIRE_TEXTARENA") != "1":  # CI installs the extra: a skip would hide
    pytest.importorskip("textarena", reason="needs TextArena (pip install 'gspo[textarena]')")
import textarena as ta

ROOT = str(Path(__file__).resolve().parents[1])


@pytest.fixture(scope="module")
def example():
    """The example module, imported as the CLI imports a plugin (from the repository root); its
    import registers the task and environment, which are unregistered afterwards so that other
    tests see the built-in registries."""
    from gspo.envs.base import ENVIRONMENTS
    from gspo.envs.tasks import TASKS

    sys.path.insert(0, ROOT)
    try:
        module = importlib.import_module("examples.textarena_guess")
        yield module
    finally:
        TASKS.pop("textarena_guess", None)
        ENVIRONMENTS.pop("textarena_guess", None)
        sys.modules.pop("examples.textarena_guess", None)
        sys.path.remove(ROOT)


def _target(seed: int) -> int:
    game = ta.make("GuessTheNumber-v0-raw")
    game.reset(num_players=1, seed=seed)
    return game.game_number


def _play(example, max_turns: int, chat: bool = True):
    task = example.make_task(n_train=0, n_test=8, seed=0)
    env = example.TextArenaGuess(chat=chat)
    engine = ScriptedEngine([f"[{k}]" for k in range(1, 21)])
    limits = Limits(max_turns=max_turns, max_tokens_per_turn=8, max_total_tokens=4000)
    params = SamplingParams(max_new_tokens=8)
    _, trajs = run_episodes(engine, env, PlainEncoder(TOK), task.test, 1, params, limits)
    return env, [_target(e.meta["seed"]) for e in task.test], trajs


@pytest.mark.parametrize("chat", [True, False])
def test_games_open_with_their_observation_and_only_a_win_is_a_success(example, chat):
    env, targets, trajs = _play(example, max_turns=20, chat=chat)
    assert env.games_created == len(trajs) == 8  # one game per episode, made in reset
    for t, target in zip(trajs, targets, strict=True):
        opening = t.history[0]["content"]
        reply = t.history[2]["content"] if t.num_turns > 1 else " lower "  # won at once: none
        if chat:  # the game's own opening observation and hints
            assert "Guess The Number" in opening
            assert t.num_turns == 1 or "The target number is" in reply
        else:  # plain mode (char models): the compact rendering
            assert opening == example.PLAIN_OPENING and reply in (" higher ", " lower ")
        assert t.finish == "stop"  # the game ended each episode
        if target <= 10:  # found within TextArena's 10 guesses: a win
            assert (t.reward, t.success, t.num_turns) == (1.0, True, target)
        else:  # TextArena's turn limit: partial credit for a lost game, no success
            assert 0 < t.reward < 1 and t.success is False
    assert {t.success for t in trajs} == {True, False}  # these seeds hold both cases


def test_an_episode_cut_by_gspo_earns_cut_reward(example):
    _, targets, trajs = _play(example, max_turns=3)
    for t, target in zip(trajs, targets, strict=True):
        if target > 3:
            assert (t.finish, t.reward, t.success) == ("turns", 0.0, False)
        else:
            assert (t.reward, t.success) == (1.0, True)


def test_demonstrations_are_binary_searches_that_win(example):
    task = example.make_task(n_train=3, n_test=0, seed=0)
    for e in task.train:
        guesses = [int(g) for g in re.findall(r"\[(\d+)\]", e.demo)]
        assert guesses[0] == 10 and guesses[-1] == _target(e.meta["seed"]) and len(guesses) <= 5
