"""MBPP as a check of the code reward: every reference solution passes, wrong ones score 0.

    python benchmarks/mbpp.py --data mbpp.jsonl               # all rows, workers 1 and 2
    python benchmarks/mbpp.py --data mbpp.jsonl --workers 2 --limit 50 --out /tmp/mbpp.json

``--data`` is MBPP's own data file (``mbpp/mbpp.jsonl`` of google-research's repository, 974
rows, or the 427-row ``sanitized-mbpp.json``): no package ships it, so the script reads a copy
the user has. Each row becomes an ``Example`` exactly as a data-file row in MBPP's layout would
(``text`` the prompt; ``test_list``, ``challenge_test_list``, ``test_setup_code`` in ``meta``;
no answer), and is scored with ``gspo.envs.rewards.score(code_reward, ...)`` as the trainer
does. Three completions per row, written as a chat model answers (prose, then a fenced block):

* ``reference``: MBPP's own ``code``; must score 1.0 (all tests, the challenge tests too);
* ``wrong``: every function the tests call, defined with a body that raises; must score 0.0;
* ``returns None``: the same functions returning None; reported, not checked (where a test
  asserts ``f(x) == None`` or ``not f(x)`` it earns that share).

Prints a table (problems passed, mean reward, seconds and seconds per problem for each worker
count) and writes JSON to a new dated file under ``benchmarks/results/`` (never overwriting an
earlier one) unless ``--out`` is given. The JSON records the data file's sha256, not its path.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import sys
from pathlib import Path

from _code_table import print_table, score_rows, write_record
from humaneval import fenced

from gspo.envs.tasks import Example

META = ("task_id", "test_list", "challenge_test_list", "test_setup_code")


def load_rows(path: Path) -> list[dict]:
    """MBPP rows from a .jsonl file (one object per line) or a .json list (sanitized MBPP)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        rows = json.loads(text)
    else:
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    for n, row in enumerate(rows, 1):
        missing = [k for k in ("task_id", "code", "test_list") if k not in row]
        if missing:
            raise SystemExit(f"mbpp: {path.name} row {n}: no field {', '.join(missing)}")
    return rows


def called_functions(row: dict) -> list[str]:
    """The names the tests call that the reference code defines at its top level."""
    defined = {
        node.name
        for node in ast.parse(row["code"]).body
        if isinstance(node, ast.FunctionDef | ast.ClassDef)
    }
    called = []
    for test in [*row["test_list"], *(row.get("challenge_test_list") or [])]:
        for node in ast.walk(ast.parse(test)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                name = node.func.id
                if name in defined and name not in called:
                    called.append(name)
    return called


def stubs(names: list[str], body: str) -> str:
    return "\n\n".join(f"def {name}(*args, **kwargs):\n    {body}" for name in names)


def completions(row: dict) -> dict[str, str]:
    names = called_functions(row)
    return {
        "reference": fenced(row["code"].replace("\r\n", "\n")),
        "wrong": fenced(stubs(names, "raise NotImplementedError")),
        "returns None": fenced(stubs(names, "return None")),
    }


def example(row: dict) -> Example:
    meta = {k: row[k] for k in META if k in row}
    return Example(prompt=row.get("text") or row.get("prompt", ""), answer="", meta=meta)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="MBPP's mbpp.jsonl (or sanitized .json)")
    parser.add_argument("--workers", default="1,2", help="comma-separated worker counts")
    parser.add_argument("--limit", type=int, default=0, help="first N rows only (0: all)")
    parser.add_argument("--out", default=None, help="JSON path (default: a new dated file)")
    args = parser.parse_args(argv)
    path = Path(args.data)
    if not path.is_file():
        raise SystemExit(f"mbpp: --data {args.data}: no such file")
    rows = load_rows(path)
    if args.limit:
        rows = rows[: args.limit]
    examples = [example(r) for r in rows]
    texts = [completions(r) for r in rows]
    workers = [int(w) for w in args.workers.split(",")]
    table, failures = score_rows(examples, texts, workers)
    print_table("MBPP through code_reward", table)
    command = " ".join(["python benchmarks/mbpp.py", *(argv or sys.argv[1:])])
    command = command.replace(args.data, path.name)  # the file's name, never a machine path
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    write_record("mbpp", command, args.out, table, failures, data_sha256=digest)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
