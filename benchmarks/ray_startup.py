"""Ray start-up time of a run: from nothing to FSDP2 ranks and rollout workers ready for step 1,
split into phases, for one or two source trees measured alternately (before/after a change).

    python benchmarks/ray_startup.py                                  # this checkout, 3 runs
    python benchmarks/ray_startup.py --src before=OTHER/src --src after=src --repeats 4

Each measurement is a fresh process (fresh imports, a fresh private Ray) running the Ray
backend's own start-up (``start_ray``, ``build_ray_parts``) on the tiny model, ``--trainer-workers`` ranks and ``--rollout-workers``
workers (default 2 + 1, placement separate):

- ``import``: torch, gspo's Ray parts and the model build in the driver;
- ``ray.init``: ``start_ray`` (a private local Ray: GCS, raylet, agents);
- ``actors``: ``build_ray_parts``: the placement groups, the rollout workers' actors holding the
  weights, the training ranks' actors started, their gloo group formed, their shards set up;
- ``ready``: ray.init to ready (what a run waits before its first step, after its imports);
- ``close``: ranks, workers, groups and Ray stopped;
- ``rss_*_gb``: resident memory of the driver, the largest rank and rollout worker once ready
  (not in the table; in the JSON and the per-run lines).

Prints a Markdown table (median and range per source) and writes the runs to a new dated
benchmarks/results/ray_startup-YYYYMMDD-HHMMSS.json (or --out).
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

PHASES = ("import", "ray.init", "actors", "ready", "close")

PROBE = r"""
import json, sys, tempfile, time
t0 = time.perf_counter()
import torch
from gspo.config import TrainConfig, build
from gspo.compose.parts import build_policy_for
from gspo.backend.ray_cluster import start_ray, stop_ray
from gspo.orchestration.ray_parts import build_ray_parts
from gspo.rollout.engines import close_engine
n, m = int(sys.argv[1]), int(sys.argv[2])
cfg = build(TrainConfig, preset="demo", overrides=dict(
    backend="ray", trainer_workers=n, rollout_workers=m, threads=1, device="cpu"))
torch.manual_seed(0)
model, tok = build_policy_for(cfg, torch.device("cpu"))
t = {"import": time.perf_counter() - t0}
a = time.perf_counter()
ray = start_ray(None, num_cpus=n + m)
b = time.perf_counter()
backend, engine = build_ray_parts(cfg, model, tok, tempfile.mkdtemp())
c = time.perf_counter()
t.update({"ray.init": b - a, "actors": c - b, "ready": c - a})
def rss_gb(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 2**20
import os
t["rss_driver_gb"] = rss_gb(os.getpid())
t["rss_rank_gb"] = max(rss_gb(p) for p in backend.pids)
if m:
    t["rss_worker_gb"] = max(rss_gb(p) for p in engine.pids)
close_engine(engine)
backend.close()
stop_ray(ray)
t["close"] = time.perf_counter() - c
print("PHASES " + json.dumps(t), flush=True)
"""


def measure(src: str, n: int, m: int) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(src).resolve()), env.get("PYTHONPATH", "")])
    env["OMP_NUM_THREADS"] = "1"
    run = subprocess.run(
        [sys.executable, "-c", PROBE, str(n), str(m)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    for line in run.stdout.splitlines():
        if line.startswith("PHASES "):
            return json.loads(line[len("PHASES ") :])
    raise RuntimeError(f"probe failed ({run.returncode}): {run.stderr[-3000:]}")


def main() -> None:
    here = Path(__file__).resolve().parents[1] / "src"
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--src",
        action="append",
        help="LABEL=PATH of a source tree (repeatable; measured alternately) [this checkout]",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--trainer-workers", type=int, default=2)
    parser.add_argument("--rollout-workers", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None, help=OUT_HELP)
    args = parser.parse_args()
    sources = dict(s.split("=", 1) for s in (args.src or [f"this={here}"]))
    runs: dict[str, list[dict[str, float]]] = {label: [] for label in sources}
    for i in range(args.repeats):
        for label, src in sources.items():  # alternate: the machine's load hits both alike
            phases = measure(src, args.trainer_workers, args.rollout_workers)
            runs[label].append(phases)
            shown = " ".join(f"{k} {v:.2f}" for k, v in phases.items())  # seconds, GB
            print(f"[{i + 1}/{args.repeats}] {label}: {shown}", flush=True)
    print(
        f"\n{args.trainer_workers} ranks + {args.rollout_workers} rollout workers, tiny model, "
        f"median (min-max) of {args.repeats} runs, seconds\n"
    )
    print("| source | " + " | ".join(PHASES) + " |")
    print("| --- |" + " --- |" * len(PHASES))
    for label, rows in runs.items():
        cells = []
        for phase in PHASES:
            values = [r[phase] for r in rows]
            cells.append(f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})")
        print(f"| {label} | " + " | ".join(cells) + " |")
    out = args.out or dated_result("ray_startup")
    out.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "command": " ".join(["python", "benchmarks/ray_startup.py", *sys.argv[1:]]),
        "trainer_workers": args.trainer_workers,
        "rollout_workers": args.rollout_workers,
        "sources": {label: str(Path(src)) for label, src in sources.items()},
        "runs": runs,
    }
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
