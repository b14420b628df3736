"""Loading runs for the report: one run's records (training steps, evaluations), run folders
and their saved configs (:func:`load_run`, :func:`discover_runs`), grouping runs into
conditions (:func:`group_runs`) and a run's per-step series (:func:`series`)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gspo.orchestration.logging import read_metrics


def train_records(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in history if "reward/mean" in r]


def eval_records(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in history if "eval/greedy_accuracy" in r]


IGNORED_KEYS = frozenset(
    {
        "output_dir",
        "seed",
        "progress",
        "threads",
        "device",
        "tensorboard",
        "wandb",
        "stop_after",
        "checkpoint_every",
        "keep_checkpoints",
    }
)
"""Config keys that never tell two conditions apart (where a run lives, how it was watched)."""


TIME_KEYS = ("time/rollout_s", "time/recompute_s", "time/train_s")


@dataclass
class Run:
    """One finished (or partial) run: its folder, saved config and metric records."""

    path: Path
    config: dict[str, Any]
    records: list[dict[str, Any]]
    label: str = ""
    """The group label, set by :func:`group_runs`."""

    @property
    def algo(self) -> str:
        return str(self.config.get("algo", "?"))

    @property
    def seed(self) -> int:
        return int(self.config.get("seed", 0))

    @property
    def train(self) -> list[dict[str, Any]]:
        """Training-step records in step order (the last record wins for a repeated step)."""
        by_step = {r["step"]: r for r in train_records(self.records)}
        return [by_step[s] for s in sorted(by_step)]

    @property
    def evals(self) -> list[dict[str, Any]]:
        by_step = {r["step"]: r for r in eval_records(self.records)}
        return [by_step[s] for s in sorted(by_step)]


def _number(value: Any) -> float:
    """A metric value as a float; JSONL stores inf/NaN as strings, missing values are NaN."""
    if value is None:
        return math.nan
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return math.nan
    return float(value)


def read_config(run_dir: str | Path) -> dict[str, Any]:
    """The config a run was made with: ``config.json`` at its root (written by the trainer at
    start), else the ``config`` of its newest ``checkpoints/*/state.json``."""
    run_dir = Path(run_dir)
    top = run_dir / "config.json"
    if top.is_file():
        data = json.loads(top.read_text())
        if not isinstance(data, dict):
            raise ValueError(f"{top}: expected a JSON object of config fields")
        return data
    states = sorted((run_dir / "checkpoints").glob("*/state.json"))
    if states:
        state = json.loads(states[-1].read_text())
        if isinstance(state, dict) and isinstance(state.get("config"), dict):
            return state["config"]
    raise ValueError(
        f"{run_dir}: no run config found (looked for config.json and checkpoints/*/state.json); "
        "runs made by `gspo train` or `gspo compare` have one"
    )


def load_run(run_dir: str | Path) -> Run:
    """Read a run folder's ``metrics.jsonl`` and saved config."""
    run_dir = Path(run_dir)
    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file():
        raise FileNotFoundError(f"{run_dir}: no metrics.jsonl (is this a run folder?)")
    try:
        records = read_metrics(metrics)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{metrics}: line {exc.lineno} is not JSON: {exc.msg}") from None
    run = Run(path=run_dir, config=read_config(run_dir), records=records)
    if not run.train:
        raise ValueError(f"{metrics}: no training-step records (reward/mean)")
    return run


def discover_runs(paths: Iterable[str | Path]) -> list[Path]:
    """Run folders named by ``paths``: each path is a run folder (holding metrics.jsonl) or a
    folder searched recursively for run folders (e.g. the output of ``gspo compare``)."""
    found: list[Path] = []
    for p in map(Path, paths):
        if not p.exists():
            raise FileNotFoundError(f"{p}: no such run folder")
        if (p / "metrics.jsonl").is_file():
            found.append(p)
            continue
        below = sorted(m.parent for m in p.rglob("metrics.jsonl"))
        if not below:
            raise FileNotFoundError(f"{p}: no metrics.jsonl in it or below it")
        found += below
    unique: dict[Path, None] = {}
    for p in found:
        unique.setdefault(p.resolve(), None)
    return list(unique)


def _fmt_value(value: Any) -> str:
    if value is None:
        return "default"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def seedless(value: Any, seed: int) -> Any:
    """``value`` with its run's own seed written as ``<k>`` where a path names it (``sft/seed3``
    -> ``sft/seed<k>``): the per-seed cold starts of one condition then read the same."""
    if isinstance(value, str):
        return re.sub(rf"seed{seed}(?![0-9])", "seed<k>", value)
    return value


def _key_value(run: Run, key: str) -> str:
    return json.dumps(seedless(run.config[key], run.seed), sort_keys=True)


def condition_keys(runs: Sequence[Run], ignore: Iterable[str] = ()) -> list[str]:
    """Config keys (besides algo) that tell conditions apart, compared after :func:`seedless`
    and only among the runs that saved the key (an older version may not have):

    - a key whose values differ between runs of one seed is a condition;
    - a key with one value per seed, the same for every run of that seed, follows the seed (a
      per-seed cold-start ``model`` made elsewhere) when every seed has its own value, and is a
      condition when some seeds share a value: one extra run with another ``lr`` and its own
      seed is not pooled with the seeds of the others.

    :data:`IGNORED_KEYS` and ``ignore`` are never conditions."""
    skip = IGNORED_KEYS | set(ignore) | {"algo"}
    all_keys = sorted({k for run in runs for k in run.config} - skip)
    keys = []
    for key in all_keys:
        per_seed: dict[int, set[str]] = {}
        for run in runs:
            if key in run.config:
                per_seed.setdefault(run.seed, set()).add(_key_value(run, key))
        if any(len(values) > 1 for values in per_seed.values()):
            keys.append(key)
            continue
        distinct = {v for values in per_seed.values() for v in values}
        if 1 < len(distinct) < len(per_seed):
            keys.append(key)
    return keys


def group_runs(runs: Sequence[Run], ignore: Iterable[str] = ()) -> dict[str, list[Run]]:
    """Runs grouped by condition (algo and :func:`condition_keys`), in first-seen order; each
    group sorted by seed.

    ``ignore`` names config keys that must not split groups (for example ``model`` when the
    same cold start was made twice in different folders). Raises ValueError when two runs of one
    condition share a seed (one would hide the other).
    """
    if not runs:
        raise ValueError("no runs to group")
    keys = condition_keys(runs, ignore)
    groups: dict[str, list[Run]] = {}
    for run in runs:
        parts = [run.algo] + [
            f"{k}={_fmt_value(seedless(run.config.get(k), run.seed))}" for k in keys
        ]
        run.label = " ".join(parts)
        groups.setdefault(run.label, []).append(run)
    for label, members in groups.items():
        members.sort(key=lambda r: r.seed)
        seeds = [r.seed for r in members]
        for seed in set(seeds):
            if seeds.count(seed) > 1:
                dupes = ", ".join(str(r.path) for r in members if r.seed == seed)
                raise ValueError(f"runs {dupes} are both {label!r} with seed {seed}")
    return groups


def series(run: Run, key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of a training metric; derived keys: ``ratio/spread``, ``time/elapsed_s``."""
    train = run.train
    steps = [int(r["step"]) for r in train]
    if key == "ratio/spread":
        values = [_number(r.get("ratio/max")) - _number(r.get("ratio/min")) for r in train]
    elif key == "time/elapsed_s":
        values, total = [], 0.0
        for r in train:
            total += sum(_number(r.get(k, 0.0)) for k in TIME_KEYS)
            values.append(total)
    else:
        values = [_number(r.get(key)) for r in train]
    return steps, values


def eval_series(run: Run, key: str = "eval/greedy_accuracy") -> tuple[list[int], list[float]]:
    evals = run.evals
    return [int(r["step"]) for r in evals], [_number(r.get(key)) for r in evals]
