"""``gspo demo`` end to end, before against after: wall time, the greedy held-out gain it
prints, and whether its progress bar's ETA was honest.

    git worktree add /tmp/gspo-base int37
    python benchmarks/demo_time.py --a /tmp/gspo-base --b . --seeds 0,1,2 --threads 1
    python benchmarks/demo_time.py --b . --seeds 0,0 --burn alternate      # the ETA under load

Each run is ``python -m gspo.interface.cli demo --seed S --threads T`` in a subprocess with
``PYTHONPATH=<checkout>/src`` (and ``--a-args`` / ``--b-args`` appended), in a new temporary
folder, with live progress bars. For each seed A runs, then B (the order flips every seed), so a
drift in machine load hits both alike. ``--burn on`` runs one CPU-burning process beside every
run; ``--burn alternate`` beside every other seed's runs (A and B of a seed share the load).

Recorded per run: the process's wall time, the demo's own ``wall time`` line and SFT seconds,
greedy accuracy and sampled pass@1 after SFT and after RL (± standard error, as printed), the
1-minute load average before and after, and the ETA check: every progress-bar line the demo
wrote (stderr, time-stamped as it arrives) is parsed; at 25% of the run's real wall time the
ETA the bar then showed is compared with the real time left until the process ended, and at 25%
of each bar (phase) the ETA is compared with the real time left in that bar and in the demo.
Prints a table; writes every run to a new JSON file (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _results import OUT_HELP, dated_result

# tqdm's meter: "desc:  25%|██▌       | 200/800 [00:12<00:36, 16.1step/s, ...]" (the demo's
# one bar has no "n/total": "demo:  25%|██▌       | [00:12<00:36, [1/2] SFT 200/300, ...]")
BAR = re.compile(
    r"(?P<desc>[^\r\n|]*?):\s+(?P<pct>\d+)%\|[^|]*\|\s*(?:\d+/\d+\s+)?"
    r"\[(?P<elapsed>[\d:]+)<(?P<left>-?[\d:?]+)"
)
GREEDY = re.compile(r"\| greedy accuracy \| ([\d.]+) ± ([\d.]+) \| ([\d.]+) ± ([\d.]+) \|")
PASS1 = re.compile(r"\| sampled pass@1 \| ([\d.]+) ± ([\d.]+) \| ([\d.]+) ± ([\d.]+) \|")


def seconds(text: str) -> float | None:
    """tqdm's interval ("01:05", "1:02:03") in seconds; None for "?"."""
    if "?" in text:
        return None
    total = 0.0
    for part in text.split(":"):
        total = total * 60 + float(part)
    return total


def load1() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def read_bars(stream, t0: float, samples: list[dict]) -> None:
    """Time-stamp every progress-bar update as it arrives (tqdm ends them with \\r)."""
    buf = ""
    while True:
        chunk = stream.read(1)
        if not chunk:
            break
        if chunk not in "\r\n":
            buf += chunk
            continue
        m = BAR.search(buf)
        if m:
            samples.append(
                {
                    "t": time.perf_counter() - t0,
                    "desc": m["desc"].strip(),
                    "pct": int(m["pct"]),
                    "left_s": seconds(m["left"].lstrip("-")),
                }
            )
        buf = ""


def eta_check(samples: list[dict], wall: float) -> dict:
    """The ETA shown at 25% of the run's wall time, and at 25% of each bar, against the truth."""
    out: dict = {}
    at = next((s for s in samples if s["t"] >= 0.25 * wall and s["left_s"] is not None), None)
    if at is not None:
        out["at_25pct_of_wall"] = {
            "t": at["t"],
            "bar": at["desc"],
            "shown_left_s": at["left_s"],
            "real_left_s": wall - at["t"],
        }
    bars: dict[str, list[dict]] = {}
    for s in samples:
        bars.setdefault(s["desc"], []).append(s)
    out["per_bar"] = {}
    for desc, rows in bars.items():
        quarter = next((s for s in rows if s["pct"] >= 25 and s["left_s"]), None)
        if quarter is None:
            continue
        out["per_bar"][desc] = {
            "t": quarter["t"],
            "shown_left_s": quarter["left_s"],
            "real_left_in_bar_s": rows[-1]["t"] - quarter["t"],
            "real_left_in_demo_s": wall - quarter["t"],
        }
    return out


def run_demo(checkout: Path, seed: int, threads: int, extra: list[str], burn: bool) -> dict:
    env = {**os.environ, "PYTHONPATH": str(checkout / "src"), "TOKENIZERS_PARALLELISM": "false"}
    env["OMP_NUM_THREADS"] = str(threads)
    burner = None
    if burn:  # one busy Python loop on a core, for the run's whole duration
        burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    load_before = load1()
    with tempfile.TemporaryDirectory(prefix="gspo-demo-") as tmp:
        cmd = [sys.executable, "-m", "gspo.interface.cli", "demo", "--seed", str(seed)]
        cmd += ["--threads", str(threads), "--output-dir", str(Path(tmp) / "demo"), *extra]
        samples: list[dict] = []
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        reader = threading.Thread(target=read_bars, args=(proc.stderr, t0, samples))
        reader.start()
        stdout = proc.stdout.read()
        proc.wait()
        wall = time.perf_counter() - t0
        reader.join()
    if burner is not None:
        burner.kill()
        burner.wait()
    if proc.returncode != 0:
        sys.stderr.write(stdout[-3000:])
        raise SystemExit(f"demo in {checkout} failed ({proc.returncode})")
    g, p = GREEDY.search(stdout), PASS1.search(stdout)
    demo_wall = re.search(r"wall time (\d+) s", stdout)
    sft = re.search(r"done in (\d+) s", stdout)
    return {
        "seed": seed,
        "burn": burn,
        "process_wall_s": wall,
        "demo_wall_s": float(demo_wall[1]) if demo_wall else None,
        "sft_s": float(sft[1]) if sft else None,
        "greedy": [float(x) for x in g.groups()] if g else None,  # before, se, after, se
        "pass@1": [float(x) for x in p.groups()] if p else None,
        "load_before": load_before,
        "load_after": load1(),
        "eta": eta_check(samples, wall),
        "bar_samples": len(samples),
    }


def fmt_eta(eta: dict) -> str:
    at = eta.get("at_25pct_of_wall")
    if not at:
        return "-"
    return f"{at['shown_left_s']:.0f} vs {at['real_left_s']:.0f} ({at['bar']})"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("--a", type=Path, default=None, help="the 'before' checkout (optional)")
    ap.add_argument("--b", type=Path, default=Path("."), help="the 'after' checkout [.]")
    ap.add_argument("--a-args", default="", help="extra demo arguments for A")
    ap.add_argument("--b-args", default="", help="extra demo arguments for B")
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated seeds [0,1,2]")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--burn", choices=["off", "on", "alternate"], default="off")
    ap.add_argument("--out", type=Path, default=None, help=OUT_HELP)
    args = ap.parse_args(argv)
    variants = [("B", args.b.resolve(), shlex.split(args.b_args))]
    if args.a is not None:
        variants.insert(0, ("A", args.a.resolve(), shlex.split(args.a_args)))
    runs = []
    for i, seed in enumerate(int(s) for s in args.seeds.split(",")):
        burn = args.burn == "on" or (args.burn == "alternate" and i % 2 == 1)
        order = variants if i % 2 == 0 else variants[::-1]
        for name, checkout, extra in order:
            r = run_demo(checkout, seed, args.threads, extra, burn)
            r["variant"] = name
            runs.append(r)
            print(
                f"{name} seed {seed} burn={burn}: {r['process_wall_s']:.1f} s "
                f"(demo {r['demo_wall_s']}, SFT {r['sft_s']}), greedy {r['greedy']}, "
                f"ETA at 25%: {fmt_eta(r['eta'])}, load {r['load_before']}-{r['load_after']}",
                flush=True,
            )
    print("\n| variant | seed | burn | process s | demo s | SFT s | greedy after SFT -> after RL "
          "| gain | ETA shown at 25% of wall vs real s left | load |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in runs:
        g = r["greedy"] or [float("nan")] * 4
        print(
            f"| {r['variant']} | {r['seed']} | {r['burn']} | {r['process_wall_s']:.1f} | "
            f"{r['demo_wall_s']} | {r['sft_s']} | {g[0]:.3f} ± {g[1]:.3f} -> {g[2]:.3f} ± "
            f"{g[3]:.3f} | {g[2] - g[0]:+.3f} | {fmt_eta(r['eta'])} | "
            f"{r['load_before']:.1f}-{r['load_after']:.1f} |"
        )
    if args.a is not None:
        for burn in sorted({r["burn"] for r in runs}):
            a = [r for r in runs if r["variant"] == "A" and r["burn"] == burn]
            b = [r for r in runs if r["variant"] == "B" and r["burn"] == burn]
            ratio = statistics.mean(x["process_wall_s"] for x in b) / statistics.mean(
                x["process_wall_s"] for x in a
            )
            print(f"burn={burn}: mean process wall B / A = {ratio:.2f}")
    out = args.out or dated_result("demo_time")
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {k: str(v) for k, v in vars(args).items()}
    out.write_text(json.dumps({"args": meta, "runs": runs}, indent=2))
    print(f"results: {out}")


if __name__ == "__main__":
    main()
