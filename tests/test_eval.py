"""Evaluation metrics on fixed fake generations (hand-computed avg@k / pass@k), and `gspo eval`."""

from __future__ import annotations

import json
import math

import pytest
import torch

from gspo.compose.evaluate import eval_examples
from gspo.config import EvalConfig, build
from gspo.envs.rewards import exact_match
from gspo.envs.tasks.base import Example
from gspo.interface.cli import main
from gspo.models.char_tokenizer import EOS_ID, PAD_ID, build_char_tokenizer
from gspo.models.chat import PromptFormat
from gspo.orchestration.evaluation import evaluate, pass_at_k, summarize
from gspo.rollout.base import Rollout, SamplingParams


class FakeEngine:
    """Returns fixed completions: ``table[prompt] = (greedy, [samples...])``. A completion
    ending in "~" is returned as truncated (finish "length", no EOS); others end with EOS."""

    def __init__(self, tokenizer, table: dict[str, tuple[str, list[str]]]) -> None:
        self.tok = tokenizer
        self.table = table
        self.device = torch.device("cpu")
        self.calls: list[SamplingParams] = []

    def generate(self, request) -> Rollout:
        prompts, n, params = request.prompts, request.n, request.params
        self.calls.append(params)
        rows: list[list[int]] = []
        reasons: list[str] = []
        for ids in prompts:
            prompt = self.tok.decode(ids, skip_special_tokens=True)
            greedy, samples = self.table[prompt]
            texts = [greedy] if params.temperature == 0 else samples[:n]
            assert len(texts) == n
            for text in texts:
                body = self.tok(text, add_special_tokens=False)["input_ids"]
                truncated = text.endswith("~")
                rows.append(body if truncated else [*body, EOS_ID])
                reasons.append("length" if truncated else "stop")
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), PAD_ID)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r)
            mask[i, : len(r)] = 1
        p = torch.ones((len(rows), 1), dtype=torch.long)
        return Rollout(
            prompt_ids=p,
            prompt_mask=p,
            completion_ids=ids,
            completion_mask=mask,
            logprobs=torch.zeros(ids.shape),
            finish_reasons=reasons,
            prompt_index=torch.arange(len(prompts)).repeat_interleave(n),
        )


# Three problems, k = 4 samples each: 2, 0 and 4 correct; greedy right on problems 0 and 2.
TABLE = {
    "1+1=": ("2", ["2", "3", "2", "5"]),
    "2+2=": ("5", ["3", "3", "1", "0~"]),
    "3+3=": ("6", ["6", "6", "6", "6"]),
}
EXAMPLES = [Example("1+1=", "2"), Example("2+2=", "4"), Example("3+3=", "6")]


def test_pass_at_k_hand_values():
    assert pass_at_k(4, 0, 1) == 0.0
    assert pass_at_k(4, 1, 1) == 0.25
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - 3 / 6)  # 1 - C(3,2)/C(4,2)
    assert pass_at_k(4, 2, 2) == pytest.approx(1 - 1 / 6)
    assert pass_at_k(4, 2, 3) == 1.0  # n - c < k
    assert pass_at_k(5, 2, 3) == pytest.approx(1 - 1 / 10)  # 1 - C(3,3)/C(5,3)
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)


@pytest.mark.parametrize("batch_size", [256, 4, 1])
def test_evaluate_on_fixed_generations(batch_size):
    tok = build_char_tokenizer()
    engine = FakeEngine(tok, TABLE)
    details: list[dict] = []
    fmt = PromptFormat(tok, chat=False, stop_token_ids=(EOS_ID, 7))
    m = evaluate(
        engine,
        tok,
        EXAMPLES,
        exact_match,
        max_new_tokens=8,
        samples=4,
        batch_size=batch_size,
        prompt_format=fmt,
        details=details,
    )
    assert m["problems"] == 3
    # Greedy: problems 0 and 2 right.
    assert m["greedy_accuracy"] == pytest.approx(2 / 3)
    assert m["greedy_accuracy_se"] == pytest.approx(math.sqrt((1 / 3) / 3))  # std(1,0,1)/sqrt(3)
    # avg@4 per problem: 0.5, 0, 1 -> 0.5, sample std 0.5, se 0.5/sqrt(3).
    assert m["avg@4"] == pytest.approx(0.5)
    assert m["avg@4_se"] == pytest.approx(0.5 / math.sqrt(3))
    # pass@4 per problem: 1, 0, 1.
    assert m["pass@4"] == pytest.approx(2 / 3)
    assert m["pass@4_se"] == pytest.approx(math.sqrt((1 / 3) / 3))
    # pass@1 is avg@4 for 0/1 rewards.
    assert m["pass@1"] == pytest.approx(0.5)
    # Lengths count the EOS token of finished completions: greedy "2","5","6" -> 2 each.
    assert m["greedy_response_length"] == 2.0
    assert m["greedy_truncated_fraction"] == 0.0
    # Samples: 11 of them are 1 char + EOS (2 tokens); "0~" is 2 chars, truncated, no EOS.
    assert m["response_length"] == pytest.approx((11 * 2 + 2) / 12)
    assert m["truncated_fraction"] == pytest.approx(1 / 12)
    assert m["reward_errors"] == 0
    # Stop tokens of the prompt format reach the engine, greedy first.
    assert engine.calls[0].temperature == 0 and engine.calls[0].stop_token_ids == (EOS_ID, 7)
    assert details[1] == {
        "prompt": "2+2=",
        "answer": "4",
        "greedy": "5",
        "greedy_reward": 0.0,
        "samples": ["3", "3", "1", "0~"],
        "rewards": [0.0, 0.0, 0.0, 0.0],
    }


def test_evaluate_defaults_to_raw_prompts_ending_on_eos():
    tok = build_char_tokenizer()
    engine = FakeEngine(tok, TABLE)
    m = evaluate(engine, tok, EXAMPLES, exact_match, max_new_tokens=8, samples=0)
    assert m["greedy_accuracy"] == pytest.approx(2 / 3) and "avg@1" not in m
    assert len(engine.calls) == 1 and engine.calls[0].stop_token_ids == (EOS_ID,)


def test_summarize_matches_pass_at_k_of_each_problem():
    rewards = [[1, 0, 0, 0, 1], [0, 0, 0, 0, 0], [1, 1, 1, 1, 1]]
    s = summarize(rewards, 2)
    assert s["pass@2"] == pytest.approx((pass_at_k(5, 2, 2) + 0 + 1) / 3)
    assert s["avg@2"] == pytest.approx((0.4 + 0 + 1) / 3)


def test_eval_examples_from_data_file_and_task(tmp_path):
    path = tmp_path / "gsm.jsonl"
    rows = [{"question": f"{i}+{i}=", "answer": f"{i} + {i}\n#### {2 * i}"} for i in range(5)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = build(
        EvalConfig,
        overrides={
            "data": str(path),
            "prompt_key": "question",
            "answer_format": "gsm8k",
            "reward": "numeric",
            "limit": 3,
        },
    )
    examples, reward, where = eval_examples(cfg)
    assert [e.answer for e in examples] == ["0", "2", "4"]
    assert reward("so 4", examples[2]) == 1.0 and "gsm.jsonl" in where
    cfg = build(EvalConfig, overrides={"task": "word_problems", "n_test": 7, "difficulty": 1})
    examples, reward, _ = eval_examples(cfg)
    assert len(examples) == 7 and reward(examples[0].demo, examples[0]) == 1.0


def test_gspo_eval_command_writes_json(tmp_path, capsys):
    """The CLI end to end on a random tiny model (raw prompts, addition): metrics and records."""
    out = tmp_path / "eval.json"
    rc = main(
        [
            "eval",
            "--model", "tiny",
            "--task", "addition",
            "--n-test", "6",
            "--samples", "3",
            "--max-new-tokens", "3",
            "--hidden-size", "32",
            "--num-layers", "1",
            "--device", "cpu",
            "--output", str(out),
            "--show", "2",
            "--progress", "false",
        ]
    )  # fmt: skip
    assert rc == 0
    report = json.loads(out.read_text())
    m = report["metrics"]
    for key in (
        "greedy_accuracy",
        "greedy_accuracy_se",
        "avg@3",
        "avg@3_se",
        "pass@3",
        "pass@3_se",
        "pass@1",
        "response_length",
        "truncated_fraction",
    ):
        assert key in m, key
    assert m["problems"] == 6 and 1 <= m["response_length"] <= 3
    assert report["chat_template"] is False
    assert len(report["examples"]) == 2 and len(report["examples"][0]["samples"]) == 3
    assert "avg@3" in capsys.readouterr().out


def test_gspo_eval_rejects_bad_flags(capsys):
    assert main(["eval", "--samples", "0", "--greedy", "false"]) == 2
    assert "nothing to score" in capsys.readouterr().err
    argv = ["eval", "--model", "no/such/dir", "--task", "addition", "--n-test", "1"]
    assert main([*argv, "--progress", "false", "--output", ""]) == 2
    assert "not a named model" in capsys.readouterr().err


def test_evaluate_model_is_the_one_held_out_helper():
    """SFT, gspo eval, the SmolLM2 experiment and the vs_trl benchmark all score a model in hand
    with evaluate_model: the same numbers as evaluate() on an engine over that model."""
    from gspo.envs.tasks import make_task
    from gspo.models.tiny_model import build_tiny_model
    from gspo.orchestration.evaluation import evaluate_model
    from gspo.rollout.torch_engine import TorchEngine

    tok = build_char_tokenizer()
    model = build_tiny_model(len(tok), hidden_size=32, num_layers=1, seed=0)
    task = make_task("addition", n_train=1, n_test=6, seed=0)
    kw = dict(max_new_tokens=3, samples=2, generator=None)
    engine = TorchEngine(model, pad_id=tok.pad_token_id, eos_id=tok.eos_token_id)
    ref = evaluate(
        engine, tok, task.test, task.reward, **{**kw, "generator": torch.Generator().manual_seed(1)}
    )
    got = evaluate_model(
        model, tok, task.test, task.reward, **{**kw, "generator": torch.Generator().manual_seed(1)}
    )
    assert got == ref and "greedy_accuracy" in got
