"""GPU readiness in one call: a Qwen3-0.6B-shaped random-init model through gspo's trainer and
vLLM engine, with every phase time-boxed so the whole call stays under ten minutes.

    python benchmarks/gpu_ready.py                 # one H100 / H200 (480 s budget; not run yet)
    python benchmarks/gpu_ready.py --tiny          # CPU, a tiny shape (the test's path)

Phases, in order (each gets a budget; a phase whose budget no longer fits in what is left of
``--budget`` is skipped with a line saying so, and a phase stops its timed loop at its budget):

1. ``vllm``: gspo's :class:`~gspo.rollout.vllm_engine.VLLMEngine` in bfloat16 samples
   ``--prompts`` x ``--group`` completions of ``--new-tokens`` tokens from random prompts of
   ``--prompt-tokens`` tokens; generated tokens/s (after one warm-up call) and start-up seconds.
2. ``mismatch``: the trainer (bfloat16 policy, same weights) re-scores those samples with
   :func:`gspo.models.logprobs.token_logprobs`; mean/max |Δ log-prob| and the spread of the
   per-token importance ratio exp(Δ) and of GSPO's sequence ratio exp(mean Δ).
3. ``trainer``: gspo's update (:class:`~gspo.backend.local.LocalBackend`, GSPO loss, AdamW) on
   synthetic batches of ``--train-seqs`` sequences of ``--train-len`` tokens, with the policy's
   own old log-probs (a recompute pass before each update, not timed: the ratios start at 1, so
   the loss and clip fractions are a run's); tokens/s as prime-rl's ``PerfCounter`` counts it
   (every processed token, prompt included, over the wall time of the updates after the first)
   and MFU (formula below).
4. ``e2e``: whole RL steps: generate with vLLM, update, sync the weights into vLLM; tokens
   (prompt + completion, every sample) per second of step wall time.
5. ``compiled``: the ``trainer`` phase again with gspo's ``compile`` option (``--compile true``:
   the training forward + backward and the loss under ``torch.compile``, a graph each: every
   dimension is dynamic), on a backend of its own. The compile is the first step's: its seconds (``compile
   s``, and whether inductor's cache was cold) apart from the warm per-step time, the speed-up
   over the eager ``trainer`` phase and the step at which the compile has paid for itself
   (compile seconds / per-step saving). Last, so a slow cold compile costs no other figure;
   ``--phases trainer,compiled`` measures it alone.

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
import contextlib
import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _gpu_phases import (
    build_backend,
    build_model,
    compiled_phase,
    e2e_phase,
    mismatch_phase,
    peak_flops,
    trainer_phase,
    vllm_phase,
)
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
PHASES = {"vllm": 150, "mismatch": 30, "trainer": 150, "e2e": 180, "compiled": 180}
# A phase still running at 1.5 x its (unscaled) budget + this margin, or this long past the end
# of --budget, is interrupted (SIGALRM) and becomes a "failed" line: a hung start-up or a step
# far slower than planned cannot eat the call's wall-clock limit and lose the table.
HARD_MARGIN_S = 30.0


class PhaseTimeout(Exception):
    """A phase ran past its hard time box."""


@contextlib.contextmanager
def hard_limit(seconds: float):
    """Raise :class:`PhaseTimeout` in the main thread after ``seconds`` (POSIX, main thread
    only; elsewhere no limit). The earlier SIGALRM handler is restored on the way out."""
    usable = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    if not usable:
        yield
        return

    def fire(signum, frame):
        raise PhaseTimeout(f"over its hard time box of {seconds:.0f} s")

    before = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.1))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)


def run(args) -> dict[str, Any]:
    import torch

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    end = start + args.budget
    device = torch.device("cpu" if args.tiny else "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_ready.py: no CUDA device visible to torch (--tiny runs on CPU)", file=sys.stderr)
        raise SystemExit(2)
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

    if not peak:
        res["skipped"]["mfu"] = f"no bf16 peak FLOP/s known for device {name!r}"

    def admit(phase: str) -> float | None:
        """The phase's deadline, or None (skipped, with the reason) when it cannot fit."""
        if phase not in args.phases:
            res["skipped"][phase] = "not in --phases"
            return None
        budget = PHASES[phase] * scale
        left = end - time.perf_counter()
        if left < budget * 0.5:
            res["skipped"][phase] = f"{left:.0f} s left of --budget, phase needs ~{budget:.0f} s"
            return None
        return time.perf_counter() + min(budget, left)

    timings = res["phase_s"] = {}

    def guarded(phase: str, fn, *a):
        """``fn(*a)`` timed; a failure becomes a line in ``skipped`` (the traceback on stderr)
        so the other phases still run and the table and JSON are still written."""
        t0 = time.perf_counter()
        hard = min(PHASES[phase] * 1.5, end - t0) + HARD_MARGIN_S
        try:
            with hard_limit(hard):
                return fn(*a)
        except Exception as exc:  # one phase's failure must not lose the others' figures
            traceback.print_exc()
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            res["skipped"][phase] = f"failed: {type(exc).__name__}: {first[:200]}"
            return None
        finally:
            timings[phase] = time.perf_counter() - t0

    engine = rollout = None
    try:
        if (deadline := admit("vllm")) is not None:
            engine, rollout = guarded("vllm", vllm_phase, args, model, shape, res, deadline) or (
                None,
                None,
            )
        if rollout is None:
            res["skipped"].setdefault("mismatch", "no vLLM samples to re-score")
        elif admit("mismatch") is not None:
            guarded("mismatch", mismatch_phase, model, rollout, device, args.micro_batch, res)
        backend = build_backend(args, model, device)
        if (deadline := admit("trainer")) is not None:
            guarded("trainer", trainer_phase, args, backend, shape, device, peak, res, deadline)
        if engine is None:
            res["skipped"].setdefault("e2e", "needs the vLLM engine")
        elif (deadline := admit("e2e")) is not None:
            guarded("e2e", e2e_phase, args, backend, engine, shape, device, res, deadline)
        if (deadline := admit("compiled")) is not None:
            guarded("compiled", compiled_phase, args, model, shape, device, peak, res, deadline)
    finally:
        if engine is not None:
            engine.close()
    res["total_s"] = time.perf_counter() - start
    return res


def table(res: dict[str, Any]) -> str:
    def f(key, fmt="{:,.0f}"):
        return fmt.format(res[key]) if key in res else "skipped"

    a = res["args"]
    mm = res.get("mismatch", {})
    share = res.get("e2e_share")
    e2e = (
        f"{res['e2e_step_s']:.2f} ({' / '.join(f'{v:.0%}' for v in share.values())})"
        if share
        else "skipped"
    )
    be = res.get("compile_break_even_step", "skipped")
    breakeven = "never" if be is None else be if isinstance(be, str) else f"{be:.0f}"
    rows = [
        ("trainer tokens/s", f("trainer_tokens_per_s"), f"{PRIME_RL_TPS:,} (prime-rl, 1xH100)"),
        ("trainer MFU, real head size", f("mfu", "{:.1f}%"), ""),
        ("trainer MFU, prime-rl formula", f("mfu_primerl", "{:.1f}%"), f"{PRIME_RL_MFU}%"),
        ("trainer peak GPU memory GiB (vLLM's included)", f("trainer_peak_mem_gib", "{:.1f}"), ""),
        ("vLLM generation tokens/s", f("vllm_gen_tokens_per_s"), ""),
        ("end-to-end tokens/s", f("e2e_tokens_per_s"), ""),
        ("end-to-end step s (generate/update/sync)", e2e, ""),
        ("vLLM start-up s", f("vllm_startup_s", "{:.1f}"), ""),
        ("trainer s/step, eager (median after the first)", f("trainer_step_s", "{:.3f}"), ""),
        ("compiled trainer s/step (median after the first)", f("compiled_step_s", "{:.3f}"), ""),
        ("compiled trainer tokens/s", f("compiled_tokens_per_s"), ""),
        ("compiled trainer MFU, real head size", f("compiled_mfu", "{:.1f}%"), ""),
        ("compiled speed-up over eager", f("compile_speedup", "{:.2f}x"), ""),
        (
            "compile s (graphs, inductor cache)",
            f"{res['compile_s']:.1f} ({res['compile_graphs']}, {res['compile_cache']})"
            if "compile_s" in res
            else "skipped",
            "",
        ),
        ("compile paid for itself at step", breakeven, ""),
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
        f"trainer: {a['train_seqs']} sequences x {a['train_len']} tokens per update, "
        f"{a['micro_batch']} per forward (prime-rl: one packed 16384-token micro-batch); "
        f"vLLM: {a['prompts']} prompts x {a['group']} samples, {a['prompt_tokens']} + "
        f"{a['new_tokens']} tokens",
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
    p.add_argument(
        "--phases",
        type=lambda s: [x.strip() for x in s.split(",")],
        default=list(PHASES),
        help=f"phases to run, comma-separated [{','.join(PHASES)}]",
    )
    p.add_argument("--out", type=Path, default=None, help=OUT_HELP)
    args = p.parse_args(argv)
    unknown = [x for x in args.phases if x not in PHASES]
    if unknown:
        p.error(f"--phases: unknown phase {unknown[0]!r}; choose from {', '.join(PHASES)}")
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
