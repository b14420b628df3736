"""GPU readiness in one call: a Qwen3-0.6B-shaped random-init model through gspo's trainer and
vLLM engine, with every phase time-boxed so the whole call stays under ten minutes.

    python benchmarks/gpu_ready.py                 # one H100 / H200 (about 5-8 minutes)
    python benchmarks/gpu_ready.py --tiny          # CPU, a tiny shape, seconds (the test's path)

Phases, in order (each gets a budget; a phase whose budget no longer fits in what is left of
``--budget`` is skipped with a line saying so, and a phase stops its timed loop at its budget):

1. ``vllm``: gspo's :class:`~gspo.rollout.vllm_engine.VLLMEngine` in bfloat16 samples
   ``--prompts`` x ``--group`` completions of ``--new-tokens`` tokens from random prompts of
   ``--prompt-tokens`` tokens; generated tokens/s (after one warm-up call) and start-up seconds.
2. ``mismatch``: the trainer (bfloat16 policy, same weights) re-scores those samples with
   :func:`gspo.models.token_logprobs`; mean/max |Δ log-prob| and the spread of the per-token
   importance ratio exp(Δ) and of GSPO's sequence ratio exp(mean Δ).
3. ``trainer``: gspo's update (:class:`~gspo.backend.local.LocalBackend`, GSPO loss, AdamW) on
   synthetic batches of ``--train-seqs`` sequences of ``--train-len`` tokens; tokens/s as
   prime-rl's ``PerfCounter`` counts it (every processed token, prompt included, over the wall
   time of whole steps after the first) and MFU (formula below).
4. ``e2e``: whole RL steps: generate with vLLM, update, sync the weights into vLLM; tokens
   (prompt + completion, every sample) per second of step wall time.

MFU = FLOPs per token x tokens/s / peak. FLOPs per token = 6 x (matmul parameters: q, k, v, o,
MLP, LM head) + 12 x layers x heads x head size x sequence length (PaLM's attention term, no
causal discount), as prime-rl's ``PerfCounter``; theirs takes head size = hidden / heads (64
for Qwen3-0.6B, whose heads are 128 wide), ``mfu_primerl`` here, and ``mfu`` uses the real head
size. Peak: bf16 dense, H100/H200 SXM 989 TFLOP/s (PCIe 756, NVL 835), by device name.

The table is printed beside prime-rl's published 11.9k trainer tokens/s (Qwen3-0.6B, full RL,
16384-token sequences, activation recompute, FlashAttention 3, one H100; their
benchmarks/results/BENCHMARKS.md). Results go to a new JSON file (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import OUT_HELP, dated_result

PRIME_RL_TPS = 11_900  # trainer tokens/s, Qwen3-0.6B RL full, seq 16384, 1xH100 (prime-rl)
PRIME_RL_MFU = 11.1  # their MFU (%) on that row

# Qwen3-0.6B's shape (its config.json), random init: speed only, it learns nothing.
QWEN3_06B = dict(
    vocab_size=151936,
    hidden_size=1024,
    intermediate_size=3072,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    max_position_embeddings=40960,
    tie_word_embeddings=True,
)
TINY = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=32,  # a head size vLLM's CPU attention runs
    max_position_embeddings=512,
    tie_word_embeddings=True,
)
# Seconds of budget per phase on a GPU (--tiny: a tenth).
PHASES = {"vllm": 150, "mismatch": 30, "trainer": 150, "e2e": 180}


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
    res["vllm_startup_s"] = time.perf_counter() - t0
    deadline = max(deadline, time.perf_counter() + 1)  # the start-up may have used it all
    gen = torch.Generator().manual_seed(0)
    params = SamplingParams(max_new_tokens=args.new_tokens, temperature=1.0)
    prompts = random_prompts(gen, args.prompts, args.prompt_tokens, shape["vocab_size"] - 1)
    engine.generate(prompts[:2], 2, SamplingParams(max_new_tokens=8), gen)  # warm-up
    times, rollout, tokens = [], None, 0
    while not times or (time.perf_counter() < deadline and len(times) < args.repeats):
        t0 = time.perf_counter()
        rollout = engine.generate(prompts, args.group, params, gen)
        times.append(time.perf_counter() - t0)
        tokens += int(rollout.completion_mask.sum())
    res["vllm_gen_tokens_per_s"] = tokens / sum(times)
    res["vllm_gen_calls"] = len(times)
    res["vllm_gen_tokens_per_call"] = tokens / len(times)
    return engine, rollout


def mismatch_phase(model, rollout, device, chunk: int, res) -> None:
    """Trainer (bf16) re-scores the engine's (bf16) samples: |Δ| and the ratio spread."""
    import torch

    from gspo.models import token_logprobs

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


def trainer_phase(args, backend, shape, device, peak, res, deadline) -> None:
    """gspo's update on synthetic full-length batches; tokens/s and MFU as prime-rl counts."""
    import torch

    gen = torch.Generator().manual_seed(1)
    prompt_len = args.train_len // 4
    comp_len = args.train_len - prompt_len
    rows = args.train_seqs
    stamps, tokens = [], []
    for step in range(args.train_steps + 1):  # step 0: warm-up, outside the timed window
        rollout = synthetic_rollout(gen, rows, prompt_len, comp_len, shape["vocab_size"] - 1)
        old = rollout.logprobs.to(device)  # [N, L]
        adv = torch.randn(rows, generator=gen).to(device)  # [N]
        backend.update(rollout.to(device), old, adv, step)
        sync(device)
        stamps.append(time.perf_counter())
        tokens.append(rows * args.train_len)
        if time.perf_counter() > deadline and len(stamps) >= 3:
            break
    if len(stamps) < 2:
        return
    tps = sum(tokens[1:]) / (stamps[-1] - stamps[0])
    res["trainer_tokens_per_s"] = tps
    res["trainer_steps_timed"] = len(stamps) - 1
    res["trainer_tokens_per_step"] = rows * args.train_len
    hd_prime = shape["hidden_size"] // shape["num_attention_heads"]
    if peak:
        res["mfu"] = 100 * flops_per_token(shape, args.train_len, shape["head_dim"]) * tps / peak
        res["mfu_primerl"] = 100 * flops_per_token(shape, args.train_len, hd_prime) * tps / peak
    if device.type == "cuda":
        res["trainer_peak_mem_gib"] = torch.cuda.max_memory_allocated() / 2**30


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
        rollout = engine.generate(prompts, args.group, params, gen)
        t1 = time.perf_counter()
        r = rollout.to(device)
        adv = advantages_for(gen, rollout.num_samples, args.group).to(device)  # [N]
        backend.update(r, r.logprobs, adv, step)
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


def build_model(shape: dict, device):
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        **shape, bos_token_id=1, eos_token_id=shape["vocab_size"] - 1, pad_token_id=0
    )
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).to(device=device, dtype=torch.bfloat16)
    return model


def build_backend(args, model, device):
    from gspo.backend.local import LocalBackend
    from gspo.config import TrainConfig, build
    from gspo.config.combinations import split

    cfg = build(
        TrainConfig,
        overrides=dict(
            device=device.type,
            dtype="bfloat16",
            algo="gspo",
            lr=1e-6,
            group_size=args.group,
            micro_batch_size=args.micro_batch,
        ),
    )
    return LocalBackend(split(cfg), model, device)


def run(args) -> dict[str, Any]:
    import torch

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    end = start + args.budget
    device = torch.device("cpu" if args.tiny else "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_ready.py: no CUDA device visible to torch (use --tiny on CPU)")
    name = torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu"
    peak = peak_flops(name)
    shape = TINY if args.tiny else QWEN3_06B
    res: dict[str, Any] = {
        "device": name,
        "peak_flops": peak,
        "shape": shape,
        "skipped": {},
        "args": vars(args),
        "torch": torch.__version__,
    }
    model = build_model(shape, device)
    res["params"] = sum(p.numel() for p in model.parameters())
    scale = 0.1 if args.tiny else 1.0

    def admit(phase: str) -> float | None:
        """The phase's deadline, or None (skipped, with the reason) when it cannot fit."""
        budget = PHASES[phase] * scale
        left = end - time.perf_counter()
        if left < budget * 0.5:
            res["skipped"][phase] = f"{left:.0f} s left of --budget, phase needs ~{budget:.0f} s"
            return None
        return time.perf_counter() + min(budget, left)

    engine = rollout = None
    timings = res["phase_s"] = {}
    try:
        if (deadline := admit("vllm")) is not None:
            t0 = time.perf_counter()
            engine, rollout = vllm_phase(args, model, shape, res, deadline)
            timings["vllm"] = time.perf_counter() - t0
        if rollout is not None and admit("mismatch") is not None:
            t0 = time.perf_counter()
            mismatch_phase(model, rollout, device, args.micro_batch, res)
            timings["mismatch"] = time.perf_counter() - t0
        elif rollout is None:
            res["skipped"].setdefault("mismatch", "no vLLM samples to re-score")
        backend = build_backend(args, model, device)
        deadline = admit("trainer")
        if deadline is not None:
            t0 = time.perf_counter()
            trainer_phase(args, backend, shape, device, peak, res, deadline)
            timings["trainer"] = time.perf_counter() - t0
        if engine is None:
            res["skipped"].setdefault("e2e", "needs the vLLM engine")
        elif (deadline := admit("e2e")) is not None:
            t0 = time.perf_counter()
            e2e_phase(args, backend, engine, shape, device, res, deadline)
            timings["e2e"] = time.perf_counter() - t0
    finally:
        if engine is not None:
            engine.close()
    res["total_s"] = time.perf_counter() - start
    return res


def table(res: dict[str, Any]) -> str:
    def f(key, fmt="{:,.0f}"):
        return fmt.format(res[key]) if key in res else "skipped"

    mm = res.get("mismatch", {})
    rows = [
        ("trainer tokens/s", f("trainer_tokens_per_s"), f"{PRIME_RL_TPS:,} (prime-rl, 1xH100)"),
        ("trainer MFU, real head size", f("mfu", "{:.1f}%"), ""),
        ("trainer MFU, prime-rl formula", f("mfu_primerl", "{:.1f}%"), f"{PRIME_RL_MFU}%"),
        ("vLLM generation tokens/s", f("vllm_gen_tokens_per_s"), ""),
        ("end-to-end tokens/s", f("e2e_tokens_per_s"), ""),
        ("mismatch mean abs Δ log-prob", f"{mm['mean_abs']:.4f}" if mm else "skipped", ""),
        ("mismatch max abs Δ log-prob", f"{mm['max_abs']:.4f}" if mm else "skipped", ""),
        (
            "token ratio min / max (std)",
            f"{mm['token_ratio_min']:.3f} / {mm['token_ratio_max']:.3f} "
            f"({mm['token_ratio_std']:.4f})"
            if mm
            else "skipped",
            "",
        ),
        (
            "sequence ratio min / max",
            f"{mm['seq_ratio_min']:.4f} / {mm['seq_ratio_max']:.4f}" if mm else "skipped",
            "",
        ),
    ]
    out = [
        f"device: {res['device']}; peak bf16 used for MFU: {res['peak_flops'] / 1e12:.0f} "
        f"TFLOP/s; model {res['params'] / 1e6:.2f} M parameters; total {res['total_s']:.0f} s",
        "| measure | gspo | reference |",
        "|---|---|---|",
    ]
    out += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    out += [f"skipped {k}: {v}" for k, v in res["skipped"].items()]
    return "\n".join(out)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tiny", action="store_true", help="CPU, a tiny shape: the test's path")
    p.add_argument("--budget", type=float, default=None, help="seconds for all phases [480]")
    p.add_argument("--prompts", type=int, default=None, help="prompts per generation [32]")
    p.add_argument("--group", type=int, default=None, help="samples per prompt [8]")
    p.add_argument("--prompt-tokens", type=int, default=None, help="prompt length [256]")
    p.add_argument("--new-tokens", type=int, default=None, help="tokens per sample [512]")
    p.add_argument("--repeats", type=int, default=3, help="timed generation calls at most")
    p.add_argument("--train-seqs", type=int, default=None, help="sequences per update [16]")
    p.add_argument("--train-len", type=int, default=None, help="tokens per sequence [1024]")
    p.add_argument("--train-steps", type=int, default=None, help="timed updates at most [10]")
    p.add_argument("--micro-batch", type=int, default=None, help="sequences per fwd/bwd [8]")
    p.add_argument("--e2e-steps", type=int, default=None, help="RL steps, first untimed [6]")
    p.add_argument("--vllm-memory", type=float, default=0.35, help="vLLM's share of GPU memory")
    p.add_argument("--out", type=Path, default=None, help=OUT_HELP)
    args = p.parse_args(argv)
    gpu = dict(
        budget=480,
        prompts=32,
        group=8,
        prompt_tokens=256,
        new_tokens=512,
        train_seqs=16,
        train_len=1024,
        train_steps=10,
        micro_batch=8,
        e2e_steps=6,
    )
    tiny = dict(
        budget=120,
        prompts=4,
        group=2,
        prompt_tokens=8,
        new_tokens=8,
        train_seqs=4,
        train_len=32,
        train_steps=2,
        micro_batch=2,
        e2e_steps=2,
    )
    for k, v in (tiny if args.tiny else gpu).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    res = run(args)
    print(table(res))
    out = args.out or dated_result("gpu_ready" + ("_tiny" if args.tiny else ""))
    out.parent.mkdir(parents=True, exist_ok=True)
    res["args"] = {k: str(v) if isinstance(v, Path) else v for k, v in res["args"].items()}
    out.write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
