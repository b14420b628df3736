"""Candidates for a faster training pass on the tiny models, each alternating against the
current pass in one process: forward + backward of the lean ``completion_logits`` plus the
token log-probs, on one minibatch of 32 rows (4 prompts x 8 samples).

    python benchmarks/update_candidates.py --candidates unfused --threads 1
    python benchmarks/update_candidates.py --candidates compile --threads 1   # minutes to compile
    python benchmarks/update_candidates.py --candidates bucketed --sizes d64 --threads 1

``unfused``: q/k/v and gate/up as separate matmuls (the training pass fuses them below
``FUSE_MAX_PARAMS``, as decoding does). ``compile``: ``torch.compile`` (inductor, needs a C++
compiler) of the whole pass at one fixed shape; its compile time (first call) is reported apart.
``bucketed``: the ``compile`` option's pass (gspo.models.compiled_forward: log-probs and
entropy, compiled with every dimension dynamic; the name is from when it padded shapes to
buckets); its compile time is that module's record.
Models: d64 (2 layers, 10 completion tokens) and d128 (4 layers, 24 tokens), random init.
Prints a table (median ms of each, ratio current / candidate: above 1 the candidate is faster)
and writes JSON (a new dated file unless ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import OUT_HELP, dated_result

CANDIDATES = ("unfused", "compile", "bucketed")
SIZES = {"d64": (64, 2, 10), "d128": (128, 4, 24)}  # hidden, layers, completion tokens


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--candidates", default="unfused", help=f"of {', '.join(CANDIDATES)}")
    ap.add_argument("--sizes", default="d64,d128", help=f"of {', '.join(SIZES)}")
    ap.add_argument("--reps", type=int, default=30, help="timed passes of each per size")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None, help=OUT_HELP)
    args = ap.parse_args(argv)
    cands = args.candidates.split(",")
    sizes = args.sizes.split(",")
    for c in cands:
        if c not in CANDIDATES:
            ap.error(f"--candidates: unknown {c!r} (of {', '.join(CANDIDATES)})")
    for s in sizes:
        if s not in SIZES:
            ap.error(f"--sizes: unknown {s!r} (of {', '.join(SIZES)})")

    import torch
    import torch.nn.functional as F

    import gspo.models.fast_forward as ff
    from gspo.models.tiny_model import build_tiny_model

    torch.set_num_threads(args.threads)
    rows = []
    for size in sizes:
        hidden, layers, length = SIZES[size]
        model = build_tiny_model(98, hidden_size=hidden, num_layers=layers, seed=0).train()
        n, p = 32, 12
        g = torch.Generator().manual_seed(0)
        prompt = torch.randint(3, 98, (4, p), generator=g).repeat_interleave(8, 0)  # [N, P]
        prompt_mask = torch.ones(n, p, dtype=torch.long)
        completion = torch.randint(3, 98, (n, length), generator=g)  # [N, L]
        completion_mask = torch.ones(n, length, dtype=torch.long)
        index = torch.arange(4).repeat_interleave(8)  # [N]

        def current(pid, pm, cid, cm, pi, model=model):
            logits = ff.completion_logits(model, pid, pm, cid, cm, pi)  # [N, L, V]
            return F.log_softmax(logits, -1).gather(-1, cid[..., None]).squeeze(-1)  # [N, L]

        for cand in cands:
            compile_s = None
            if cand == "unfused":
                stack_init = ff.LeanStack.__init__

                def other(*a, model=model, init=stack_init):
                    ff.LeanStack.__init__ = lambda self, m, max_len, fuse=None: init(
                        self, m, max_len, False
                    )
                    try:
                        return current(*a, model=model)
                    finally:
                        ff.LeanStack.__init__ = init

            elif cand == "bucketed":
                from gspo.models import compiled_forward as cf

                def other(pid, pm, cid, cm, pi, model=model):
                    return cf.token_logprobs(model, pid, pm, cid, cm, pi, temperature=1.0)[0]

            else:
                other = torch.compile(current, dynamic=False)
            batch = (prompt, prompt_mask, completion, completion_mask, index)

            def one(fn, batch=batch) -> float:
                t = time.perf_counter()
                fn(*batch).sum().backward()
                return time.perf_counter() - t

            first = one(other)
            compile_s = first if cand == "compile" else None
            if cand == "bucketed":
                compile_s = cf.RECORD.first_call_s
            one(current)
            times: dict[str, list[float]] = {"current": [], cand: []}
            for r in range(args.reps):
                order = ((current, "current"), (other, cand))
                for fn, name in order if r % 2 == 0 else order[::-1]:
                    times[name].append(one(fn))
            a, b = statistics.median(times["current"]), statistics.median(times[cand])
            rows.append(
                {
                    "size": size,
                    "candidate": cand,
                    "current_ms": a * 1e3,
                    "candidate_ms": b * 1e3,
                    "ratio": a / b,
                    "compile_s": compile_s,
                    "load": os.getloadavg()[0],
                    "times": times,
                }
            )
            print(f"{size} {cand}: {a / b:.2f}x", file=sys.stderr, flush=True)
    print(
        "| size | candidate | current ms | candidate ms | current / candidate | compile s | load |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        comp = "-" if r["compile_s"] is None else f"{r['compile_s']:.1f}"
        print(
            f"| {r['size']} | {r['candidate']} | {r['current_ms']:.2f} | {r['candidate_ms']:.2f} "
            f"| {r['ratio']:.2f}x | {comp} | {r['load']:.1f} |"
        )
    out = Path(args.out) if args.out else dated_result("update_candidates")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {"benchmark": "update_candidates", "command": " ".join(sys.argv), "results": rows},
            indent=1,
        )
    )
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
