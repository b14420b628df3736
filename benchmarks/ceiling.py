"""How close a gspo RL step runs to this machine's own limit: the FLOP rate of a large float32
matmul against the FLOP rate our rollout and our training pass achieve.

    python benchmarks/ceiling.py                        # d64L2, d128L4, d256L4, 1 thread
    python benchmarks/ceiling.py --sizes d256L4 --threads 2 --smollm2

FLOPs are counted the usual way: about 2 x params per token for a forward and 6 x params per
token for forward + backward (attention's own FLOPs, small at these lengths, are left out).
Tokens are counted per row (prompt + completion of every sample), i.e. what a plain
implementation computes; gspo runs each group's prompt once (rollout prefill and training), so
it executes fewer FLOPs than it is credited with, and the ratio can exceed what the arithmetic
alone would allow. Both figures are printed: ``effective`` (per-row tokens) and ``executed``
(distinct prompts counted once).

Measured pieces (each the median of ``--reps`` timings after a warm-up):

- ``matmul``: n x n x n float32 ``torch.mm`` for n = 2048, 1024, 512 (2048 again at the end);
  the best of these rates is the ceiling the ratios use;
- ``rollout``: ``TorchEngine.generate`` of 16 prompts x 8 samples, fixed-length completions
  (no EOS: a random-init model), as in a training step;
- ``train``: one minibatch of 32 rows: ``token_logprobs`` with shared prompts, backward and a
  fused AdamW step, as ``update_policy`` runs it 4 times per step.

Writes a new dated benchmarks/results/ceiling-YYYYMMDD-HHMMSS.json (or --out) and prints a
Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
from _results import OUT_HELP, dated_result

from gspo.rollout.base import GenerationRequest

PROMPT_LEN, NEW_TOKENS, PROMPTS, GROUP, MINIBATCH = 13, 16, 16, 8, 32


def _median_time(fn, reps: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def matmul_rate(n: int, reps: int) -> float:
    """FLOP/s of an n x n x n float32 matmul (2 n^3 FLOPs)."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    return 2 * n**3 / _median_time(lambda: torch.mm(a, b), reps)


def _model(size: str):
    from gspo.models.char_tokenizer import build_char_tokenizer
    from gspo.models.tiny_model import build_tiny_model

    if size == "smollm2":
        from gspo.models.model_io import load_model, load_tokenizer
        from gspo.models.pretrained import resolve_model_path

        path = resolve_model_path("smollm2-135m-instruct")
        tok = load_tokenizer(path)
        return load_model(path), tok
    hidden, layers = (int(x) for x in size[1:].split("L"))
    tok = build_char_tokenizer()
    return build_tiny_model(len(tok), hidden_size=hidden, num_layers=layers), tok


def measure(size: str, reps: int, prompts: int, group: int, new_tokens: int) -> dict[str, Any]:
    """Rollout and training FLOP rates of one model size."""
    from gspo.models.logprobs import token_logprobs
    from gspo.rollout import SamplingParams
    from gspo.rollout.torch_engine import TorchEngine

    model, tok = _model(size)
    params = sum(p.numel() for p in model.parameters())
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    prompt_rows = [
        torch.randint(3, vocab, (PROMPT_LEN,), generator=g).tolist() for _ in range(prompts)
    ]
    eos = tok.eos_token_id
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos
    # A stop id the model never samples (out of the vocabulary): fixed-length completions.
    engine = TorchEngine(model, pad_id=pad, eos_id=vocab + 10)
    sampling = SamplingParams(max_new_tokens=new_tokens, temperature=1.0)
    model.eval()
    rollout_s = _median_time(
        lambda: engine.generate(
            GenerationRequest(prompt_rows, group, sampling, torch.Generator().manual_seed(1))
        ),
        reps,
    )
    rollout = engine.generate(
        GenerationRequest(prompt_rows, group, sampling, torch.Generator().manual_seed(1))
    )
    n = prompts * group
    row_tokens = PROMPT_LEN + new_tokens - 1  # tokens fed per row (the last is never fed)
    gen_eff = 2 * params * n * row_tokens
    gen_exec = 2 * params * (prompts * PROMPT_LEN + n * (new_tokens - 1))

    # One training minibatch: 32 rows drawn like update_policy's shuffled split.
    rows = torch.randperm(n, generator=g)[:MINIBATCH]
    part = {
        k: getattr(rollout, k)[rows]
        for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "logprobs")
    }
    index = rollout.prompt_index[rows]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=True)
    model.train()

    def train_step() -> None:
        lp, _ = token_logprobs(
            model,
            part["prompt_ids"],
            part["prompt_mask"],
            part["completion_ids"],
            part["completion_mask"],
            with_entropy=True,
            prompt_index=index,
        )
        (-(lp - part["logprobs"]).exp().mean()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    train_s = _median_time(train_step, reps)
    t_rows = MINIBATCH * (PROMPT_LEN + new_tokens)
    distinct = int(index.unique().numel())
    train_eff = 6 * params * t_rows
    train_exec = 6 * params * (distinct * PROMPT_LEN + MINIBATCH * new_tokens)
    return {
        "size": size,
        "params": params,
        "rollout_s": rollout_s,
        "rollout_flops_per_s": gen_eff / rollout_s,
        "rollout_flops_per_s_executed": gen_exec / rollout_s,
        "rollout_gen_tokens_per_s": n * new_tokens / rollout_s,
        "train_minibatch_s": train_s,
        "train_flops_per_s": train_eff / train_s,
        "train_flops_per_s_executed": train_exec / train_s,
        "train_tokens_per_s": t_rows / train_s,
        "distinct_prompts_in_minibatch": distinct,
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--sizes", default="d64L2,d128L4,d256L4", help="comma list (dHLn)")
    ap.add_argument("--smollm2", action="store_true", help="also SmolLM2-135M (4 x 4, 8 tok)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=None, help=OUT_HELP)
    args = ap.parse_args(argv)
    if args.out is None:  # never overwrite committed results
        args.out = str(dated_result("ceiling"))
    torch.set_num_threads(args.threads)

    peak = {n: matmul_rate(n, args.reps) for n in (2048, 1024, 512)}
    rows = [measure(s, args.reps, PROMPTS, GROUP, NEW_TOKENS) for s in args.sizes.split(",") if s]
    if args.smollm2:
        rows.append(measure("smollm2", max(2, args.reps // 2), 4, 4, 8))
    peak_again = matmul_rate(2048, args.reps)  # the load may have changed meanwhile
    # The ceiling is the best rate any of these matmuls reached (on a shared machine the big
    # one is often held back by memory bandwidth more than the small ones).
    ceiling = max(*peak.values(), peak_again)
    for r in rows:
        r["rollout_vs_matmul"] = r["rollout_flops_per_s"] / ceiling
        r["train_vs_matmul"] = r["train_flops_per_s"] / ceiling
        r["rollout_vs_matmul_executed"] = r["rollout_flops_per_s_executed"] / ceiling
        r["train_vs_matmul_executed"] = r["train_flops_per_s_executed"] / ceiling

    head = "| model | params | rollout GFLOP/s (exec.) | of matmul | train GFLOP/s (exec.) | of matmul |"
    lines = [head, "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['size']} | {r['params'] / 1e6:.2f}M "
            f"| {r['rollout_flops_per_s'] / 1e9:.1f} ({r['rollout_flops_per_s_executed'] / 1e9:.1f}) "
            f"| {r['rollout_vs_matmul']:.0%} ({r['rollout_vs_matmul_executed']:.0%}) "
            f"| {r['train_flops_per_s'] / 1e9:.1f} ({r['train_flops_per_s_executed'] / 1e9:.1f}) "
            f"| {r['train_vs_matmul']:.0%} ({r['train_vs_matmul_executed']:.0%}) |"
        )
    report = {
        "benchmark": "ceiling",
        "command": " ".join(["python benchmarks/ceiling.py", *(argv or sys.argv[1:])]),
        "threads": args.threads,
        "matmul_flops_per_s": {
            "2048": peak[2048],
            "1024": peak[1024],
            "512": peak[512],
            "2048_after": peak_again,
            "ceiling": ceiling,
        },
        "environment": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cpu_count": os.cpu_count(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "load_avg_at_end": os.getloadavg(),
        },
        "settings": {
            "prompt_len": PROMPT_LEN,
            "new_tokens": NEW_TOKENS,
            "prompts": PROMPTS,
            "group": GROUP,
            "minibatch": MINIBATCH,
            "reps": args.reps,
        },
        "results": rows,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(
        f"matmul float32, {args.threads} thread(s): 2048^3 {peak[2048] / 1e9:.1f} GFLOP/s "
        f"(again at the end: {peak_again / 1e9:.1f}), 1024^3 {peak[1024] / 1e9:.1f}, "
        f"512^3 {peak[512] / 1e9:.1f}; ceiling used: {ceiling / 1e9:.1f} GFLOP/s"
    )
    print("\n".join(lines))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
