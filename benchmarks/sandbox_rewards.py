"""Time to score one training batch of code completions in the sandbox, by worker count.

    python benchmarks/sandbox_rewards.py                  # 128 completions, workers 1, 2, 4, auto
    python benchmarks/sandbox_rewards.py --n 32 --workers 1,4
    python benchmarks/sandbox_rewards.py --ray 2,4        # + Ray tasks (reward_placement='ray')

The batch is the built-in code task's problems (five assert tests each), half answered with
the reference solution and half with a wrong one, scored by ``gspo.envs.rewards.score`` with the
code reward exactly as the trainer does. ``workers=1`` is how the trainer scored before
rewards ran in parallel; ``auto`` is what it uses now (``gspo.envs.rewards.reward_workers``: one
per core, at most 8). Every configuration must give the same rewards; the script checks.

Columns: ``seconds`` for the whole batch (one pass; the sandbox's first run and the
interpreter query are warmed up before), ``ms / completion``, ``speed-up`` against
``workers=1``, ``cores`` of this machine. Prints a Markdown table, writes JSON.

``--ray K,...`` adds rows scored as ``backend='ray'`` with ``reward_placement='ray'`` does: the
batch in K chunks, one Ray task each (:class:`gspo.orchestration.ray_rewards.RayScorer`), on a
private local Ray with max(K) CPUs. Each K is warmed up first (one call starts the workers and
their sandbox); ``cold s`` is that first call, ``seconds`` a second, warm one.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

from _results import OUT_HELP, dated_result

from gspo.envs.rewards import reward_workers, score
from gspo.envs.tasks import make_task
from gspo.sandbox import code_reward, isolation

WRONG = "```python\ndef f(x):\n    return x + 1\n```"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=128, help="completions in the batch")
    parser.add_argument("--workers", default="1,2,4,auto", help="comma-separated counts")
    parser.add_argument("--ray", default="", help="comma-separated Ray task counts (empty: none)")
    parser.add_argument("--out", default=None, help=OUT_HELP)
    args = parser.parse_args(argv)
    if args.out is None:  # never overwrite committed results
        args.out = str(dated_result("sandbox_rewards"))

    task = make_task("code", n_train=args.n, n_test=1, difficulty=2)
    examples = [task.train[i % len(task.train)] for i in range(args.n)]
    completions = [e.demo if i % 2 == 0 else WRONG for i, e in enumerate(examples)]
    print(isolation().summary())  # also warms up the sandbox
    rows = []
    reference = None
    for spec in args.workers.split(","):
        workers = reward_workers(code_reward) if spec == "auto" else int(spec)
        start = time.perf_counter()
        rewards, errors = score(code_reward, completions, examples, workers=workers)
        seconds = time.perf_counter() - start
        reference = reference if reference is not None else rewards
        if rewards != reference or errors:
            raise SystemExit(f"workers={workers}: rewards differ from workers=1 ({errors} errors)")
        rows.append({"workers": spec, "threads": workers, "seconds": seconds})
    if args.ray:
        rows += ray_rows([int(k) for k in args.ray.split(",")], completions, examples, reference)
    base = rows[0]["seconds"]
    cores = os.cpu_count()
    print(f"\n{args.n} completions, mean reward {sum(reference) / len(reference):.3f}\n")
    print("| workers | seconds | ms / completion | speed-up | cores |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for row in rows:
        row["ms_per_completion"] = 1000 * row["seconds"] / args.n
        row["speedup"] = base / row["seconds"]
        label = (
            f"{row['workers']} ({row['threads']})" if row["workers"] == "auto" else row["workers"]
        )
        if "cold_seconds" in row:
            label += f" (cold {row['cold_seconds']:.1f} s)"
        print(
            f"| {label} | {row['seconds']:.2f} | {row['ms_per_completion']:.0f} "
            f"| {row['speedup']:.2f}x | {cores} |"
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "benchmark": "sandbox_rewards",
        "n": args.n,
        "machine": platform.machine(),
        "cores": cores,
        "isolation": sorted(isolation().mechanisms),
        "rows": rows,
    }
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"\nwrote {out}")


def ray_rows(counts: list[int], completions, examples, reference) -> list[dict]:
    """Rows scored in K Ray tasks for each K of ``counts`` (a private local Ray, stopped after)."""
    from gspo.backend.ray_cluster import start_ray, stop_ray
    from gspo.orchestration.ray_rewards import RayScorer

    start = time.perf_counter()
    ray = start_ray(None, num_cpus=max(counts))
    print(f"ray.init: {time.perf_counter() - start:.1f} s")
    rows = []
    try:
        for k in counts:
            scorer = RayScorer(ray, k, (code_reward,))
            times = []
            for _ in range(2):  # cold (workers start, sandbox warm-up), then warm
                start = time.perf_counter()
                rewards, errors = scorer(code_reward, completions, examples)
                times.append(time.perf_counter() - start)
                if rewards != reference or errors:
                    raise SystemExit(f"ray tasks={k}: rewards differ ({errors} errors)")
            rows.append(
                {"workers": f"ray {k}", "threads": k, "seconds": times[1], "cold_seconds": times[0]}
            )
    finally:
        stop_ray(ray)
    return rows


if __name__ == "__main__":
    main()
