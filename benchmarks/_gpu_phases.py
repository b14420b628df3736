"""The phases of ``gpu_ready.py`` (its docstring says what each measures), and the FLOP count
its MFU uses. Every phase writes its figures into ``res`` and stops its timed loop at
``deadline`` (``time.perf_counter`` seconds), after at least one timed iteration."""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from gspo.rollout.base import GenerationRequest


def peak_flops(name: str) -> float:
    """bf16 dense peak FLOP/s of a CUDA device by its name (0: unknown, MFU not computed)."""
    if "H100" in name or "H200" in name or "GH200" in name:
        if "PCIe" in name:
            return 756e12
        return 835e12 if "NVL" in name else 989e12
    if "A100" in name:
        return 312e12
    return 0.0


def flops_per_token(c: dict[str, int], seq_len: int, head_size: int) -> float:
    """Training FLOPs per token: 6 x matmul parameters + 12 x l x h x head_size x seq_len."""
    h, heads, kv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
    hd = c["head_dim"]
    layer = h * heads * hd * 2 + 2 * h * kv * hd + 3 * h * c["intermediate_size"]  # q,o,k,v,mlp
    matmul = c["num_hidden_layers"] * layer + c["vocab_size"] * h  # + LM head
    return 6.0 * matmul + 12.0 * c["num_hidden_layers"] * heads * head_size * seq_len


def sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def random_prompts(gen, n: int, length: int, vocab: int) -> list[list[int]]:
    import torch

    ids = torch.randint(3, vocab, (n, length), generator=gen)  # [n, length], no special ids
    return ids.tolist()


def vllm_phase(args, model, shape, res, deadline) -> Any:
    """Start vLLM on the model; timed generation. Returns (engine, rollout) or (None, None)."""
    import torch

    from gspo.rollout.base import SamplingParams
    from gspo.rollout.vllm_engine import VLLMEngine, VLLMOptions, vllm_available

    if not vllm_available():
        res["skipped"]["vllm"] = "vLLM is not installed (pip install -e '.[vllm]' on GPU machines)"
        return None, None
    t0 = time.perf_counter()
    opts = VLLMOptions(
        dtype="bfloat16",
        gpu_memory_utilization=args.vllm_memory,
        max_model_len=args.prompt_tokens + args.new_tokens + 8,
        enforce_eager=args.tiny,  # CUDA graphs on the GPU (vLLM's default there)
    )
    engine = VLLMEngine(model, pad_id=0, eos_id=shape["vocab_size"] - 1, options=opts, seed=0)
    try:
        res["vllm_startup_s"] = time.perf_counter() - t0
        deadline = max(deadline, time.perf_counter() + 1)  # the start-up may have used it all
        gen = torch.Generator().manual_seed(0)
        params = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0)
        prompts = random_prompts(gen, args.prompts, args.prompt_tokens, shape["vocab_size"] - 1)
        engine.generate(
            GenerationRequest(prompts[:2], 2, SamplingParams(max_new_tokens=8), gen)
        )  # warm-up
        times, rollout, tokens = [], None, 0
        while not times or (time.perf_counter() < deadline and len(times) < args.repeats):
            t0 = time.perf_counter()
            rollout = engine.generate(GenerationRequest(prompts, args.group, params, gen))
            times.append(time.perf_counter() - t0)
            tokens += int(rollout.completion_mask.sum())
        res["vllm_gen_tokens_per_s"] = tokens / sum(times)
        res["vllm_gen_calls"] = len(times)
        res["vllm_gen_tokens_per_call"] = tokens / len(times)
    except BaseException:
        engine.close()  # its GPU memory back for the trainer phase
        raise
    return engine, rollout


def mismatch_phase(model, rollout, device, chunk: int, res) -> None:
    """Trainer (bf16) re-scores the engine's (bf16) samples: |Δ| and the ratio spread."""
    import torch

    from gspo.models.logprobs import token_logprobs

    r = rollout.to(device)
    parts = []
    with torch.no_grad():
        for i in range(0, r.num_samples, chunk):  # chunks: the full batch's logits would not fit
            rows = slice(i, i + chunk)
            lp, _ = token_logprobs(
                model,
                r.prompt_ids[rows],
                r.prompt_mask[rows],
                r.completion_ids[rows],
                r.completion_mask[rows],
            )  # [chunk, L]
            parts.append(lp)
    trainer = torch.cat(parts)  # [N, L]
    mask = r.completion_mask.bool()  # [N, L]
    delta = (trainer.float() - r.logprobs.float().to(device))[mask]  # [tokens]
    ratio = delta.exp()  # [tokens] per-token importance ratio π_trainer / π_engine
    per_seq = (trainer.float() - r.logprobs.float()) * mask  # [N, L]
    seq_ratio = (per_seq.sum(1) / mask.sum(1).clamp(min=1)).exp()  # [N] GSPO sequence ratio
    res["mismatch"] = {
        "tokens": int(mask.sum()),
        "mean_abs": float(delta.abs().mean()),
        "max_abs": float(delta.abs().max()),
        "token_ratio_std": float(ratio.std()),
        "token_ratio_min": float(ratio.min()),
        "token_ratio_max": float(ratio.max()),
        "seq_ratio_min": float(seq_ratio.min()),
        "seq_ratio_max": float(seq_ratio.max()),
    }


def synthetic_rollout(gen, rows: int, prompt_len: int, comp_len: int, vocab: int):
    import torch

    from gspo.rollout.base import Rollout

    return Rollout(
        prompt_ids=torch.randint(3, vocab, (rows, prompt_len), generator=gen),  # [N, P]
        prompt_mask=torch.ones(rows, prompt_len, dtype=torch.long),  # [N, P]
        completion_ids=torch.randint(3, vocab, (rows, comp_len), generator=gen),  # [N, L]
        completion_mask=torch.ones(rows, comp_len, dtype=torch.long),  # [N, L]
        logprobs=torch.full((rows, comp_len), -float(torch.log(torch.tensor(vocab)))),  # [N, L]
        finish_reasons=["length"] * rows,
        prompt_index=torch.arange(rows),  # [N] each row its own prompt: no shared prefill
    )


def advantages_for(gen, rows: int, group: int):
    import torch

    reward = torch.randn(rows, generator=gen).view(-1, group)  # [prompts, G]
    adv = (reward - reward.mean(1, keepdim=True)) / (reward.std(1, keepdim=True) + 1e-4)
    return adv.flatten()  # [N]


def scored(rollout, old_logprobs, advantages, step: int):
    """The batch ``TrainingBackend.update`` takes: the rollout with its old log-probs [N, L],
    advantages [N] and the step (the rewards are not read by the update)."""
    import torch

    from gspo.rollout.base import RolloutBatch

    rewards = torch.zeros(rollout.num_samples, dtype=torch.float64)  # [N]
    return RolloutBatch(
        rollout, rewards, advantages=advantages, old_logprobs=old_logprobs, step=step
    )


def trainer_phase(args, backend, shape, device, peak, res, deadline, key="trainer") -> None:
    """gspo's update on synthetic full-length batches; tokens/s and MFU as prime-rl counts.
    The old log-probs are the policy's own (a recompute pass, outside the timed update), so the
    ratios start at 1 and the loss and clip values mean what they mean in a run. Figures go
    under ``key`` (``trainer``; ``compiled`` for :func:`compiled_phase`); the first step's
    seconds (warm-up, not in tokens/s) as ``{key}_first_step_s``, the median of the others as
    ``{key}_step_s``."""
    import torch

    gen = torch.Generator().manual_seed(1)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()  # vLLM's memory, allocated in this process, stays in
    prompt_len, comp_len = train_lengths(args)
    rows = args.train_seqs
    update_s, tokens = [], []  # per step: seconds of the update alone, tokens processed
    for step in range(args.train_steps + 1):  # step 0: warm-up, outside the timed window
        rollout = synthetic_rollout(gen, rows, prompt_len, comp_len, shape["vocab_size"] - 1)
        rollout = rollout.to(device)
        adv = torch.randn(rows, generator=gen).to(device)  # [N]
        old, _ = backend.old_logprobs(rollout)  # [N, L] the policy's own, before the update
        sync(device)
        t0 = time.perf_counter()  # the recompute pass is not the update's time
        res[f"{key}_loss"] = backend.update(scored(rollout, old, adv, step)).get("loss")
        sync(device)
        update_s.append(time.perf_counter() - t0)
        tokens.append(rows * args.train_len)
        if time.perf_counter() > deadline and len(update_s) >= 3:
            break
    res[f"{key}_first_step_s"] = update_s[0]
    if len(update_s) < 2:
        return
    tps = sum(tokens[1:]) / sum(update_s[1:])
    res[f"{key}_tokens_per_s"] = tps
    res[f"{key}_step_s"] = statistics.median(update_s[1:])
    res[f"{key}_steps_timed"] = len(update_s) - 1
    res[f"{key}_tokens_per_step"] = rows * args.train_len
    hd_prime = shape["hidden_size"] // shape["num_attention_heads"]
    if peak:
        mfu = flops_per_token(shape, args.train_len, shape["head_dim"]) * tps / peak
        res["mfu" if key == "trainer" else f"{key}_mfu"] = 100 * mfu
        mfu = flops_per_token(shape, args.train_len, hd_prime) * tps / peak
        res["mfu_primerl" if key == "trainer" else f"{key}_mfu_primerl"] = 100 * mfu
    if device.type == "cuda":
        res[f"{key}_peak_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30


def train_lengths(args) -> tuple[int, int]:
    """(prompt, completion) tokens of the trainer phases' sequences: a quarter is prompt."""
    prompt_len = args.train_len // 4
    return prompt_len, args.train_len - prompt_len


def compiled_phase(args, model, shape, device, peak, res, deadline) -> None:
    """:func:`trainer_phase` with gspo's ``compile`` option (a backend of its own on the same
    model): the training forward + backward and the loss under ``torch.compile``, a graph
    each. The compile is the first step's: ``compile_s`` is the first calls of
    the new graphs (trace, compile or inductor-cache load of forward and backward, one run of
    each; gspo.models.compiled_forward.RECORD), apart from the warm per-step time, and the
    break-even step is compile_s over the per-step saving against the eager ``trainer`` phase
    (None when that phase did not run or compiled steps are not faster)."""
    from gspo.models.compiled_forward import RECORD

    res["compile_cache"] = _inductor_cache_state()
    keys, spent = set(RECORD.keys), RECORD.first_call_s
    backend = build_backend(args, model, device, compile=True)
    trainer_phase(args, backend, shape, device, peak, res, deadline, key="compiled")
    res["compile_graphs"] = len(RECORD.keys - keys)
    res["compile_s"] = RECORD.first_call_s - spent
    if "compiled_step_s" in res and "trainer_step_s" in res:
        saving = res["trainer_step_s"] - res["compiled_step_s"]
        res["compile_speedup"] = res["trainer_step_s"] / res["compiled_step_s"]
        res["compile_break_even_step"] = res["compile_s"] / saving if saving > 0 else None


def e2e_phase(args, backend, engine, shape, device, res, deadline) -> None:
    """Whole RL steps: vLLM generation, gspo's update, weight sync into vLLM."""
    import torch

    from gspo.rollout.base import SamplingParams

    gen = torch.Generator().manual_seed(2)
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0)
    walls, tokens, parts = [], [], {"generate": 0.0, "update": 0.0, "sync": 0.0}
    for step in range(args.e2e_steps):
        prompts = random_prompts(gen, args.prompts, args.prompt_tokens, shape["vocab_size"] - 1)
        t0 = time.perf_counter()
        rollout = engine.generate(GenerationRequest(prompts, args.group, params, gen))
        t1 = time.perf_counter()
        r = rollout.to(device)
        adv = advantages_for(gen, rollout.num_samples, args.group).to(device)  # [N]
        backend.update(scored(r, r.logprobs, adv, step))
        sync(device)
        t2 = time.perf_counter()
        backend.push_weights(engine)
        t3 = time.perf_counter()
        if step > 0:  # step 0 warms the update up
            walls.append(t3 - t0)
            tokens.append(int(rollout.prompt_mask.sum() + rollout.completion_mask.sum()))
            for k, dt in zip(parts, (t1 - t0, t2 - t1, t3 - t2), strict=True):
                parts[k] += dt
        if time.perf_counter() > deadline and len(walls) >= 1:
            break
    if walls:
        res["e2e_tokens_per_s"] = sum(tokens) / sum(walls)
        res["e2e_steps_timed"] = len(walls)
        res["e2e_step_s"] = statistics.median(walls)
        res["e2e_share"] = {k: v / sum(walls) for k, v in parts.items()}


def _inductor_cache_state() -> str:
    """Inductor's cache before the compile: "cold" when its folder is empty or absent, else
    "warm"; "unknown" where this torch does not say where it is (a private module)."""
    try:
        from torch._inductor.runtime.cache_dir_utils import cache_dir
    except ImportError:
        return "unknown"
    folder = Path(cache_dir())
    return "warm" if folder.is_dir() and any(folder.iterdir()) else "cold"


def build_model(shape: dict, device):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        **shape, bos_token_id=1, eos_token_id=shape["vocab_size"] - 1, pad_token_id=0
    )
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).to(device=device, dtype=torch.bfloat16)
    return model


def build_backend(args, model, device, *, compile: bool = False):
    """gspo's local backend on ``model``; ``compile``: with the compiled update. Its longest
    completion (max_new_tokens, the compiled forward's cap on completion columns) is the
    longest either phase feeds it, so the trainer phases' sequences fill one bucket exactly."""
    from gspo.backend.local import LocalBackend
    from gspo.config import TrainConfig, build

    cfg = build(
        TrainConfig,
        overrides=dict(
            device=device.type,
            dtype="bfloat16",
            algo="gspo",
            lr=1e-6,
            group_size=args.group,
            micro_batch_size=args.micro_batch,
            max_new_tokens=max(args.new_tokens, train_lengths(args)[1]),
            compile=compile,
        ),
    )
    return LocalBackend(cfg, model, device)
