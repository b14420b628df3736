"""Where one RL step's time goes: gspo's step on a ``vs_trl.py`` workload, broken down by phase.

    python benchmarks/profile_step.py --workloads d64-add,d128-rev --steps 11 --threads 1
    python benchmarks/profile_step.py --workloads d64-add --torch-profile   # op table too
    python benchmarks/profile_step.py --workloads d128-rev --compile        # the compiled update

Each phase is timed by wrapping the function that does it (``time.perf_counter`` around the
call; a few microseconds per step in all), on the same run ``vs_trl.py`` times (its ``gspo``
system: same SFT cold start, settings and step boundaries). Phases, per step (median over the
steps after the first, which is a warm-up):

- generation: ``prefill`` (``TorchEngine._start``: the shared-prompt prefill and the decoder's
  set-up), ``decode`` (one forward per generated token), ``sampling`` (``sample_next``),
  ``record`` (writing tokens, log-probs and stop flags), ``gen other`` (the rest of
  ``TorchEngine.generate``: the Python loop, left-padding, the output copies);
- ``scoring``: the rest of the rollout phase (episodes, decoding to text, rewards, advantages
  of the step's metrics);
- ``old log-probs``: the old-log-prob step (no pass by default: the engine's own);
- update: ``fwd`` (``ForwardInputs._scores``: the forwards with grad, compiled or not, and the
  no-grad metric forwards), ``loss``
  (``policy_loss``), ``bwd`` (``Tensor.backward``), ``clip`` (the grad-norm clip), ``optim``
  (``AdamW.step`` + schedule), ``update other`` (minibatch slicing, metric accumulation);
- ``overhead``: the step's wall time less all of the above (advantages, weight sync, the
  metrics record and the logger, the loop).

``--torch-profile`` also runs ``torch.profiler`` over two steps and prints the ops by self CPU
time and the count of ops per generated token. Results go to a new JSON file (``--out``).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import OUT_HELP, dated_result

PHASES = (
    "prefill",
    "decode",
    "sampling",
    "record",
    "gen other",
    "scoring",
    "old log-probs",
    "fwd",
    "loss",
    "bwd",
    "clip",
    "optim",
    "update other",
    "overhead",
)


def _timed(acc: dict[str, float], key: str, fn):
    import torch

    @functools.wraps(fn)
    def wrapper(*a, **kw):
        t0 = time.perf_counter()
        try:
            with torch.profiler.record_function(f"phase:{key}"):
                return fn(*a, **kw)
        finally:
            acc[key] += time.perf_counter() - t0

    return wrapper


def profile(spec: dict[str, Any]) -> dict[str, Any]:
    """One gspo run of ``spec`` (a vs_trl spec) with every phase timed; per-step medians."""
    import torch

    torch.set_num_threads(spec["threads"])
    import vs_trl

    import gspo.backend.update as upd
    import gspo.compose.train as trainer_mod
    import gspo.models.forward_inputs as fi
    import gspo.orchestration.steps as steps_mod
    import gspo.rollout.torch_engine as te

    acc: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    start = te.TorchEngine._start

    def timed_start(self, *a, **kw):
        t0 = time.perf_counter()
        with torch.profiler.record_function("phase:prefill"):
            logits, advance = start(self, *a, **kw)
        acc["prefill"] += time.perf_counter() - t0

        def timed_advance(*x):
            counts["decode_calls"] += 1
            t1 = time.perf_counter()
            try:
                with torch.profiler.record_function("phase:decode"):
                    return advance(*x)
            finally:
                acc["decode"] += time.perf_counter() - t1

        return logits, timed_advance

    te.TorchEngine._start = timed_start
    te.sample_next = _timed(acc, "sampling", te.sample_next)
    te.TorchEngine._record = _timed(acc, "record", te.TorchEngine._record)
    te.TorchEngine.generate = _timed(acc, "generate", te.TorchEngine.generate)
    steps_mod.collect = _timed(acc, "rollout", steps_mod.collect)
    steps_mod.old_logprobs = _timed(acc, "old log-probs", steps_mod.old_logprobs)
    steps_mod.update = _timed(acc, "update", steps_mod.update)
    # The update's forwards (gradient and no-grad metric ones, compiled or eager) all go
    # through ForwardInputs._scores.
    fi.ForwardInputs._scores = _timed(acc, "fwd", fi.ForwardInputs._scores)
    upd.policy_loss = _timed(acc, "loss", upd.policy_loss)
    torch.Tensor.backward = _timed(acc, "bwd", torch.Tensor.backward)
    torch.nn.utils.clip_grad_norm_ = _timed(acc, "clip", torch.nn.utils.clip_grad_norm_)
    torch.optim.AdamW.step = _timed(acc, "optim", torch.optim.AdamW.step)

    per_step: list[dict[str, float]] = []
    stamp = [0.0]
    base = trainer_mod.MetricsLogger
    prof_ctx: list[Any] = []
    want_prof = spec.get("torch_profile", False)

    class TimedLogger(base):  # type: ignore[misc, valid-type]
        def log(self, step: int, metrics: dict[str, Any]) -> None:
            now = time.perf_counter()
            if "time/train_s" in metrics:
                row = dict(acc)
                row["wall"] = now - stamp[0]
                row["decode_calls"] = counts["decode_calls"]
                row["gen_tokens"] = metrics["response_length/mean"] * spec["rows"]
                per_step.append(row)
                acc.clear()
                counts.clear()
                stamp[0] = now
                if want_prof and len(per_step) == 2:
                    p = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
                    p.__enter__()
                    prof_ctx.append(p)
                if want_prof and len(per_step) == 4:
                    prof_ctx[0].__exit__(None, None, None)
            elif "data/train_problems" in metrics:
                acc.clear()
                counts.clear()
                stamp[0] = now
            super().log(step, metrics)

    trainer_mod.MetricsLogger = TimedLogger
    with tempfile.TemporaryDirectory(prefix="profile-step-") as tmp:
        cfg = vs_trl._train_config(spec, tmp, compile=spec.get("compile", False))
        trainer_mod.train(cfg)
    rows = per_step[1:] or per_step
    out: dict[str, Any] = {"steps_timed": len(rows)}
    for r in rows:
        r["gen other"] = r.get("generate", 0) - sum(
            r.get(k, 0) for k in ("prefill", "decode", "sampling", "record")
        )
        r["scoring"] = r.get("rollout", 0) - r.get("generate", 0)
        r["update other"] = r.get("update", 0) - sum(
            r.get(k, 0) for k in ("fwd", "loss", "bwd", "clip", "optim")
        )
        r["overhead"] = r["wall"] - sum(r.get(k, 0) for k in ("rollout", "old log-probs", "update"))
    for key in (*PHASES, "wall", "generate", "update", "decode_calls", "gen_tokens"):
        out[key] = statistics.median(r.get(key, 0.0) for r in rows)
    if prof_ctx:
        ka = prof_ctx[0].key_averages()
        ops = sorted(ka, key=lambda e: e.self_cpu_time_total, reverse=True)
        out["torch_profile_top"] = [
            {
                "op": e.key,
                "count": e.count,
                "self_cpu_ms": e.self_cpu_time_total / 1e3,
            }
            for e in ops[:25]
        ]
        out["torch_profile_ops"] = sum(e.count for e in ka if e.key.startswith("aten::"))
        out["torch_profile_ops_by_phase"] = ops_by_phase(prof_ctx[0])
        out["torch_profile_decode_calls"] = sum(r["decode_calls"] for r in per_step[2:4])
    return out


def ops_by_phase(prof) -> dict[str, int]:
    """Count of top-level aten ops (not those an op calls itself) under each innermost phase
    label; autograd's backward ops count under "bwd" (they run on the engine's thread)."""
    counts: dict[str, int] = defaultdict(int)
    for e in prof.events():
        if not e.name.startswith("aten::"):
            continue
        parent, label, nested = e.cpu_parent, None, False
        while parent is not None:
            if parent.name.startswith("aten::"):
                nested = True
                break
            if label is None and parent.name.startswith("phase:"):
                label = parent.name.removeprefix("phase:")
            parent = parent.cpu_parent
        if nested:
            continue
        counts[label or "other"] += 1
    return dict(counts)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--workloads", default="d64-add,d128-rev")
    ap.add_argument("--steps", type=int, default=11, help="RL steps (the first is a warm-up)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--torch-profile", action="store_true", help="also torch.profiler's op table")
    ap.add_argument(
        "--compile",
        action="store_true",
        help="gspo with compile=True (the first step, a warm-up, carries the compile)",
    )
    ap.add_argument("--cache", default=None, help="folder for the SFT cold starts (vs_trl's)")
    ap.add_argument("--out", default=None, help=OUT_HELP)
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(profile(json.loads(args.one))))
        return
    import subprocess

    import vs_trl

    cache = Path(args.cache) if args.cache else Path(tempfile.mkdtemp(prefix="vs-trl-cache-"))
    cache.mkdir(parents=True, exist_ok=True)
    results = {}
    for workload in [w for w in args.workloads.split(",") if w]:
        init, _ = vs_trl.prepare_init(workload, args.threads, cache)
        w = vs_trl.WORKLOADS[workload]
        spec = {
            "workload": workload,
            "init": init,
            "steps": args.steps,
            "threads": args.threads,
            "n_test": 1,
            "seed": vs_trl.SEED,
            "rows": w["prompts_per_step"] * w["group_size"],
            "torch_profile": args.torch_profile,
            "compile": args.compile,
        }
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
        cmd = [sys.executable, str(Path(__file__).resolve()), "--one", json.dumps(spec)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr[-6000:])
            raise SystemExit(f"profiling {workload} failed")
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        r["load_avg_1min"] = os.getloadavg()[0]
        results[workload] = r
    print(table(results))
    for workload, r in results.items():
        if "torch_profile_top" in r:
            per_tok = r["torch_profile_ops"] / max(r["torch_profile_decode_calls"], 1)
            print(
                f"\n{workload}: torch.profiler over 2 steps, {r['torch_profile_ops']} aten ops "
                f"({per_tok:.0f} per decode call, whole step included)"
            )
            print(f"  top-level aten ops per phase (2 steps): {r['torch_profile_ops_by_phase']}")
            for e in r["torch_profile_top"]:
                print(f"  {e['op']:<40} {e['count']:>7} {e['self_cpu_ms']:>9.1f} ms")
    path = Path(args.out) if args.out else dated_result("profile_step")
    path.parent.mkdir(parents=True, exist_ok=True)
    # No machine path in a results file: the cache folder (a temp dir or --cache) as <cache>.
    command = " ".join(["python", *sys.argv]).replace(str(cache), "<cache>")
    path.write_text(json.dumps({"command": command, "results": results}, indent=1))
    print(f"\nwrote {path}")


def table(results: dict[str, dict[str, Any]]) -> str:
    """Phase | ms per step (share) for every workload."""
    names = list(results)
    lines = [
        "| phase | " + " | ".join(f"{w} ms/step (share)" for w in names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for key in (*PHASES, "wall"):
        cells = []
        for w in names:
            r = results[w]
            cells.append(f"{1e3 * r[key]:.1f} ({100 * r[key] / r['wall']:.0f}%)")
        lines.append(f"| {key} | " + " | ".join(cells) + " |")
    cells = [
        f"{results[w]['decode_calls']:.0f} calls, {1e3 * results[w]['decode'] / max(results[w]['decode_calls'], 1):.2f} ms each"
        for w in names
    ]
    lines.append("| decode forwards | " + " | ".join(cells) + " |")
    cells = [f"{results[w]['load_avg_1min']:.1f}" for w in names]
    lines.append("| load (1 min) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
