"""The training pass's attention alone, forward and backward, in five formulations, alternating
in one process: is gspo's (SDPA ``is_causal``, the layout it takes from 768 completion tokens,
gspo.models.fast_forward.CAUSAL_MIN_TOKENS) the cheapest way to compute it on this CPU?

    python benchmarks/sdpa_training.py --lengths 512,1040 --reps 5 --threads 1

Formulations, on q, k, v [rows, heads, T, head size] (``growth.py``'s d64 shape: 8 rows, 4
heads of 16, the size of one of its minibatches):

- ``causal``: ``scaled_dot_product_attention(..., is_causal=True)``, gspo's;
- ``masked``: the same with a bool causal mask (what a padded batch's mask costs);
- ``math``: softmax(q k^T / sqrt(d) + mask) v in plain ops (the [T, T] scores materialized);
- ``chunk2`` / ``chunk4`` / ``chunk8``: the queries cut into 2 / 4 / 8 blocks, each attending
  only to the keys up to its last query (the first causal, the others masked), so less of the
  upper triangle is visited.

Prints the median ms of the forward and of the backward per formulation and its largest
difference from ``causal`` (float rounding), and writes JSON (a new dated file unless
``--out``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import OUT_HELP, dated_result

NAMES = ("causal", "masked", "math", "chunk2", "chunk4", "chunk8")


def formulations(q, k, v):
    """name -> a function computing the attention output [rows, heads, T, D] of q, k, v."""
    import torch
    import torch.nn.functional as F

    t = q.shape[2]
    mask = torch.ones(t, t, dtype=torch.bool).tril()  # [T, T] True: may attend

    def math():
        s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5  # [N, H, T, T]
        return s.masked_fill(~mask, float("-inf")).softmax(-1) @ v

    def chunks(c: int):
        def run():
            out, edges = [], [t * i // c for i in range(c + 1)]
            for a, b in itertools.pairwise(edges):
                kb, vb = k[:, :, :b], v[:, :, :b]
                if a == 0:
                    out.append(F.scaled_dot_product_attention(q[:, :, :b], kb, vb, is_causal=True))
                else:
                    m = mask[a:b, :b]  # [b - a, b]: bottom-right aligned causal
                    out.append(F.scaled_dot_product_attention(q[:, :, a:b], kb, vb, attn_mask=m))
            return torch.cat(out, dim=2)

        return run

    return {
        "causal": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "masked": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
        "math": math,
        "chunk2": chunks(2),
        "chunk4": chunks(4),
        "chunk8": chunks(8),
    }


def measure(length: int, rows: int, heads: int, dim: int, reps: int) -> dict[str, dict]:
    import torch

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(rows, heads, length, dim, generator=gen).requires_grad_() for _ in "qkv")
    grad_out = torch.randn(rows, heads, length, dim, generator=gen)
    fns = formulations(q, k, v)
    ref = fns["causal"]().detach()
    out = {}
    for name, fn in fns.items():  # an untimed round first: kernels' one-time set-up
        o = fn()
        torch.autograd.grad(o, (q, k, v), grad_out)
        out[name] = {"fwd": [], "bwd": [], "max_abs_diff": float((o.detach() - ref).abs().max())}
    for _ in range(reps):  # alternating: each rep runs every formulation once
        for name, fn in fns.items():
            t0 = time.perf_counter()
            o = fn()
            t1 = time.perf_counter()
            torch.autograd.grad(o, (q, k, v), grad_out)
            t2 = time.perf_counter()
            out[name]["fwd"].append(t1 - t0)
            out[name]["bwd"].append(t2 - t1)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--lengths", default="512,1040", help="sequence lengths T (prompt + completion)"
    )
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--reps", type=int, default=5, help="alternating rounds per length")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None, help=OUT_HELP)
    args = ap.parse_args(argv)
    try:
        lengths = [int(x) for x in args.lengths.split(",")]
    except ValueError:
        ap.error(f"--lengths {args.lengths!r}: comma-separated integers")

    import torch

    torch.set_num_threads(args.threads)
    results, lines = (
        {},
        ["| T | formulation | fwd ms | bwd ms | fwd+bwd / causal's | max abs diff |"],
    )
    lines.append("|---|---|---|---|---|---|")
    for length in lengths:
        r = measure(length, args.rows, args.heads, args.dim, args.reps)
        med = {n: {p: 1e3 * statistics.median(r[n][p]) for p in ("fwd", "bwd")} for n in r}
        base = med["causal"]["fwd"] + med["causal"]["bwd"]
        for n in NAMES:
            total = med[n]["fwd"] + med[n]["bwd"]
            lines.append(
                f"| {length} | {n} | {med[n]['fwd']:.1f} | {med[n]['bwd']:.1f} | "
                f"{total / base:.2f}x | {r[n]['max_abs_diff']:.1e} |"
            )
        results[str(length)] = {"median_ms": med, "runs": r}
    report = {
        "benchmark": "sdpa_training",
        "command": " ".join(["python benchmarks/sdpa_training.py", *(argv or sys.argv[1:])]),
        "settings": {k: v for k, v in vars(args).items() if k != "out"},
        "environment": {"torch": torch.__version__, "load_avg_at_end": os.getloadavg()},
        "results": results,
    }
    out = Path(args.out) if args.out else dated_result("sdpa_training")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print("\n".join(lines) + f"\n\nload {os.getloadavg()[0]:.1f}; wrote {out}")


if __name__ == "__main__":
    main()
