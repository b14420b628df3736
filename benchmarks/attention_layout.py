"""The training pass's two attention layouts, alternating in one process, by completion length:
the masked one (a bool [N, 1, L, P+L] mask; from ``BLOCKED_MIN_TOKENS`` its queries in blocks,
and once more as one call, ``unblocked``: what the blocks save) against the causal one (prompt
padding rolled to the end, ``is_causal``, no mask), forward + backward of ``token_logprobs`` with shared prompts;
and, for reference, the model's own Hugging Face forward over prompt + completion with its
attention mask, the pass TRL's trainer runs (``hf``: SDPA with a mask when a prompt is padded).

    python benchmarks/attention_layout.py --lengths 64,128,256,512,1024 --threads 1

The model is the d64 shape of ``growth.py`` (random init, 2 layers, 4 heads, 2 KV heads); one
micro-batch of 8 rows (2 prompts x 4 samples, one prompt left-padded by 3 tokens), the size of
a ``growth.py`` minibatch. Prints the median ms per pass of each layout and their ratio (above
1: causal is faster); writes JSON (a new dated file unless ``--out``). Float64 equality of the
two is a unit test (tests/test_fast_forward.py), not checked here.
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


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="64,128,256,512,1024", help="completion lengths")
    ap.add_argument("--reps", type=int, default=7, help="timed passes of each layout per length")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--profile", action="store_true", help="also print torch.profiler's top ops per layout"
    )
    ap.add_argument("--out", default=None, help=OUT_HELP)
    args = ap.parse_args(argv)
    try:
        lengths = [int(x) for x in args.lengths.split(",")]
    except ValueError:
        ap.error(f"--lengths {args.lengths!r}: comma-separated integers")

    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    import gspo.models.fast_forward as ff
    from gspo.models.logprobs import token_logprobs

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = Qwen3Config(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=4096,
        attn_implementation="sdpa",
    )
    model = Qwen3ForCausalLM(cfg).train()
    n, p = 8, 16
    rows = []
    threshold = ff.CAUSAL_MIN_TOKENS
    blocks_from = ff.BLOCKED_MIN_TOKENS
    try:
        for length in lengths:
            prompt = torch.randint(0, 64, (2, p)).repeat_interleave(4, 0)  # [N, P]
            prompt_mask = torch.ones(n, p, dtype=torch.long)
            prompt_mask[:4, :3] = 0  # the first prompt is left-padded
            completion = torch.randint(0, 64, (n, length))  # [N, L]
            completion_mask = torch.ones(n, length, dtype=torch.long)
            index = torch.arange(2).repeat_interleave(4)  # [N]

            batch = (prompt, prompt_mask, completion, completion_mask, index)

            def one_pass(causal: bool, batch=batch, blocked: bool = True) -> float:
                ff.CAUSAL_MIN_TOKENS = 1 if causal else 10**9
                ff.BLOCKED_MIN_TOKENS = blocks_from if blocked else 10**9
                t = time.perf_counter()
                logp, _ = token_logprobs(
                    model, *batch[:4], with_entropy=True, prompt_index=batch[4]
                )  # [N, L]
                logp.sum().backward()
                return time.perf_counter() - t

            def hf_pass(batch=batch, length=length) -> float:
                prompt, prompt_mask, completion, completion_mask = batch[:4]
                t = time.perf_counter()
                logits = model(
                    input_ids=torch.cat([prompt, completion], dim=1),
                    attention_mask=torch.cat([prompt_mask, completion_mask], dim=1),
                    logits_to_keep=length + 1,
                ).logits[:, :-1]  # [N, L, V]
                logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, completion[..., None])
                logp.sum().backward()
                return time.perf_counter() - t

            one_pass(False), one_pass(False, blocked=False), one_pass(True), hf_pass()  # warm-up
            if args.profile:
                from torch.profiler import profile

                for causal in (False, True):
                    with profile() as prof:
                        one_pass(causal)
                    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=6)
                    print(f"L={length} {'causal' if causal else 'masked'}:\n{table}")
            times: dict[str, list[float]] = {"masked": [], "unblocked": [], "causal": [], "hf": []}
            passes = {
                "masked": lambda: one_pass(False),
                "unblocked": lambda: one_pass(False, blocked=False),
                "causal": lambda: one_pass(True),
                "hf": hf_pass,
            }
            for r in range(args.reps):
                for name in list(passes) if r % 2 == 0 else list(passes)[::-1]:
                    times[name].append(passes[name]())
            masked, causal, hf = (statistics.median(times[k]) for k in ("masked", "causal", "hf"))
            rows.append(
                {
                    "length": length,
                    "masked_ms": masked * 1e3,
                    "causal_ms": causal * 1e3,
                    "unblocked_ms": statistics.median(times["unblocked"]) * 1e3,
                    "ratio": masked / causal,
                    "hf_ms": hf * 1e3,
                    "times": times,
                    "load": os.getloadavg()[0],
                }
            )
            print(
                f"L={length}: masked {masked * 1e3:.1f} ms, causal {causal * 1e3:.1f} ms, "
                f"{masked / causal:.2f}x (load {os.getloadavg()[0]:.1f})",
                file=sys.stderr,
                flush=True,
            )
    finally:
        ff.CAUSAL_MIN_TOKENS = threshold
        ff.BLOCKED_MIN_TOKENS = blocks_from
    print(
        "| completion tokens | masked ms | masked, one call ms | one call / masked | causal ms | "
        "masked / causal | hf ms | hf / gspo's layout | load (1 min) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        own = r["causal_ms"] if r["length"] - 1 >= threshold else r["masked_ms"]
        print(
            f"| {r['length']} | {r['masked_ms']:.1f} | {r['unblocked_ms']:.1f} | "
            f"{r['unblocked_ms'] / r['masked_ms']:.2f}x | {r['causal_ms']:.1f} | "
            f"{r['ratio']:.2f}x | {r['hf_ms']:.1f} | {r['hf_ms'] / own:.2f}x | {r['load']:.1f} |"
        )
    out = Path(args.out) if args.out else dated_result("attention_layout")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "benchmark": "attention_layout",
                "command": " ".join(sys.argv),
                "settings": {"rows": n, "prompt": p, "threads": args.threads, "reps": args.reps},
                "threshold": threshold,
                "blocked_from": blocks_from,
                "results": rows,
            },
            indent=1,
        )
    )
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
