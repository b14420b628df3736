"""Cost of an image prompt against a text prompt of the same token length, on ``tiny-vl``.

    python benchmarks/vision_prompts.py --threads 1
    python benchmarks/vision_prompts.py --threads 1 --prompts 16 --group-size 8

The image prompts are the ``shapes`` task's (one 56x56 image, 4 image tokens); each text
prompt is the same prompt with the image replaced by as many characters as the image's
tokens took, so both sides feed the same number of token positions to the text model.
Columns (medians over ``--reps``): ``encode ms`` (chat template + processor / tokenizer, all
prompts), ``generate ms`` (the torch engine: prefill once per prompt, ``--max-new-tokens``
decode steps for the group), ``train fwd+bwd ms`` (``token_logprobs`` over every row and its
backward, as the update runs it), ``train peak MB`` (the most CPU memory torch held at once
during one training forward + backward, above what it held before: the torch profiler's
allocations and frees summed in order), ``pixel KB`` (the pixel inputs the step holds: once per
prompt, shared by its group). The row ``image, tower per row`` is the training forward as it
was before the vision tower ran once per prompt (every row's pixels expanded,
``vision.per_row_image_inputs``); the three rows' training steps are timed alternately in one
loop, so machine load moves them alike. Prints a Markdown table, writes JSON.
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
from torch.profiler import ProfilerActivity, profile

import gspo.models.vision as vision
from gspo.config.train import TrainConfig
from gspo.envs.tasks import make_task
from gspo.models.chat import encode_examples
from gspo.models.logprobs import token_logprobs
from gspo.models.policy import build_policy, build_prompt_format
from gspo.rollout.base import GenerationRequest, SamplingParams
from gspo.rollout.torch_engine import TorchEngine


def _median_ms(fn, reps: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def _peak_mb(fn) -> float:
    """The most memory torch's CPU allocations held at once during ``fn`` above its start."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    # Allocations and frees inside an op count as the op's own; frees outside any op are
    # "[memory]" events. In start order, their running sum is the memory held.
    events = [e for e in prof.events() if e.name == "[memory]" or e.self_cpu_memory_usage]
    events.sort(key=lambda e: e.time_range.start)
    held = peak = 0
    for e in events:
        held += e.cpu_memory_usage if e.name == "[memory]" else e.self_cpu_memory_usage
        peak = max(peak, held)
    return peak / 2**20


def prepare(examples, fmt, model, tok, group: int, max_new: int, reps: int, per_row=False):
    """(row of measurements, training-step function) for these prompts."""
    engine = TorchEngine(model, pad_id=tok.pad_token_id, eos_id=tok.eos_token_id, tokenizer=tok)
    params = SamplingParams(max_new_tokens=max_new, temperature=1.0, stop_token_ids=())
    ids, pixels = encode_examples(fmt, examples)
    out = engine.generate(
        GenerationRequest(ids, group, params, torch.Generator().manual_seed(0), pixels=pixels)
    )

    def generate():
        engine.generate(
            GenerationRequest(ids, group, params, torch.Generator().manual_seed(0), pixels=pixels)
        )

    shared = vision.image_inputs

    def train_step():
        # Before/after in one process: the per-row row swaps in the old per-row path.
        vision.image_inputs = vision.per_row_image_inputs if per_row else shared
        try:
            model.zero_grad(set_to_none=True)
            lp, _ = token_logprobs(
                model,
                out.prompt_ids,
                out.prompt_mask,
                out.completion_ids,
                out.completion_mask,
                prompt_index=out.prompt_index,
                pixels=pixels,
            )  # [N, L]
            lp.sum().backward()
        finally:
            vision.image_inputs = shared

    row = {
        "prompt tokens": len(ids[0]),
        "encode ms": _median_ms(lambda: encode_examples(fmt, examples), reps),
        "generate ms": _median_ms(generate, reps),
        "pixel KB": 0.0 if pixels is None else (pixels.values.nbytes + pixels.mask.nbytes) / 1024,
    }
    return row, train_step


def train_costs(steps: dict, reps: int) -> dict[str, dict[str, float]]:
    """Median ms and peak MB of each training step, the steps alternating rep by rep."""
    times: dict[str, list[float]] = {name: [] for name in steps}
    for fn in steps.values():
        fn()  # warm-up
    for _ in range(reps):
        for name, fn in steps.items():
            t = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - t) * 1000)
    return {
        name: {"train fwd+bwd ms": statistics.median(times[name]), "train peak MB": _peak_mb(fn)}
        for name, fn in steps.items()
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default=None, help=OUT_HELP)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    opts = TrainConfig.of(model="tiny-vl").model
    model, tok = build_policy(opts, torch.device("cpu"), seed=0)
    fmt = build_prompt_format(opts, tok, model)
    images = make_task("shapes", n_train=args.prompts, n_test=1, seed=0).train[: args.prompts]
    image_ids, _ = encode_examples(fmt, images)
    text_ids = fmt.encode([e.prompt.replace("<image>", "") for e in images])
    # The same positions as text: characters in place of the image's expanded tokens.
    extra = len(image_ids[0]) - len(text_ids[0])
    texts = [
        type(e)(prompt="x" * extra + e.prompt.replace("<image>", ""), answer=e.answer)
        for e in images
    ]
    rows, steps = {}, {}
    variants = (("image", images, False), ("image, tower per row", images, True))
    for name, examples, per_row in (*variants, ("text", texts, False)):
        rows[name], steps[name] = prepare(
            examples, fmt, model, tok, args.group_size, args.max_new_tokens, args.reps, per_row
        )
    model.train()
    for name, costs in train_costs(steps, args.reps).items():
        rows[name].update(costs)
    model.eval()
    cols = ["prompt tokens", "encode ms", "generate ms", "train fwd+bwd ms", "train peak MB"]
    cols.append("pixel KB")
    print(f"{args.prompts} prompts x {args.group_size} samples, {args.threads} thread(s)\n")
    print("| prompt | " + " | ".join(cols) + " |")
    print("|---|" + "---|" * len(cols))
    for name, row in rows.items():
        cells = [f"{row[c]:.1f}" if isinstance(row[c], float) else str(row[c]) for c in cols]
        print(f"| {name} | " + " | ".join(cells) + " |")
    for c in cols[1:5]:
        print(f"{c}: image / text = {rows['image'][c] / rows['text'][c]:.2f}")
    for c in cols[3:5]:
        before = rows["image, tower per row"][c]
        print(f"{c}: image / image with the tower per row = {rows['image'][c] / before:.2f}")
    path = Path(args.out) if args.out else dated_result("vision_prompts")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps({"args": vars(args), "machine": platform.processor(), "rows": rows}, indent=2)
    )
    print(f"\nresults: {path}")


if __name__ == "__main__":
    main()
