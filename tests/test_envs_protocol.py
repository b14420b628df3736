"""The environment protocol for real games: ``reset`` may return the opening observation
(:class:`gspo.Opening`), a cut episode earns the environment's ``cut_reward``, and success is
the environment's flag on the final step (never a positive reward)."""

from __future__ import annotations

import pytest
from envs_support import TOK, ScriptedEngine

from gspo import Opening, Step
from gspo.envs.base import SingleTurnEnv
from gspo.envs.driver import Limits, answer_round, run_episodes
from gspo.envs.guess import GuessEnv
from gspo.envs.tasks.base import Example
from gspo.envs.trajectory import PlainEncoder
from gspo.rollout.base import GenerationRequest, SamplingParams

PARAMS = SamplingParams(max_new_tokens=8)


class Recording(ScriptedEngine):
    """A scripted engine that keeps the prompts of every call."""

    def __init__(self, turns: list[str]) -> None:
        super().__init__(turns)
        self.prompts: list[list[list[int]]] = []

    def generate(self, request):
        self.prompts.append([list(p) for p in request.prompts])
        return super().generate(request)


class Game:
    """A game created in ``reset`` (its opening names its own number); pays partial credit
    on every step and never ends by itself, unless the turn says 'win'."""

    multi_turn = True
    stop_strings = (" ",)
    name = "game"

    def __init__(self, cut_reward: float | None = None) -> None:
        self.created = 0
        if cut_reward is not None:
            self.cut_reward = cut_reward

    def reset(self, example: Example) -> Opening:
        self.created += 1
        return Opening({"game": self.created}, [{"role": "user", "content": f"g{self.created}:"}])

    def step(self, state, text: str, finished: bool) -> Step:
        if text.strip() == "win":
            return Step(done=True, reward=0.5, success=True)
        return Step(done=False, messages=[{"role": "user", "content": "no "}], reward=0.9)


def _run(env, turns: list[str], n: int = 2, **limits):
    engine = Recording(turns)
    examples = [Example(prompt="ignored:", answer="")]
    limit = Limits(**{"max_turns": 2, "max_tokens_per_turn": 8, "max_total_tokens": 64, **limits})
    _, trajs = run_episodes(engine, env, PlainEncoder(TOK), examples, n, PARAMS, limit)
    return engine, trajs


def test_opening_is_the_prompt_and_the_game_is_created_once_per_episode():
    env = Game()
    engine, trajs = _run(env, ["win"])
    assert env.created == 2  # one game per episode, created in reset only
    want = [TOK(f"g{k}:", add_special_tokens=True)["input_ids"] for k in (1, 2)]
    assert [t.prompt_ids for t in trajs] == want
    assert engine.prompts[0] == want  # each episode sampled from its own opening
    assert trajs[0].history[0] == {"role": "user", "content": "g1:"}
    assert [t.success for t in trajs] == [True, True]
    assert [t.reward for t in trajs] == [0.5, 0.5]


def test_a_cut_episode_earns_cut_reward_not_the_last_steps_reward():
    # the turn limit cuts it: the last step said reward 0.9 but was not done
    _, trajs = _run(Game(), ["lose ", "lose "])
    assert [(t.finish, t.reward, t.success) for t in trajs] == [("turns", 0.0, False)] * 2
    _, trajs = _run(Game(cut_reward=-0.25), ["lose ", "lose "])
    assert [(t.finish, t.reward) for t in trajs] == [("turns", -0.25)] * 2
    # a token limit cuts it (the total budget): the same
    _, trajs = _run(Game(cut_reward=0.1), ["lose lose"], max_total_tokens=3)
    assert [(t.finish, t.reward, t.success) for t in trajs] == [("length", 0.1, False)] * 2


def test_success_is_the_environments_flag_not_a_positive_reward():
    class PartialCredit(Game):
        def step(self, state, text, finished):
            return Step(done=True, reward=0.3, success=False)  # a lost game, partial credit

    _, trajs = _run(PartialCredit(), ["lose "])
    assert [(t.reward, t.success) for t in trajs] == [(0.3, False)] * 2


def test_built_in_environments_report_success():
    guess = GuessEnv(plain=True)
    state = guess.reset(Example(prompt="guess 1-15:", answer="5"))
    assert guess.step(state, "3", True).success is None  # not done: no verdict yet
    assert guess.step(state, "5", True).success is True
    # a single-turn task: success is the task's correctness (reward >= 1), not reward > 0
    half = SingleTurnEnv(lambda text, ex: 0.5 if text == "half" else float(text == "1"))
    steps = half.step_batch([Example("p", "1")] * 3, ["1", "half", "0"], [True] * 3)
    assert [s.success for s in steps] == [True, False, False]
    # with a format bonus, success reads the task's own reward
    bonus = SingleTurnEnv(lambda t, e: 1.0, task_reward=lambda t, e: float(t == "1"))
    steps = bonus.step_batch([Example("p", "1")] * 2, ["1", "2"], [True] * 2)
    assert [s.success for s in steps] == [True, False]


def test_a_one_turn_environment_refuses_an_opening_instead_of_ignoring_it():
    class OneTurnGame(Game):
        multi_turn = False

    rollout = ScriptedEngine(["win"]).generate(GenerationRequest([[1]], 1, PARAMS))
    with pytest.raises(ValueError, match="Opening"):
        answer_round(OneTurnGame(), TOK, rollout, [Example("p", "")], 1.0)


def test_one_turn_trajectories_keep_exactly_the_masked_tokens_of_each_row():
    """answer_round and decode_completions take each row's tokens and log-probs where its mask
    is 1 (as plain lists now, no per-row tensor indexing): holes and padding are left out."""
    import torch

    from gspo.envs.driver import decode_completions
    from gspo.rollout.base import Rollout

    ids = TOK(["abc", "de"], add_special_tokens=False)["input_ids"]
    completion_ids = torch.tensor([ids[0], [*ids[1], TOK.pad_token_id]])  # [2, 3]
    mask = torch.tensor([[1, 0, 1], [1, 1, 0]])  # row 0 with a hole, row 1 right-padded
    logprobs = torch.tensor([[-0.5, -9.0, -0.25], [-1.0, -2.0, 0.0]])  # [2, 3]
    rollout = Rollout(
        prompt_ids=torch.tensor([[1], [1]]),
        prompt_mask=torch.ones(2, 1, dtype=torch.long),
        completion_ids=completion_ids,
        completion_mask=mask,
        logprobs=logprobs,
        finish_reasons=["stop", "length"],
        prompt_index=torch.tensor([0, 1]),
    )
    assert decode_completions(TOK, completion_ids, mask) == ["ac", "de"]
    env = SingleTurnEnv(lambda text, ex: float(text == ex.answer))
    trajs = answer_round(env, TOK, rollout, [Example("p", "ac"), Example("q", "x")], 1.0)
    assert [t.reward for t in trajs] == [1.0, 0.0]
    assert trajs[0].history[-1]["content"] == "ac"
    assert trajs[0].ids == [ids[0][0], ids[0][2]] and trajs[1].ids == ids[1]
    assert trajs[0].logprobs == [-0.5, -0.25] and trajs[1].logprobs == [-1.0, -2.0]
    assert all(type(x) is int for t in trajs for x in t.ids)
