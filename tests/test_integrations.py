"""Outside packages by flags alone (gspo.envs.integrations, docs/integrations.md): the names
``textarena:ID`` and ``reasoning_gym:NAME`` resolve as tasks (TextArena's as environments too),
each trains a few steps on the tiny model and evaluates from the command line; their config
errors are one line before torch loads.

TextArena and reasoning-gym tests skip without their extra, except where GSPO_REQUIRE_TEXTARENA=1
or GSPO_REQUIRE_REASONING_GYM=1 (`.ci/run`), where they must run."""

from __future__ import annotations

import json
import os
import re

import pytest
from envs_support import TOK, ScriptedEngine

from gspo.config import names
from gspo.envs.base import INTEGRATION_ENVS, registered_env
from gspo.envs.tasks import make_task
from gspo.interface.cli import main


def _need(module: str, variable: str, extra: str) -> None:
    if os.environ.get(variable) == "1":  # CI installs the extra: a skip would hide a failure
        __import__(module)
    else:
        pytest.importorskip(module, reason=f"needs {module} (pip install 'gspo[{extra}]')")


@pytest.fixture
def textarena():
    _need("textarena", "GSPO_REQUIRE_TEXTARENA", "textarena")
    import textarena

    return textarena


@pytest.fixture
def reasoning_gym():
    _need("reasoning_gym", "GSPO_REQUIRE_REASONING_GYM", "reasoning-gym")
    import reasoning_gym

    return reasoning_gym


def _metrics(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# --------------------------------------------------------------------------------------------
# Names (no extra needed)
# --------------------------------------------------------------------------------------------


def test_integration_names():
    # The registries equal the declared INTEGRATIONS: gspo.envs.registered checks at import.
    assert names.integration_of("textarena:GuessTheNumber-v0") == "textarena"
    assert names.integration_of("examples.mine:build") is None  # a module:builder reference
    assert names.is_environment_task("textarena:X") and not names.is_environment_task("addition")
    assert registered_env("textarena:GuessTheNumber-v0") is INTEGRATION_ENVS["textarena"]


def test_a_missing_extra_or_name_is_one_line_before_torch(monkeypatch, capsys):
    assert main(["train", "--task", "textarena:", "--steps", "1"]) == 2
    assert "name one of textarena's tasks after 'textarena:'" in capsys.readouterr().err
    # the package not installed: its pip command (the prefix pointed at a missing module)
    monkeypatch.setitem(names.INTEGRATIONS, "textarena", ("no_such_pkg_49", "textarena", True))
    assert main(["eval", "--task", "textarena:GuessTheNumber-v0", "--model", "tiny"]) == 2
    err = capsys.readouterr().err
    assert "needs no_such_pkg_49: pip install 'gspo[textarena]'" in err
    assert len(err.strip().splitlines()) == 1
    with pytest.raises(ValueError, match=r"pip install 'gspo\[textarena\]'"):
        make_task("textarena:GuessTheNumber-v0", n_train=1, n_test=1)


# --------------------------------------------------------------------------------------------
# reasoning-gym
# --------------------------------------------------------------------------------------------


def test_reasoning_gym_tasks_are_scored_by_the_datasets_own_scorer(reasoning_gym):
    task = make_task("reasoning_gym:basic_arithmetic", n_train=100, n_test=20, seed=0)
    assert task.name == "reasoning_gym:basic_arithmetic" and task.train and len(task.test) == 20
    assert not {ex.prompt for ex in task.train} & {ex.prompt for ex in task.test}
    ex = task.test[0]
    assert ex.prompt == ex.meta["entry"]["question"] and ex.demo == ex.answer
    scorer = reasoning_gym.get_score_answer_fn("basic_arithmetic")
    for text, answer in [(ex.answer, ex.answer), (f" {ex.answer}\nmore", ex.answer),
                         (f"so <answer>{ex.answer}</answer>", ex.answer), ("7", "7")]:  # fmt: skip
        assert task.reward(text, ex) == scorer(answer=answer, entry=ex.meta["entry"])
    assert task.reward(ex.answer, ex) == 1.0 and task.reward("<answer>x</answer>", ex) == 0.0


def test_reasoning_gym_options_and_curriculum_levels(reasoning_gym):
    spec = "reasoning_gym:basic_arithmetic,min_terms=2,max_terms=2,operators=('+', '-'),allow_parentheses=False"
    task = make_task(spec, n_train=20, n_test=5, seed=1)
    for ex in task.train:
        assert re.fullmatch(r"Calculate -?\d+ [+-] -?\d+\.", ex.prompt), ex.prompt
    easy = make_task(spec, n_train=50, n_test=0, seed=1, difficulty=0)
    hard = make_task(spec, n_train=50, n_test=0, seed=1, difficulty=3)

    def digits(task):  # the digits per operand that reasoning-gym drew
        return {ex.meta["entry"]["metadata"]["num_digits"] for ex in task.train}

    assert digits(easy) == {1} and "curriculum level 0" in easy.description
    assert max(digits(hard)) > 1  # level 3: up to 4 digits
    with pytest.raises(ValueError, match=r"a curriculum level in \[0, 4\], got 9"):
        make_task(spec, n_train=1, n_test=1, difficulty=9)
    with pytest.raises(
        ValueError, match="no dataset 'basic_arith'; did you mean 'basic_arithmetic'"
    ):
        make_task("reasoning_gym:basic_arith", n_train=1, n_test=1)
    with pytest.raises(ValueError, match=r"refuses the config: .*'nope'"):
        make_task("reasoning_gym:basic_arithmetic,nope=1", n_train=1, n_test=1)


def test_reasoning_gym_trains_and_evaluates_from_the_command_line(reasoning_gym, tmp_path):
    task = ["--task", "reasoning_gym:basic_arithmetic", "--threads", "1", "--progress", "false"]
    out = tmp_path / "rg"
    assert main(["train", *task, "--preset", "demo", "--steps", "2", "--n-train", "64",
                 "--n-test", "8", "--output-dir", str(out)]) == 0  # fmt: skip
    rows = _metrics(out / "metrics.jsonl")
    assert len([r for r in rows if "reward/mean" in r]) == 2 and rows[0]["data/test_problems"] == 8
    assert json.loads((out / "config.json").read_text())["task"] == "reasoning_gym:basic_arithmetic"
    report = tmp_path / "eval.json"
    assert main(["eval", *task, "--model", str(out / "final"), "--device", "cpu", "--n-test", "8",
                 "--samples", "2", "--max-new-tokens", "6", "--output", str(report)]) == 0  # fmt: skip
    got = json.loads(report.read_text())
    assert got["metrics"]["problems"] == 8 and "reasoning-gym basic_arithmetic" in got["data"]


# --------------------------------------------------------------------------------------------
# TextArena
# --------------------------------------------------------------------------------------------

LIMITS = ["--max-turns", "8", "--max-tokens-per-turn", "6", "--max-total-tokens", "96"]


def _target(textarena, seed: int) -> int:
    game = textarena.make("GuessTheNumber-v0-raw")
    game.reset(num_players=1, seed=seed)
    return game.game_number


def _play(textarena, max_turns: int, chat: bool):
    from gspo.envs.driver import Limits, run_episodes
    from gspo.envs.integrations.textarena_games import TextArenaEnv
    from gspo.envs.trajectory import PlainEncoder
    from gspo.rollout.base import SamplingParams

    task = make_task("textarena:GuessTheNumber-v0", n_train=0, n_test=8, seed=0)
    env = TextArenaEnv("GuessTheNumber-v0", chat=chat)
    engine = ScriptedEngine([f"[{k}]" for k in range(1, 21)])  # guesses 1, 2, 3, ... in turn
    limits = Limits(max_turns=max_turns, max_tokens_per_turn=8, max_total_tokens=4000)
    _, trajs = run_episodes(engine, env, PlainEncoder(TOK), task.test, 1,
                            SamplingParams(max_new_tokens=8), limits)  # fmt: skip
    return env, [_target(textarena, e.meta["seed"]) for e in task.test], trajs


@pytest.mark.parametrize("chat", [True, False])
def test_textarena_games_open_with_their_observation_and_only_a_win_is_a_success(textarena, chat):
    env, targets, trajs = _play(textarena, max_turns=20, chat=chat)
    assert env.games_created == len(trajs) == 8  # one game per episode, made in reset
    for t, target in zip(trajs, targets, strict=True):
        opening = t.history[0]["content"]
        reply = t.history[2]["content"] if t.num_turns > 1 else " lower "  # won at once: none
        if chat:  # the game's own opening observation and hints
            assert "Guess The Number" in opening
            assert t.num_turns == 1 or "The target number is" in reply
        else:  # plain mode (char models): the compact rendering
            assert opening == "guess [1-20]:" and reply in (" higher ", " lower ")
        assert t.finish == "stop"  # the game ended each episode
        if target <= 10:  # found within TextArena's 10 guesses: a win
            assert (t.reward, t.success, t.num_turns) == (1.0, True, target)
        else:  # TextArena's turn limit: partial credit for a lost game, no success
            assert 0 < t.reward < 1 and t.success is False
    assert {t.success for t in trajs} == {True, False}  # these seeds hold both cases


def test_a_textarena_episode_cut_by_gspo_earns_nothing(textarena):
    _, targets, trajs = _play(textarena, max_turns=3, chat=False)
    for t, target in zip(trajs, targets, strict=True):
        want = ("turns", 0.0, False) if target > 3 else ("stop", 1.0, True)
        assert (t.finish, t.reward, t.success) == want


def test_textarena_demonstrations_win_and_other_games_have_none(textarena):
    task = make_task("textarena:GuessTheNumber-v0", n_train=3, n_test=2, seed=0)
    assert not {e.meta["seed"] for e in task.train} & {e.meta["seed"] for e in task.test}
    for e in task.train:  # binary searches that find the number
        guesses = [int(g) for g in re.findall(r"\[(\d+)\]", e.demo)]
        assert guesses[0] == 10 and guesses[-1] == _target(textarena, e.meta["seed"])
        assert len(guesses) <= 5
    hanoi = make_task("textarena:TowerOfHanoi-v0", n_train=2, n_test=1, seed=0)
    assert "Tower of Hanoi" in hanoi.train[0].prompt and hanoi.train[0].demo is None
    with pytest.raises(ValueError, match="no environment 'GuessTheNumbr-v0'; did you mean"):
        make_task("textarena:GuessTheNumbr-v0", n_train=1, n_test=1)


@pytest.mark.slow
def test_textarena_trains_and_evaluates_from_the_command_line(textarena, tmp_path):
    task = ["--task", "textarena:GuessTheNumber-v0", "--threads", "1", "--progress", "false"]
    sft, out = tmp_path / "sft", tmp_path / "rl"
    assert main(["sft", *task, *LIMITS, "--model", "tiny", "--device", "cpu", "--steps", "3",
                 "--n-train", "32", "--n-test", "4", "--output-dir", str(sft)]) == 0  # fmt: skip
    assert main(["train", *task, *LIMITS, "--model", str(sft), "--preset", "demo", "--steps",
                 "2", "--n-train", "32", "--n-test", "4", "--output-dir", str(out)]) == 0  # fmt: skip
    rows = _metrics(out / "metrics.jsonl")
    assert len([r for r in rows if "reward/mean" in r]) == 2
    last = [r for r in rows if "eval/success" in r][-1]
    report = tmp_path / "eval.json"
    assert main(["eval", *task, *LIMITS, "--model", str(out / "final"), "--device", "cpu",
                 "--n-test", "4", "--samples", "2", "--output", str(report)]) == 0  # fmt: skip
    got = json.loads(report.read_text())["metrics"]
    assert got["problems"] == 4 and got["success"] == last["eval/success"]  # the same games


# --------------------------------------------------------------------------------------------
# An environment's own metrics keep their namespace in evaluation (verifiers' vf/<name>)
# --------------------------------------------------------------------------------------------


def test_an_environments_namespaced_metrics_are_eval_ns_name(tmp_path):
    """docs/verifiers.md: a rubric's ``vf/<name>`` is logged as ``vf/<name>`` in training and
    ``eval/vf/<name>`` in evaluation (it was ``eval/<name>``, unlike the docs)."""
    from gspo.config import EvalConfig, build
    from gspo.envs.base import ENVIRONMENTS, Step
    from gspo.envs.tasks import TASKS, Task
    from gspo.envs.tasks.base import Example

    class Rubric:  # one turn, scored with a verifiers-style namespaced metric
        name = "vf_metric_names"
        multi_turn = True
        stop_strings = ()

        def reset(self, example):
            return example

        def step(self, state, text, finished):
            return Step(done=True, reward=1.0, success=True, info={"vf/correct": 0.25})

    def build_task(*, n_train, n_test, seed=0, difficulty=None):
        rows = [Example("2+2=", "4", meta={"problem": str(i)}) for i in range(n_test)]
        return Task("vf_metric_names", [], rows, lambda text, ex: 0.0, "metric names")

    TASKS["vf_metric_names"] = build_task
    ENVIRONMENTS["vf_metric_names"] = lambda task, opts, chat: Rubric()
    try:
        from gspo.compose.evaluate import evaluate

        cfg = build(EvalConfig, overrides=dict(task="vf_metric_names", model="tiny", n_test=2,
                    device="cpu", threads=1, samples=0, max_new_tokens=2, max_turns=1,
                    max_total_tokens=8, output=None, progress=False))  # fmt: skip
        metrics = evaluate(cfg)["metrics"]
    finally:
        TASKS.pop("vf_metric_names"), ENVIRONMENTS.pop("vf_metric_names")
    assert metrics["vf/correct"] == 0.25 and "correct" not in metrics
    assert metrics["turns_mean"] == 1.0  # episode/* lose their prefix as before
