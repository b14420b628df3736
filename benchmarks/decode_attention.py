"""The rollout's one-token attention step, by cache length: ``FastDecoder.decode``'s own
formulation against the alternatives a faster long-response rollout could use, alternating
in one process.

    python benchmarks/decode_attention.py --lengths 128,512,1024 --threads 1

Shapes are those of ``growth.py``'s rollout (d64: 4 heads, 2 KV heads, head dim 16; 4 prompts
x group 8 = 32 rows, caches preallocated to 16 prompt + 1024 new tokens, a few rows with
padded prompt columns). Each layer has its own cache, and the timed step runs over ``--layers``
of them in turn, as a decode step does, so the caches are read from memory, not from a cache
warmed by the previous call. Variants (all return the attention output [N, H, 1, D]):

- ``bmm``: what ``FastDecoder.decode`` does: grouped queries times the cache slice, scale,
  padding bias, softmax, times the values (two batched matmuls, no copy of the cache);
- ``keys_t``: the same with the keys stored transposed ([N, KV, D, max_len]);
- ``tall``: the scores as keys @ queries (one tall matmul per row and head instead of a wide one);
- ``sdpa_gqa``: ``scaled_dot_product_attention`` over the cache slice with ``enable_gqa``;
- ``hf``: what a Hugging Face ``DynamicCache`` decode step does: the new column concatenated to
  the cache, the KV heads repeated for the query heads, then SDPA (as TRL's rollout runs it).

Prints the median microseconds per layer and step of each variant, its ratio to ``bmm`` and
whether its output equals ``bmm``'s bit for bit; writes JSON (a new dated file unless ``--out``).

``--profile-rollout TOKENS`` first runs ``torch.profiler`` over one whole rollout of the torch
engine on that model (random-init d64, 4 prompts x 8 samples, ``TOKENS`` new tokens, no stop
token) and prints the ops by self CPU time: where the rollout's time goes as it gets longer.
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

ROWS, HEADS, KV_HEADS, HEAD_DIM, PROMPT, MAX_NEW = 32, 4, 2, 16, 16, 1024


def bmm_attention(torch, q, keys, values, bias, scale: float):
    """``FastDecoder.decode``'s attention, op for op: q [N, H, 1, D] over the cache slices
    keys, values [N, KV, S, D] with the additive padding ``bias`` [N, 1, 1, S] (or None);
    returns [N, H, 1, D] (head h = kv * groups + g)."""
    n, kvh, _, d = keys.shape
    qg = q.reshape(n, kvh, q.shape[1] // kvh, d)  # [N, KV, G, D]
    scores = torch.matmul(qg, keys.transpose(-1, -2)) * scale  # [N, KV, G, S]
    if bias is not None:
        scores = scores + bias
    return torch.matmul(scores.softmax(dim=-1), values).reshape(q.shape)


def variants(torch, layers: int, seed: int = 0) -> dict:
    """The step functions ``f(layer, s)`` of each variant (``layers`` caches of their own)."""
    F = torch.nn.functional
    g = torch.Generator().manual_seed(seed)
    n, kvh, d, m = ROWS, KV_HEADS, HEAD_DIM, PROMPT + MAX_NEW
    groups = HEADS // kvh
    keys = [torch.randn(n, kvh, m, d, generator=g) for _ in range(layers)]
    values = [torch.randn(n, kvh, m, d, generator=g) for _ in range(layers)]
    keys_t = [k.transpose(-1, -2).contiguous() for k in keys]  # [N, KV, D, M]
    bias = torch.zeros(n, 1, 1, m)
    bias[: n // 4, ..., :3] = float("-inf")  # one prompt of four left-padded by 3 tokens
    q = torch.randn(n, HEADS, 1, d, generator=g)
    qg = q.reshape(n, kvh, groups, d)  # head = kv * groups + g
    scale = d**-0.5

    def out(probs, vals):  # [N, KV, G, S] x [N, KV, S, D] -> [N, H, 1, D]
        return torch.matmul(probs, vals).reshape(n, HEADS, 1, d)

    def bmm(i: int, s: int):
        return bmm_attention(torch, q, keys[i][:, :, :s], values[i][:, :, :s], bias[..., :s], scale)

    def keys_t_step(i: int, s: int):
        scores = torch.matmul(qg, keys_t[i][..., :s]) * scale + bias[..., :s]
        return out(scores.softmax(dim=-1), values[i][:, :, :s])

    def tall(i: int, s: int):
        scores = torch.matmul(keys[i][:, :, :s], qg.transpose(-1, -2)).transpose(-1, -2)
        return out((scores * scale + bias[..., :s]).softmax(dim=-1), values[i][:, :, :s])

    def sdpa_gqa(i: int, s: int):
        k, v = keys[i][:, :, :s], values[i][:, :, :s]
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=bias[..., :s], scale=scale, enable_gqa=True
        )

    def hf(i: int, s: int):
        k = torch.cat([keys[i][:, :, : s - 1], keys[i][:, :, s - 1 : s]], dim=2)
        v = torch.cat([values[i][:, :, : s - 1], values[i][:, :, s - 1 : s]], dim=2)
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias[..., :s], scale=scale)

    fns = {"bmm": bmm, "keys_t": keys_t_step, "tall": tall, "sdpa_gqa": sdpa_gqa, "hf": hf}
    return fns


def profile_rollout(torch, tokens: int) -> None:
    """Print torch.profiler's top ops over one rollout of ``tokens`` new tokens (after a warm-up)."""
    from torch.profiler import profile

    from gspo.models.tiny_model import build_tiny_model
    from gspo.rollout.base import GenerationRequest, SamplingParams
    from gspo.rollout.torch_engine import TorchEngine

    model = build_tiny_model(
        100, hidden_size=64, num_heads=HEADS, num_kv_heads=KV_HEADS, max_position_embeddings=4096
    )
    engine = TorchEngine(model, pad_id=0, eos_id=-1)  # no id ends a row: every row runs to the cap
    prompts = [[1, *range(5, 5 + PROMPT - 3 + i)] for i in range(4)]  # 13-16 tokens, padded
    params = SamplingParams(max_new_tokens=tokens, temperature=1.0)
    engine.generate(
        GenerationRequest(prompts, 8, params, torch.Generator().manual_seed(0))
    )  # warm-up
    with profile() as prof:
        engine.generate(GenerationRequest(prompts, 8, params, torch.Generator().manual_seed(1)))
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=8))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="128,512,1024", help="cache lengths (columns attended)")
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds per length")
    ap.add_argument("--steps", type=int, default=20, help="timed steps per variant and round")
    ap.add_argument("--layers", type=int, default=4, help="distinct caches cycled per step")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--profile-rollout", type=int, default=0, metavar="TOKENS", help="profile one rollout first"
    )
    ap.add_argument("--out", default=None, help=OUT_HELP)
    args = ap.parse_args(argv)
    try:
        lengths = [int(x) for x in args.lengths.split(",")]
    except ValueError:
        ap.error(f"--lengths {args.lengths!r}: comma-separated integers")
    if any(not 1 <= s <= PROMPT + MAX_NEW for s in lengths):
        ap.error(f"--lengths must lie in 1..{PROMPT + MAX_NEW}")

    import torch

    torch.set_num_threads(args.threads)
    if args.profile_rollout:
        profile_rollout(torch, args.profile_rollout)
    fns = variants(torch, args.layers)
    names = list(fns)
    rows = []
    for s in lengths:
        ref = fns["bmm"](0, s)
        equal = {k: bool(torch.equal(f(0, s), ref)) for k, f in fns.items()}
        times: dict[str, list[float]] = {k: [] for k in names}
        for r in range(args.rounds):
            for k in names if r % 2 == 0 else names[::-1]:
                f = fns[k]
                t = time.perf_counter()
                for _ in range(args.steps):
                    for i in range(args.layers):
                        f(i, s)
                times[k].append((time.perf_counter() - t) / (args.steps * args.layers) * 1e6)
        med = {k: statistics.median(v) for k, v in times.items()}
        rows.append(
            {"length": s, "us": med, "times_us": times, "equal": equal, "load": os.getloadavg()[0]}
        )
        print(f"S={s}: " + ", ".join(f"{k} {med[k]:.0f} us" for k in names), file=sys.stderr)
    print("| cache columns | " + " | ".join(f"{k} us (x bmm, bits)" for k in names) + " | load |")
    print("|---|" + "---|" * len(names) + "---|")
    for row in rows:
        cells = [
            f"{row['us'][k]:.0f} ({row['us'][k] / row['us']['bmm']:.2f}x, "
            f"{'same' if row['equal'][k] else 'differ'})"
            for k in names
        ]
        print(f"| {row['length']} | " + " | ".join(cells) + f" | {row['load']:.1f} |")
    out = Path(args.out) if args.out else dated_result("decode_attention")
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {k: v for k, v in vars(args).items() if k != "out"}
    out.write_text(json.dumps({"args": meta, "torch": torch.__version__, "rows": rows}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
