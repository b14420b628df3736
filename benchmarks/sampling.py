"""Cost of drawing one token per row: ``torch.multinomial`` against the rollout engine's
inverse-CDF sampler (``gspo.rollout.torch_decode.inverse_cdf_sample``), side by side.

    python benchmarks/sampling.py                       # 2 threads, SmolLM2's and Qwen's vocabularies
    python benchmarks/sampling.py --threads 1 --rows 16,64

Both draw from the same probabilities (a row's softmax of random logits with the spread of a
trained model's), with their own generator. ``torch.multinomial`` with one sample draws an
exponential for every vocabulary entry; the inverse CDF draws one float64 uniform per row and
runs a float64 cumulative sum plus a binary search. Neither includes the softmax, which the
engine computes once for both the sample and its log-prob.

Columns: ``multinomial ms`` and ``inverse CDF ms`` are medians over ``--reps`` calls; ``ratio``
is multinomial / inverse CDF. Prints a Markdown table, writes JSON.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch
from _results import OUT_HELP, dated_result

from gspo.rollout.torch_decode import inverse_cdf_sample

VOCABS = {"smollm2": 49152, "qwen3": 151936}


def _median_ms(fn, reps: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def measure(rows: int, vocab: int, reps: int) -> dict[str, float]:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(rows, vocab, generator=g) * 3.0  # [N, V]
    probs = torch.softmax(logits, dim=-1)  # [N, V]

    def multinomial() -> torch.Tensor:
        return torch.multinomial(probs, 1, generator=g).squeeze(-1)  # [N]

    def inverse_cdf() -> torch.Tensor:
        u = torch.rand(rows, dtype=torch.float64, generator=g)  # [N]
        return inverse_cdf_sample(probs, u)  # [N]

    a, b = _median_ms(multinomial, reps), _median_ms(inverse_cdf, reps)
    return {"rows": rows, "vocab": vocab, "multinomial_ms": a, "inverse_cdf_ms": b, "ratio": a / b}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--rows", default="16,32,128", help="rows per call (samples decoded at once)")
    ap.add_argument("--vocabs", default="smollm2,qwen3", help=f"of {', '.join(VOCABS)}")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None, help=OUT_HELP)
    args = ap.parse_args(argv)
    if args.out is None:  # never overwrite committed results
        args.out = str(dated_result("sampling"))
    torch.set_num_threads(args.threads)
    results = [
        {"vocab_name": name, **measure(int(r), VOCABS[name], args.reps)}
        for name in args.vocabs.split(",")
        for r in args.rows.split(",")
    ]
    print("| vocabulary | rows | multinomial ms | inverse CDF ms | ratio |")
    print("|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['vocab_name']} ({r['vocab']}) | {r['rows']} | {r['multinomial_ms']:.2f} | "
            f"{r['inverse_cdf_ms']:.2f} | {r['ratio']:.1f}x |"
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    env = {"torch": torch.__version__, "threads": args.threads, "machine": platform.processor()}
    out.write_text(json.dumps({"environment": env, "results": results}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
