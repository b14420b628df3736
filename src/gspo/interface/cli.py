"""Command line: ``gspo train``, ``gspo sft``, ``gspo demo``, ``gspo eval``, ``gspo compare``,
``gspo report``, ``gspo algos``.

Every config field is a flag (``--clip-low 3e-4``); ``--config FILE`` (YAML or JSON) and
``--preset NAME`` set many at once. Precedence: defaults < preset < file < flags.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import fields
from pathlib import Path
from typing import Any

from gspo.config import PRESETS, ConfigError, SFTConfig, TrainConfig, build, field_docs

from .cli_parsers import TRAIN_EVAL_DEFAULTS, Parser, add_eval_parser, parse_bool
from .rundir import OVERWRITE_HELP, claim_output_dir, exit_code, interrupted, stopped_line


def _add_config_flags(parser: argparse.ArgumentParser, cls: type) -> None:
    docs = field_docs(cls)
    group = parser.add_argument_group(f"{cls.__name__} fields")
    for f in fields(cls):
        flag = "--" + f.name.replace("_", "-")
        default = f.default
        group.add_argument(
            flag,
            dest=f.name,
            default=argparse.SUPPRESS,
            metavar="V",
            help=f"{docs[f.name]} [{default}]",
        )
    parser.add_argument("--config", help="YAML or JSON file of config fields")
    parser.add_argument("--preset", help=f"named preset: {', '.join(PRESETS)}")


def _overrides(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in vars(args).items() if k in names}


def _parser() -> argparse.ArgumentParser:
    # Only config modules load here: help and argument errors come before torch is imported.
    parser = Parser(
        prog="gspo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p_train = sub.add_parser(
        "train", help="run RL (GRPO, GSPO, GSPO-token, LUSPO)", epilog=TRAIN_EVAL_DEFAULTS
    )
    _add_config_flags(p_train, TrainConfig)
    p_train.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --output-dir from its latest checkpoint, with the config saved "
        "there; other flags may change only steps, stop_after, eval/checkpoint cadence, "
        "keep_checkpoints, max_bad_steps, logging, progress and threads. Ctrl-C (or SIGTERM) "
        "stops a run after the current step with a checkpoint and prints this command",
    )
    p_train.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    p_train.add_argument("--algo-help", action="store_true", help=argparse.SUPPRESS)

    p_sft = sub.add_parser(
        "sft", help="supervised cold start on a task's demonstrations", epilog=TRAIN_EVAL_DEFAULTS
    )
    _add_config_flags(p_sft, SFTConfig)
    p_sft.add_argument(
        "--resume",
        action="store_true",
        help="continue the unfinished SFT in --output-dir from its latest checkpoint, with the "
        "config saved there (flags may change only steps, checkpoint_every, progress, threads)",
    )
    p_sft.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)

    p_demo = sub.add_parser(
        "demo", help="cold-start SFT then RL on 2-digit addition, with a summary and a plot"
    )
    # None: not given (a resumed demo keeps its own settings; fresh ones get the defaults).
    p_demo.add_argument("--algo", default=None, help="a registered loss (gspo algos) [gspo]")
    p_demo.add_argument("--seed", type=int, default=None, help="[0]")
    p_demo.add_argument("--output-dir", default="runs/demo")
    p_demo.add_argument("--sft-steps", type=int, default=None, help="cold-start SFT steps [300]")
    p_demo.add_argument("--steps", type=int, default=None, help="RL steps [800]")
    p_demo.add_argument(
        "--checkpoint-every",
        type=int,
        default=None,
        help="checkpoint SFT and RL every N steps [SFT 50, RL the demo preset's]",
    )
    p_demo.add_argument(
        "--resume",
        action="store_true",
        help="continue the demo in --output-dir from its last checkpoint (SFT or RL) with its "
        "saved settings (--steps may change). Ctrl-C stops after a step with a checkpoint",
    )
    p_demo.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    p_demo.add_argument(
        "--threads", type=int, default=0, help="torch CPU threads (0: torch's default)"
    )
    p_demo.add_argument(
        "--progress", type=parse_bool, default=True, metavar="V", help="live progress bars [True]"
    )

    from gspo import algos  # gspo algos

    algos.add_parser(sub)
    from .compare import add_cli_parsers  # gspo compare, gspo report

    add_cli_parsers(sub, _add_config_flags)
    add_eval_parser(sub, _add_config_flags)  # gspo eval
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "train":
            return _train(args)
        if args.command == "sft":
            return _sft(args)
        if args.command == "demo":
            return _demo(args)
        if args.command == "algos":
            from gspo.algos import run

            return run(args)
        if args.command == "eval":
            from .evaluate import run_eval_cli

            _quiet_transformers()
            return run_eval_cli(args, _overrides)
        if args.command in ("compare", "report"):
            from .compare import run_cli

            return run_cli(args, _overrides)
    except ConfigError as exc:
        print(f"gspo {args.command}: {exc}", file=sys.stderr)
        return 2
    except (FileNotFoundError, PermissionError, ValueError) as exc:
        print(f"gspo {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        from gspo.backend.ray_backend import WorkerLostError
        from gspo.trainer import NonFiniteTrainingError

        if not isinstance(exc, (NonFiniteTrainingError, WorkerLostError)):
            raise
        print(f"gspo {args.command}: stopped: {exc}", file=sys.stderr)
        return 3
    return 1


def _quiet_transformers() -> None:
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def _output_dir(args: argparse.Namespace, overrides: dict[str, Any], cls: type) -> str:
    """The output folder the command line asks for (flag > config file > preset > default),
    read without building the config: building it validates fields and imports torch."""
    from .resume import requested_values

    requested = requested_values(args.preset, args.config, overrides)
    return str(requested.get("output_dir", cls.output_dir))


def _train(args: argparse.Namespace) -> int:
    overrides = _overrides(args, TrainConfig)
    # Before torch loads: one run per folder (refuse, or move the earlier run aside).
    claim_output_dir(
        _output_dir(args, overrides, TrainConfig),
        "train",
        resume=args.resume,
        overwrite=args.overwrite,
    )
    if args.resume:  # the run's saved config, with the safe changes the flags ask for
        from .resume import requested_values, resume_config

        requested = requested_values(args.preset, args.config, overrides)
        out_dir = requested.get("output_dir", TrainConfig.output_dir)
        cfg = resume_config(out_dir, requested)
    else:
        cfg = build(TrainConfig, preset=args.preset, file=args.config, overrides=overrides)
    _quiet_transformers()
    from gspo.interface.report import curve_table, plot_run
    from gspo.trainer import train

    try:
        result = train(cfg, resume=args.resume)
    except KeyboardInterrupt as exc:  # a second Ctrl-C, or one before the first step
        return interrupted("train", cfg.output_dir, exc)
    out = result.output_dir
    history = result.run_history  # from step 0, across resumes
    plot = plot_run(history, out / "curves.png", title=f"{cfg.algo} on {cfg.task}")
    print(curve_table(history))
    if result.final_eval:
        print(json.dumps(result.final_eval, indent=2))
    print(f"metrics: {out / 'metrics.jsonl'}\nplot: {plot}")
    if result.interrupted is not None:
        step = max((r["step"] for r in history), default=0)
        line = stopped_line("train", cfg.output_dir, step, result.checkpoint, result.interrupted)
        print(line, file=sys.stderr)
        return exit_code(result.interrupted)
    return 0


def _sft(args: argparse.Namespace) -> int:
    overrides = _overrides(args, SFTConfig)
    out = _output_dir(args, overrides, SFTConfig)
    claim_output_dir(out, "sft", resume=args.resume, overwrite=args.overwrite)
    if args.resume:  # the saved config, with the changes sft_resume_config allows
        from .resume import sft_resume_config

        cfg = sft_resume_config(out, overrides)
    else:
        cfg = build(SFTConfig, preset=args.preset, file=args.config, overrides=overrides)
    _quiet_transformers()
    from gspo.sft import run_sft

    try:
        result = run_sft(cfg, resume=args.resume)
    except KeyboardInterrupt as exc:
        return interrupted("sft", cfg.output_dir, exc)
    if result.interrupted is not None:
        line = stopped_line(
            "sft", cfg.output_dir, len(result.losses), result.checkpoint, result.interrupted
        )
        print(line, file=sys.stderr)
        return exit_code(result.interrupted)
    print(f"sft: {cfg.steps} steps in {result.seconds:.1f} s, final loss {result.losses[-1]:.4f}")
    if result.eval:
        print(
            f"held-out greedy accuracy {result.eval['greedy_accuracy']:.3f} "
            f"± {result.eval['greedy_accuracy_se']:.3f}, sampled pass@1 {result.eval['pass@1']:.3f}"
        )
    print(f"model: {result.output_dir}")
    return 0


DEMO_DEFAULTS: dict[str, Any] = {
    "algo": "gspo",
    "seed": 0,
    "sft_steps": 300,
    "steps": 800,
    "checkpoint_every": None,
}
"""The demo's settings (saved in ``demo.json``); ``--resume`` may change only steps and the
checkpoint cadence."""


def _demo_settings(out: Path, args: argparse.Namespace) -> dict[str, Any]:
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
            "(only --steps and --checkpoint-every may change)"
        )
    return {**saved, **given}


def _demo(args: argparse.Namespace) -> int:
    """Cold start, then RL, on the same held-out set; prints before/after and writes a plot.
    ``--resume`` continues from the last checkpoint, of SFT or of RL."""
    out = Path(args.output_dir)
    claim_output_dir(out, "demo", resume=args.resume, overwrite=args.overwrite)
    settings = _demo_settings(out, args)
    out.mkdir(parents=True, exist_ok=True)
    (out / "demo.json").write_text(json.dumps(settings, indent=2))
    _quiet_transformers()
    try:
        return _demo_run(args, out, settings)
    except KeyboardInterrupt as exc:  # a second Ctrl-C, or one outside a training loop
        done = (out / "sft.json").is_file()  # SFT finished: a resume goes on to RL
        return interrupted("demo", out, exc, run_dirs=[out / "rl", out / "sft"], resumable=done)


def _demo_run(args: argparse.Namespace, out: Path, settings: dict[str, Any]) -> int:
    from gspo.backend.checkpoint import latest_checkpoint
    from gspo.interface.report import curve_table, eval_records, plot_run
    from gspo.sft import run_sft
    from gspo.trainer import train

    t0 = time.perf_counter()
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
    print(f"[1/2] cold-start SFT: {sft_cfg.steps} steps on 2-digit addition demonstrations")
    sft_file = out / "sft.json"  # written once SFT is done: a resume goes straight to RL
    if args.resume and sft_file.is_file():
        sft_info = json.loads(sft_file.read_text())
        print(f"      done earlier, final loss {sft_info['final_loss']:.4f}")
    else:
        found = latest_checkpoint(out / "sft") if args.resume else None
        if found is not None:
            print(f"      resuming from {found}")
        sft = run_sft(sft_cfg, resume=found is not None)
        if sft.interrupted is not None:
            step = len(sft.losses)
            print(stopped_line("demo", out, step, sft.checkpoint, sft.interrupted, "SFT "))
            return exit_code(sft.interrupted)
        sft_info = {"steps": sft_cfg.steps, "seconds": sft.seconds, "final_loss": sft.losses[-1]}
        sft_file.write_text(json.dumps(sft_info, indent=2))
        print(f"      done in {sft.seconds:.0f} s, final loss {sft.losses[-1]:.4f}")

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
    print(
        f"[2/2] {rl_cfg.algo.upper()}: {rl_cfg.steps} steps x {rl_cfg.prompts_per_step} prompts x "
        f"{rl_cfg.group_size} samples, {rl_cfg.num_minibatches} minibatches per rollout"
    )
    found = latest_checkpoint(out / "rl") if args.resume else None
    if found is not None:
        print(f"      resuming from {found}")
    result = train(rl_cfg, resume=found is not None)
    if result.interrupted is not None:
        step = max(r["step"] for r in result.run_history)
        print(stopped_line("demo", out, step, result.checkpoint, result.interrupted, "RL "))
        return exit_code(result.interrupted)
    history = result.run_history  # from RL step 0 (its after-SFT scores), across resumes
    evals = eval_records(history)
    before, after = evals[0], evals[-1]
    plot = plot_run(
        history,
        out / "demo.png",
        title=f"{rl_cfg.algo} on 2-digit addition (seed {seed})",
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
        "algo": rl_cfg.algo,
        "sft": sft_info,
        "before": before,
        "after": after,
        "seconds": time.perf_counter() - t0,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
