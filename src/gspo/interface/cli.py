"""Command line: gspo train, gspo sft, gspo demo, gspo eval, gspo compare, gspo report,
gspo algos.

Every config field is a flag (--clip-low 3e-4); --config FILE (YAML or JSON) and --preset NAME
set many at once. Precedence: defaults < preset < file < flags.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
import warnings
from dataclasses import fields
from pathlib import Path
from typing import Any

from gspo.config import PRESETS, ConfigError, SFTConfig, TrainConfig, build, field_docs

from .cli_parsers import TRAIN_EVAL_DEFAULTS, Parser, add_eval_parser, add_log_level, parse_bool


def _help_order(cls: type) -> list:
    """The fields of ``cls`` in the README's order: run, model and task first (SharedFields),
    then the class's own, then the other mixins (engine, Ray, async) in their declared order.
    The dataclass order is the reverse: a TrainConfig's async and Ray fields came first."""
    from gspo.config.fields import SharedFields

    bases = [b for b in cls.__mro__[1:] if "__dataclass_fields__" in vars(b)]
    shared = [b for b in bases if b is SharedFields]
    owners = [*shared, cls, *(b for b in bases if b is not SharedFields)]

    def owner(name: str) -> int:  # the class that declares the field
        return next(i for i, c in enumerate(owners) if name in vars(c).get("__annotations__", {}))

    listed = fields(cls)
    return sorted(listed, key=lambda f: (owner(f.name), listed.index(f)))


def _add_config_flags(parser: argparse.ArgumentParser, cls: type) -> None:
    docs = field_docs(cls)
    group = parser.add_argument_group(f"{cls.__name__} fields")
    for f in _help_order(cls):
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
    add_log_level(parser)


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
    from .resume import RESUME_FIELDS  # torch-free: gspo.config only

    p_train.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --output-dir from its latest checkpoint, with the config saved "
        f"there; other flags may change only {RESUME_FIELDS}",
    )
    p_train.add_argument("--algo-help", action="store_true", help=argparse.SUPPRESS)

    p_sft = sub.add_parser(
        "sft", help="supervised cold start on a task's demonstrations", epilog=TRAIN_EVAL_DEFAULTS
    )
    _add_config_flags(p_sft, SFTConfig)

    p_demo = sub.add_parser(
        "demo", help="cold-start SFT then RL on 2-digit addition, with a summary and a plot"
    )
    p_demo.add_argument("--algo", default="gspo", help="a registered loss (gspo algos) [gspo]")
    p_demo.add_argument("--seed", type=int, default=0)
    p_demo.add_argument("--output-dir", default="runs/demo")
    p_demo.add_argument("--sft-steps", type=int, default=300, help="cold-start SFT steps [300]")
    p_demo.add_argument("--steps", type=int, default=800, help="RL steps [800]")
    p_demo.add_argument(
        "--threads", type=int, default=0, help="torch CPU threads (0: torch's default)"
    )
    p_demo.add_argument(
        "--progress", type=parse_bool, default=True, metavar="V", help="live progress bars [True]"
    )
    add_log_level(p_demo)

    from gspo import algos  # gspo algos

    algos.add_parser(sub)
    from .compare import add_cli_parsers  # gspo compare, gspo report

    add_cli_parsers(sub, _add_config_flags)
    add_eval_parser(sub, _add_config_flags)  # gspo eval
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    _set_log_level(getattr(args, "log_level", "error"))
    try:
        _preflight(args)  # config and machine checks: before torch, a model or any data loads
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
    except (FileNotFoundError, PermissionError, IsADirectoryError, ValueError) as exc:
        print(f"gspo {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except (ImportError, RuntimeError) as exc:
        # What the preflight could not see (a --resume run's config is read from its checkpoint
        # later): a missing extra, whose message names the pip command, or CUDA asked for
        # without one (gspo.models.build.resolve_device). Other errors keep their traceback.
        if "pip install" in str(exc) or "sees no CUDA device" in str(exc):
            print(f"gspo {args.command}: error: {exc}", file=sys.stderr)
            return 2
        if isinstance(exc, ImportError):
            raise
        from gspo.backend.ray_backend import WorkerLostError
        from gspo.trainer import NonFiniteTrainingError

        if not isinstance(exc, (NonFiniteTrainingError, WorkerLostError)):
            raise
        print(f"gspo {args.command}: stopped: {exc}", file=sys.stderr)
        return 3
    return 1


def _preflight(args: argparse.Namespace) -> None:
    """Build and check the configs a command will run (cheap: plain dataclasses, torch-free
    registries) and what they need from the machine (extras installed, CUDA present), so every
    such mistake is reported at once, before the command's slow imports and work. The command
    builds its config again when it runs; ``--resume`` configs come from the run folder and are
    checked there."""
    from gspo.config import EvalConfig
    from gspo.config.machine import machine_problems
    from gspo.config.validation import config_error

    if args.command in ("train", "sft", "eval"):
        if getattr(args, "resume", False):
            return
        cls = {"train": TrainConfig, "sft": SFTConfig, "eval": EvalConfig}[args.command]
        cfgs = [build(cls, preset=args.preset, file=args.config, overrides=_overrides(args, cls))]
    elif args.command == "demo":  # its RL config must be valid before the 300-step SFT runs
        common = dict(seed=args.seed, threads=args.threads, device="cpu", task="addition")
        cfgs = [
            build(SFTConfig, overrides=dict(steps=args.sft_steps, n_test=0, **common)),
            build(
                TrainConfig,
                preset="demo",
                overrides=dict(algo=args.algo, steps=args.steps, **common),
            ),
        ]
    else:
        return
    problems = [p for cfg in cfgs for p in machine_problems(cfg)]
    if problems:
        raise config_error(list(dict.fromkeys(problems)), header="cannot start")


def _set_log_level(level: str) -> None:
    """How much the libraries underneath print. Set through their environment variables, which
    they read when imported (before any of them is) and which reach their worker processes:
    at the default, error, vLLM's INFO lines and warnings (with the traceback it logs when it
    skips a warm-up) and datasets' "Generating train split" bars stay hidden; --log-level
    warning, info or debug shows them. The default leaves variables the user set alone."""
    import logging

    quiet = level == "error"
    values = {
        "VLLM_LOGGING_LEVEL": level.upper(),
        "TRANSFORMERS_VERBOSITY": level,
        "DATASETS_VERBOSITY": level,
        "HF_DATASETS_DISABLE_PROGRESS_BARS": "0" if level in ("info", "debug") else "1",
    }
    for name, value in values.items():
        if quiet:
            os.environ.setdefault(name, value)
        else:
            os.environ[name] = value
    # vLLM logs a few warnings before its own logging is set up ("Triton is installed, but
    # doesn't include CPU backend"), and some of its modules warn through Python's warnings.
    with contextlib.suppress(ValueError):  # a level name logging does not know: vLLM's to say
        logging.getLogger("vllm").setLevel(os.environ["VLLM_LOGGING_LEVEL"].upper())
    if quiet:
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"vllm\.")
    if level in ("info", "debug"):  # Python's own last-resort handler shows warnings only
        logging.basicConfig(level=level.upper())


def _quiet_transformers() -> None:
    """transformers' warnings and progress bars off, unless --log-level asks for them."""
    if os.environ.get("TRANSFORMERS_VERBOSITY") in ("warning", "info", "debug"):
        return  # transformers read that level when it was imported
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def _train(args: argparse.Namespace) -> int:
    overrides = _overrides(args, TrainConfig)
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

    result = train(cfg, resume=args.resume)
    out = result.output_dir
    plot = plot_run(result.history, out / "curves.png", title=f"{cfg.algo} on {cfg.task}")
    print(curve_table(result.history))
    if result.final_eval:
        print(json.dumps(result.final_eval, indent=2))
    print(f"metrics: {out / 'metrics.jsonl'}\nplot: {plot}")
    return 0


def _sft(args: argparse.Namespace) -> int:
    cfg = build(
        SFTConfig, preset=args.preset, file=args.config, overrides=_overrides(args, SFTConfig)
    )
    _quiet_transformers()
    from gspo.sft import run_sft

    result = run_sft(cfg)
    print(f"sft: {cfg.steps} steps in {result.seconds:.1f} s, final loss {result.losses[-1]:.4f}")
    if result.eval:
        print(
            f"held-out greedy accuracy {result.eval['greedy_accuracy']:.3f} "
            f"± {result.eval['greedy_accuracy_se']:.3f}, sampled pass@1 {result.eval['pass@1']:.3f}"
        )
    print(f"model: {result.output_dir}")
    return 0


def _demo(args: argparse.Namespace) -> int:
    """Cold start, then RL, on the same held-out set; prints before/after and writes a plot."""
    _quiet_transformers()
    from gspo.interface.report import curve_table, eval_records, plot_run
    from gspo.sft import run_sft
    from gspo.trainer import train

    out = Path(args.output_dir)
    progress = args.progress
    t0 = time.perf_counter()
    common = dict(
        seed=args.seed, threads=args.threads, device="cpu", task="addition", progress=progress
    )
    sft_cfg = build(
        SFTConfig,
        # n_test=0: the after-SFT scores come once, from RL's step-0 evaluation of the same
        # model on the same held-out set (a second sampled score would differ by sampling noise).
        overrides=dict(
            output_dir=str(out / "sft"), steps=args.sft_steps, max_new_tokens=6, n_test=0, **common
        ),
    )
    print(f"[1/2] cold-start SFT: {sft_cfg.steps} steps on 2-digit addition demonstrations")
    sft = run_sft(sft_cfg)
    print(f"      done in {sft.seconds:.0f} s, final loss {sft.losses[-1]:.4f}")

    rl_cfg = build(
        TrainConfig,
        preset="demo",
        overrides=dict(
            output_dir=str(out / "rl"),
            model=str(out / "sft"),
            algo=args.algo,
            steps=args.steps,
            **common,
        ),
    )
    print(
        f"[2/2] {rl_cfg.algo.upper()}: {rl_cfg.steps} steps x {rl_cfg.prompts_per_step} prompts x "
        f"{rl_cfg.group_size} samples, {rl_cfg.num_minibatches} minibatches per rollout"
    )
    result = train(rl_cfg)
    evals = eval_records(result.history)
    before, after = evals[0], evals[-1]
    plot = plot_run(
        result.history,
        out / "demo.png",
        title=f"{rl_cfg.algo} on 2-digit addition (seed {args.seed})",
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
    print(curve_table(result.history))
    print(
        f"\nwall time {time.perf_counter() - t0:.0f} s; plot: {plot}; metrics: {out / 'rl' / 'metrics.jsonl'}"
    )
    summary = {
        "seed": args.seed,
        "algo": rl_cfg.algo,
        "sft": {"steps": sft_cfg.steps, "seconds": sft.seconds, "final_loss": sft.losses[-1]},
        "before": before,
        "after": after,
        "seconds": time.perf_counter() - t0,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
