"""The mechanism behind GSPO's stability claim ([GSPO] §5.2), measured: importance-ratio noise
from an engine/trainer precision mismatch, as it grows with response length.

    python experiments/ratio_noise.py                       # ~1 min on 2 cores
    python experiments/ratio_noise.py --lengths 16,64,256,1024 --samples 64 --engine bfloat16

The trainer is a float32 tiny Qwen3 (``--hidden-size`` d, ``--layers``; random init, positions
up to the longest length); the engine is the same weights in ``--engine`` precision (bfloat16 or
float16), as a bf16 inference engine beside a float32 trainer is. Completions are sampled by the
engine (temperature 1) to each length, then scored by both: r_t = log pi_trainer(y_t) -
log pi_engine(y_t). On-policy (before any update) every ratio would be exactly 1 without the
mismatch, so everything below is noise the objective sees:

- GRPO's token ratios w_t = exp(r_t): their standard deviation, and the share of tokens outside
  GRPO's clip range [1 - 0.2, 1 + 0.28] (clipped for no reason);
- the sequence-likelihood ratio exp(sum_t r_t) (what a sequence-level objective without length
  normalization would use): its log's standard deviation grows like sqrt(L);
- GSPO's length-normalized ratio s = exp(mean_t r_t): its log's standard deviation shrinks like
  1 / sqrt(L), and the share of sequences outside GSPO's clip range [1 - 3e-4, 1 + 4e-4].

Prints a table per length and writes JSON (and a PNG) to experiments/results/.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"
GRPO_CLIP = (0.2, 0.28)
GSPO_CLIP = (3e-4, 4e-4)


def measure(args) -> list[dict]:
    from gspo.models.char_tokenizer import build_char_tokenizer
    from gspo.models.logprobs import token_logprobs
    from gspo.models.tiny_model import build_tiny_model
    from gspo.rollout import GenerationRequest, SamplingParams
    from gspo.rollout.torch_engine import TorchEngine

    torch.manual_seed(args.seed)
    tokenizer = build_char_tokenizer()
    lengths = [int(x) for x in args.lengths.split(",")]
    trainer = build_tiny_model(
        len(tokenizer),
        hidden_size=args.hidden_size,
        num_layers=args.layers,
        num_heads=4,
        num_kv_heads=2,
        max_position_embeddings=max(lengths) + 16,
        seed=args.seed,
    ).eval()
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}[args.engine]
    # The engine: the trainer's very weights, cast to the low precision.
    engine_model = copy.deepcopy(trainer).to(dtype)
    engine_model.eval()
    # No stop token (eos_id -1 never matches): every completion runs to its full length.
    engine = TorchEngine(engine_model, pad_id=tokenizer.pad_token_id, eos_id=-1)
    prompt = tokenizer("12+34=")["input_ids"]
    rows = []
    for length in lengths:
        t0 = time.perf_counter()
        params = SamplingParams(max_new_tokens=length, temperature=1.0, top_p=1.0)
        gen = torch.Generator().manual_seed(args.seed + length)
        out = engine.generate(GenerationRequest([prompt], args.samples, params, generator=gen))
        mask = out.completion_mask.clone()  # [N, L]
        # Keep sequences at their full length: a stop token ends one early; score only the rest.
        with torch.no_grad():
            lp_train, _ = token_logprobs(
                trainer, out.prompt_ids, out.prompt_mask, out.completion_ids, mask
            )  # [N, L] float32
            lp_engine, _ = token_logprobs(
                engine_model, out.prompt_ids, out.prompt_mask, out.completion_ids, mask
            )  # [N, L] float32 of the low-precision logits
        r = (lp_train - lp_engine.float()) * mask  # [N, L]
        n_tok = mask.sum(dim=1).clamp(min=1)  # [N]
        tokens = r[mask.bool()]
        w = tokens.exp()
        seq_sum = r.sum(dim=1)  # [N] log sequence-likelihood ratio
        seq_mean = seq_sum / n_tok  # [N] log of GSPO's s_i
        s = seq_mean.exp()
        rows.append(
            {
                "length": length,
                "mean_tokens": float(n_tok.float().mean()),
                "token_log_ratio_std": float(tokens.std()),
                "token_ratio_std": float(w.std()),
                "grpo_tokens_outside_clip": float(
                    ((w < 1 - GRPO_CLIP[0]) | (w > 1 + GRPO_CLIP[1])).float().mean()
                ),
                "seq_log_likelihood_ratio_std": float(seq_sum.std()),
                "gspo_log_ratio_std": float(seq_mean.std()),
                "gspo_seqs_outside_clip": float(
                    ((s < 1 - GSPO_CLIP[0]) | (s > 1 + GSPO_CLIP[1])).float().mean()
                ),
                "seconds": time.perf_counter() - t0,
            }
        )
        print(
            f"L={length:5d}: token log-ratio std {rows[-1]['token_log_ratio_std']:.2e}, "
            f"GRPO tokens outside clip {rows[-1]['grpo_tokens_outside_clip']:.4f}, "
            f"sum log-ratio std {rows[-1]['seq_log_likelihood_ratio_std']:.3e}, "
            f"GSPO log s std {rows[-1]['gspo_log_ratio_std']:.2e}, "
            f"GSPO seqs outside clip {rows[-1]['gspo_seqs_outside_clip']:.3f}",
            flush=True,
        )
    return rows


def slope(rows: list[dict], key: str) -> float:
    """Least-squares exponent k of key ~ length^k (log-log)."""
    xs = [math.log(r["mean_tokens"]) for r in rows]
    ys = [math.log(r[key]) for r in rows]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="16,64,256,1024")
    ap.add_argument("--samples", type=int, default=64, help="completions per length")
    ap.add_argument("--engine", default="bfloat16", choices=("bfloat16", "float16"))
    ap.add_argument("--hidden-size", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None, help="JSON path [experiments/results/...]")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = measure(args)
    exponents = {
        k: slope(rows, k)
        for k in ("token_log_ratio_std", "seq_log_likelihood_ratio_std", "gspo_log_ratio_std")
    }
    print("exponents of std vs length: " + ", ".join(f"{k} {v:+.2f}" for k, v in exponents.items()))
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    out = Path(args.out) if args.out else RESULTS / f"ratio_noise-{args.engine}-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "experiment": "ratio_noise",
        "command": " ".join(["python experiments/ratio_noise.py", *(argv or sys.argv[1:])]),
        "settings": vars(args) | {"grpo_clip": GRPO_CLIP, "gspo_clip": GSPO_CLIP},
        "rows": rows,
        "exponents": exponents,
    }
    out.write_text(json.dumps(report, indent=2) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(5.5, 3.8))
        x = [r["mean_tokens"] for r in rows]
        for key, label in (
            ("token_log_ratio_std", "token log-ratio (GRPO's w_t)"),
            ("seq_log_likelihood_ratio_std", "sum of log-ratios (sequence likelihood)"),
            ("gspo_log_ratio_std", "mean of log-ratios (GSPO's s_i)"),
        ):
            ax.loglog(x, [r[key] for r in rows], "o-", label=label)
        ax.axhline(math.log1p(GSPO_CLIP[0]), ls=":", c="gray", label="GSPO clip (3e-4)")
        ax.set_xlabel("response length (tokens)")
        ax.set_ylabel(f"std of log-ratio, {args.engine} engine vs float32")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out.with_suffix(".png"), dpi=120)
    except ImportError:
        pass
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
