"""The training pass of two checkouts in one process, alternating: another checkout's
``gspo/models/fast_forward.py`` (loaded from its file) against this one's, forward + backward
of ``completion_logits`` plus the token log-probs on one d64 minibatch (32 rows = 4 prompts x
8 samples, one prompt left-padded, 6 completion tokens: d64-add's shape).

    git archive int37 | tar -x -C /tmp/gspo-int37
    python benchmarks/ab_forward.py --a /tmp/gspo-int37 --threads 1

Finer than ``ab_step.py`` (no subprocess, no rollout: only the pass whose code differs).
Checks that both give equal logits (``torch.equal``), prints the median ms of each and the
ratio A / B (above 1: this checkout is faster), writes JSON (a new dated file unless ``--out``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import OUT_HELP, dated_result


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", required=True, help="checkout A (the baseline), e.g. of int37")
    ap.add_argument("--reps", type=int, default=60, help="timed passes of each")
    ap.add_argument("--length", type=int, default=6, help="completion tokens")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None, help=OUT_HELP)
    args = ap.parse_args(argv)
    path_a = Path(args.a) / "src" / "gspo" / "models" / "fast_forward.py"
    if not path_a.is_file():
        ap.error(f"--a {args.a}: no src/gspo/models/fast_forward.py there")

    import torch
    import torch.nn.functional as F

    import gspo.models.fast_forward as mod_b
    from gspo.models.tiny_model import build_tiny_model

    spec = importlib.util.spec_from_file_location("fast_forward_a", path_a)
    mod_a = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod_a)
    torch.set_num_threads(args.threads)
    model = build_tiny_model(98, hidden_size=64, num_layers=2, seed=0).train()
    n, p, length = 32, 12, args.length
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, 98, (4, p), generator=g).repeat_interleave(8, 0)  # [N, P]
    prompt_mask = torch.ones(n, p, dtype=torch.long)
    prompt_mask[:8, :4] = 0  # the first prompt is left-padded
    completion = torch.randint(3, 98, (n, length), generator=g)  # [N, L]
    completion_mask = torch.ones(n, length, dtype=torch.long)
    index = torch.arange(4).repeat_interleave(8)  # [N]
    batch = (prompt, prompt_mask, completion, completion_mask, index)
    with torch.no_grad():
        equal = torch.equal(
            mod_a.completion_logits(model, *batch), mod_b.completion_logits(model, *batch)
        )

    def one(mod) -> float:
        t = time.perf_counter()
        logits = mod.completion_logits(model, *batch)  # [N, L, V]
        F.log_softmax(logits, -1).gather(-1, completion[..., None]).sum().backward()
        return time.perf_counter() - t

    one(mod_a), one(mod_b)  # warm-up
    times: dict[str, list[float]] = {"a": [], "b": []}
    for r in range(args.reps):
        for name, mod in (
            (("a", mod_a), ("b", mod_b)) if r % 2 == 0 else (("b", mod_b), ("a", mod_a))
        ):
            times[name].append(one(mod))
    a, b = statistics.median(times["a"]), statistics.median(times["b"])
    load = os.getloadavg()[0]
    print("| A ms | B (this) ms | A / B | equal logits | load |")
    print("|---|---|---|---|---|")
    print(f"| {a * 1e3:.2f} | {b * 1e3:.2f} | {a / b:.3f}x | {equal} | {load:.1f} |")
    out = Path(args.out) if args.out else dated_result("ab_forward")
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "benchmark": "ab_forward",
        "command": " ".join(sys.argv),
        "a": str(path_a),
        "equal_logits": equal,
        "a_ms": a * 1e3,
        "b_ms": b * 1e3,
        "ratio": a / b,
        "load": load,
        "times": times,
    }
    out.write_text(json.dumps(result, indent=1))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
