"""``gspo demo``: cold-start SFT, then RL on 2-digit addition, with before/after scores and a
plot. Running it again into the folder of an unfinished demo continues it (``--resume`` says so
explicitly) from the last checkpoint of SFT or of RL."""

from __future__ import annotations

import argparse
import json
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from gspo.config import ConfigError, SFTConfig, TrainConfig, build
from gspo.core.checkpoint_paths import latest_checkpoint

from .logs import quiet_transformers
from .rundir import claim_output_dir, exit_code, interrupted, stopped_line

DEMO_DEFAULTS: dict[str, Any] = {
    "algo": "gspo",
    "seed": 0,
    "sft_steps": 300,
    "steps": 100,
    "checkpoint_every": None,
}
"""The demo's settings (saved in ``demo.json``); ``--resume`` may change only steps and the
checkpoint cadence."""

SFT_STEP_COST = 1.3
"""An SFT step's time over an RL step's, for the demo bar's ETA: about 0.095 s (batch 256)
against 0.073 s (16 prompts x 8 samples, its share of the evaluations and set-up included) in
``gspo demo --threads 1`` at load ~2."""


def unfinished_demo(out: Path) -> bool:
    """``out`` holds a demo that started (its settings are saved) and did not finish."""
    return (out / "demo.json").is_file() and not (out / "summary.json").is_file()


def demo_settings(out: Path, args: argparse.Namespace) -> dict[str, Any]:
    given = {k: getattr(args, k) for k in DEMO_DEFAULTS if getattr(args, k) is not None}
    if not args.resume:
        return {**DEMO_DEFAULTS, **given}
    saved_file = out / "demo.json"
    if not saved_file.is_file():
        raise FileNotFoundError(f"--resume: no demo in {out} ({saved_file.name} is missing)")
    saved = json.loads(saved_file.read_text())
    other = [
        k for k, v in given.items() if k not in ("steps", "checkpoint_every") and saved[k] != v
    ]
    if other:
        listed = ", ".join(f"--{k.replace('_', '-')} {saved[k]!r} -> {given[k]!r}" for k in other)
        raise ConfigError(
            f"--resume continues the demo in {out}; {listed} would make a different run "
            "(only --steps and --checkpoint-every may change; --overwrite starts a new demo)"
        )
    return {**saved, **given}


def run_demo(args: argparse.Namespace) -> int:
    """Cold start, then RL, on the same held-out set; prints before/after and writes a plot.
    ``--resume`` continues from the last checkpoint, of SFT or of RL."""
    out = Path(args.output_dir)
    if not (args.resume or args.overwrite) and unfinished_demo(out):
        # Running the demo again after a kill continues it: the obvious thing to type again.
        print(f"continuing the unfinished demo in {out} (--overwrite starts a new one)")
        args.resume = True
    claim_output_dir(out, "demo", resume=args.resume, overwrite=args.overwrite)
    settings = demo_settings(out, args)
    if args.resume and (out / "summary.json").is_file():
        # A finished demo is left as it is: resuming it would only rewrite its summary.
        print(
            f"the demo in {out} is already finished (summary.json); nothing to do "
            "(--overwrite starts a new one)"
        )
        return 0
    out.mkdir(parents=True, exist_ok=True)
    (out / "demo.json").write_text(json.dumps(settings, indent=2))
    quiet_transformers()
    try:
        with _demo_bar(args, settings) as bar:
            return _demo_run(args, out, settings, bar)
    except KeyboardInterrupt as exc:  # a second Ctrl-C, or one outside a training loop
        done = (out / "sft.json").is_file()  # SFT finished: a resume goes on to RL
        return interrupted("demo", out, exc, run_dirs=[out / "rl", out / "sft"], resumable=done)


def _demo_bar(args: argparse.Namespace, settings: dict[str, Any]):
    """One progress bar for SFT and RL, whose ETA is the whole demo's (None: no bars)."""
    if not args.progress:
        return nullcontext(None)
    from gspo.orchestration.phases import Phase, PhasedBar  # loads tqdm

    phases = [
        Phase("SFT", settings["sft_steps"], SFT_STEP_COST),
        Phase(settings["algo"].upper(), settings["steps"], 1.0),
    ]
    return PhasedBar(phases, desc="demo")


def _demo_run(args: argparse.Namespace, out: Path, settings: dict[str, Any], bar) -> int:
    # Both load torch: the CLI stays torch-free until a run starts (every config is checked first).
    from gspo.compose.sft import run_sft
    from gspo.compose.train import train
    from gspo.interface.report import curve_table, eval_records, plot_run  # loads tqdm

    t0 = time.perf_counter()
    say = print if bar is None else bar.bar.write  # above the live bar
    seed, every = settings["seed"], settings["checkpoint_every"]
    common = dict(seed=seed, threads=args.threads, device="cpu", task="addition")
    common.update(progress=args.progress, **({"checkpoint_every": every} if every else {}))
    sft_cfg = build(
        SFTConfig,
        # n_test=0: the after-SFT scores come once, from RL's step-0 evaluation of the same
        # model on the same held-out set (a second sampled score would differ by sampling noise).
        overrides=dict(
            output_dir=str(out / "sft"),
            steps=settings["sft_steps"],
            max_new_tokens=6,
            n_test=0,
            **common,
        ),
    )
    say(f"[1/2] cold-start SFT: {sft_cfg.steps} steps on 2-digit addition demonstrations")
    sft_file = out / "sft.json"  # written once SFT is done: a resume goes straight to RL
    if args.resume and sft_file.is_file():
        sft_info = json.loads(sft_file.read_text())
        say(f"      done earlier, final loss {sft_info['final_loss']:.4f}")
        if bar is not None:
            bar.skip("SFT", sft_cfg.steps)
    else:
        found = latest_checkpoint(out / "sft") if args.resume else None
        if found is not None:
            say(f"      resuming from {found}")
        with bar.phase("SFT") if bar is not None else nullcontext():
            sft = run_sft(sft_cfg, resume=found is not None)
        if sft.interrupted is not None:
            step = len(sft.losses)
            say(stopped_line("demo", out, step, sft.checkpoint, sft.interrupted, "SFT "))
            return exit_code(sft.interrupted)
        sft_info = {"steps": sft_cfg.steps, "seconds": sft.seconds, "final_loss": sft.losses[-1]}
        sft_file.write_text(json.dumps(sft_info, indent=2))
        say(f"      done in {sft.seconds:.0f} s, final loss {sft.losses[-1]:.4f}")

    rl_cfg = build(
        TrainConfig,
        preset="demo",
        overrides=dict(
            output_dir=str(out / "rl"),
            model=str(out / "sft"),
            algo=settings["algo"],
            steps=settings["steps"],
            **common,
        ),
    )
    say(
        f"[2/2] {rl_cfg.loss.algo.upper()}: {rl_cfg.run.steps} steps x {rl_cfg.rollout.prompts_per_step} prompts x "
        f"{rl_cfg.rollout.group_size} samples, {rl_cfg.optim.num_minibatches} minibatches per rollout"
    )
    found = latest_checkpoint(out / "rl") if args.resume else None
    if found is not None:
        say(f"      resuming from {found}")
    with bar.phase(settings["algo"].upper()) if bar is not None else nullcontext():
        result = train(rl_cfg, resume=found is not None)
    if bar is not None:
        bar.close()  # the summary below is printed without a live bar
    if result.interrupted is not None:
        step = max(r["step"] for r in result.run_history)
        say(stopped_line("demo", out, step, result.checkpoint, result.interrupted, "RL "))
        return exit_code(result.interrupted)
    history = result.run_history  # from RL step 0 (its after-SFT scores), across resumes
    evals = eval_records(history)
    before, after = evals[0], evals[-1]
    plot = plot_run(
        history,
        out / "demo.png",
        title=f"{rl_cfg.loss.algo} on 2-digit addition (seed {seed})",
    )

    print(f"\nheld-out set: {int(before['eval/problems'])} problems never seen in training")
    print(f"| | after SFT (RL step 0) | after RL (step {after['step']}) |")
    print("|---|---|---|")
    for key, label in (
        ("eval/greedy_accuracy", "greedy accuracy"),
        ("eval/pass@1", "sampled pass@1"),
    ):
        se = key + "_se"
        print(
            f"| {label} | {before[key]:.3f} ± {before[se]:.3f} | {after[key]:.3f} ± {after[se]:.3f} |"
        )
    print("\ntraining curve:")
    print(curve_table(history))
    print(
        f"\nwall time {time.perf_counter() - t0:.0f} s; plot: {plot}; metrics: {out / 'rl' / 'metrics.jsonl'}"
    )
    summary = {
        "seed": seed,
        "algo": rl_cfg.loss.algo,
        "sft": sft_info,
        "before": before,
        "after": after,
        "seconds": time.perf_counter() - t0,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return 0
