"""User prompts the tiny models' character tokenizer lacks characters for, and prompts past the
model's context: they train (counted), are truncated or skipped (counted), or stop the run with a
message naming the problem, the limit and the way out."""

from __future__ import annotations

import json

import pytest

from gspo.compose.parts import prompt_token_limit
from gspo.compose.train import train
from gspo.config import TrainConfig, build
from gspo.models.char_tokenizer import UNK_ID, build_char_tokenizer

UNICODE_PROMPTS = {
    "newline": "line one\nline two: 1+1=",
    "accented letter": "café: 1+1=",
    "euro sign": "5 € + 1 € =",
    "emoji": "🙂 2+2=",
}


@pytest.mark.parametrize("name", list(UNICODE_PROMPTS))
def test_char_tokenizer_encodes_any_character(name):
    tok = build_char_tokenizer()
    text = UNICODE_PROMPTS[name]
    ids = tok(text)["input_ids"]  # raised "WordLevel error: Missing [UNK] token" before
    assert len(ids) == len(text) + 1  # one token per code point, after <bos>
    kept = "".join(c for c in text if c.isascii())
    assert tok.decode(ids, skip_special_tokens=True) == kept  # <unk> is dropped on decode
    assert (UNK_ID in ids) == (kept != text)
    batch = tok(list(UNICODE_PROMPTS.values()), padding=True)  # padding works with them too
    assert len({len(row) for row in batch["input_ids"]}) == 1


def write_data(path, prompts: list[str]) -> str:
    path.write_text("".join(json.dumps({"prompt": p, "answer": "2"}) + "\n" for p in prompts))
    return str(path)


def file_cfg(tmp_path, prompts: list[str], **kw) -> TrainConfig:
    data = write_data(tmp_path / "train.jsonl", prompts)
    return build(
        TrainConfig,
        preset="smoke",
        overrides=dict(
            device="cpu",
            output_dir=str(tmp_path / "run"),
            task="file",
            train_file=data,
            reward="exact_match",
            steps=1,
            **kw,
        ),
    )


def test_training_on_unicode_prompts_counts_them(tmp_path):
    prompts = [*UNICODE_PROMPTS.values(), "1+1=", "3+4="]
    result = train(file_cfg(tmp_path, prompts))
    data = next(r for r in result.history if "data/train_problems" in r)
    assert data["data/train_problems"] == 6
    assert data["data/prompts_with_unknown_chars"] == 3  # the newline is a real token


def test_default_prompt_limit_follows_the_context():
    assert prompt_token_limit(0, 8, 256)[0] == 248
    assert prompt_token_limit(100, 8, 256)[0] == 100
    assert prompt_token_limit(0, 8, None)[0] == 0  # unknown context: no limit
    with pytest.raises(ValueError, match="exceeds the model's 256-token context"):
        prompt_token_limit(250, 8, 256)
    with pytest.raises(ValueError, match="no room for a prompt"):
        prompt_token_limit(0, 256, 256)


def test_prompt_past_the_context_is_an_error_by_default(tmp_path):
    long = "1+" * 5000 + "1="  # 10,002 characters against a 256-position model
    with pytest.raises(ValueError) as info:
        train(file_cfg(tmp_path, ["1+1=", long]))
    message = str(info.value)
    assert "train.jsonl row 1 has a 10003-token prompt" in message  # the file and its row
    assert "256-token context" in message and "max_new_tokens=4" in message
    assert "long_prompts" in message


@pytest.mark.parametrize(
    "policy, truncated, skipped, kept", [("truncate", 1, 0, 2), ("skip", 0, 1, 1)]
)
def test_prompt_past_the_context_truncated_or_skipped_and_counted(
    tmp_path, policy, truncated, skipped, kept
):
    long = "1+" * 5000 + "1="
    result = train(file_cfg(tmp_path, ["1+1=", long], long_prompts=policy))
    data = next(r for r in result.history if "data/train_problems" in r)
    assert data["data/prompts_truncated"] == truncated
    assert data["data/prompts_skipped"] == skipped
    assert data["data/train_problems"] == kept
