"""Command line: gspo train, gspo sft, gspo demo, gspo eval, gspo compare, gspo report,
gspo algos.

Every config field is a flag (--clip-low 3e-4); --config FILE (YAML or JSON) and --preset NAME
set many at once. Precedence: defaults < preset < file < flags.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import fields
from typing import Any

from gspo.compose.resume import (
    RESUME_FIELDS,
    RunFinished,
    requested_values,
    resume_config,
    sft_resume_config,
)
from gspo.config import PRESETS, ConfigError, EvalConfig, SFTConfig, TrainConfig, build, field_docs
from gspo.config.fields import flat_fields
from gspo.config.train import SharedFields
from gspo.interface import algos

from .cli_parsers import (
    TRAIN_EVAL_DEFAULTS,
    Parser,
    add_eval_parser,
    add_log_level,
    name_flags,
    parse_bool,
)
from .compare import add_cli_parsers, run_cli
from .demo import DEMO_DEFAULTS, run_demo
from .logs import quiet_transformers, set_log_level
from .preflight import check_data, eval_overrides, preflight
from .rundir import OVERWRITE_HELP, claim_output_dir, exit_code, interrupted, stopped_line
from .serve import add_serve_parser, run_serve


def _help_groups(cls: type) -> list[tuple[str, list]]:
    """(title, fields) of each group of ``cls``'s flags: a composed config's parts (TrainConfig:
    run, model, task, ...), or a flat config's fields in one group (:func:`_help_order`)."""
    if cls is TrainConfig:
        return [(f"{f.name} options", list(fields(f.default_factory))) for f in fields(cls)]
    return [(f"{cls.__name__} fields", _help_order(cls))]


def _help_order(cls: type) -> list:
    """The fields of a flat ``cls`` in the README's order: run, model and task first
    (SharedFields), then the class's own, then the other groups (engine, episode limits) in
    their declared order."""
    bases = [b for b in cls.__mro__[1:] if "__dataclass_fields__" in vars(b)]
    shared = [b for b in bases if b is SharedFields]
    owners = [*shared, cls, *(b for b in bases if b is not SharedFields)]

    def owner(name: str) -> int:  # the class that declares the field
        return next(i for i, c in enumerate(owners) if name in vars(c).get("__annotations__", {}))

    listed = fields(cls)
    return sorted(listed, key=lambda f: (owner(f.name), listed.index(f)))


def _add_config_flags(parser: argparse.ArgumentParser, cls: type) -> None:
    docs = field_docs(cls)
    for title, listed in _help_groups(cls):
        _add_flags(parser.add_argument_group(title), listed, docs)
    parser.add_argument("--config", help="YAML or JSON file of config fields")
    parser.add_argument("--preset", help=f"named preset: {', '.join(PRESETS)}")
    add_log_level(parser)


def _add_flags(group: Any, listed: list, docs: dict[str, str]) -> None:
    for f in listed:
        if f.name == "plugins":  # a list: one --plugin NAME per module
            group.add_argument(
                "--plugin",
                dest="plugins",
                action="append",
                default=argparse.SUPPRESS,
                metavar="MODULE",
                help=f"{docs[f.name]} [none]",
            )
            continue
        flag = "--" + f.name.replace("_", "-")
        default = f.default
        group.add_argument(
            flag,
            dest=f.name,
            default=argparse.SUPPRESS,
            metavar="V",
            help=f"{docs[f.name]} [{default}]",
        )


def _typed(args: argparse.Namespace) -> set[str]:
    """The config fields given as flags on the command line (their flags default to nothing:
    a name in ``args`` was typed). ``gspo demo``'s own flags are not config fields."""
    if args.command not in ("train", "sft", "eval", "compare", "report"):
        return set()
    names = {name for cls in (TrainConfig, SFTConfig, EvalConfig) for name in flat_fields(cls)}
    return names & set(vars(args))


def _overrides(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    names = flat_fields(cls)
    return {k: v for k, v in vars(args).items() if k in names}


def _version() -> str:
    """The installed distribution's version (its metadata: nothing of gspo is imported)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gspo")
    except PackageNotFoundError:  # run from a source tree without an install
        return "(not installed)"


def _parser() -> argparse.ArgumentParser:
    # Only config modules load here: help and argument errors come before torch is imported.
    parser = Parser(
        prog="gspo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"gspo {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    p_train = _add_run_parser(
        sub,
        "train",
        TrainConfig,
        "run RL (GRPO, GSPO, GSPO-token, LUSPO)",
        "continue the run in --output-dir from its latest checkpoint, with the config saved "
        f"there; other flags may change only {RESUME_FIELDS}. Ctrl-C (or SIGTERM) stops a run "
        "after the current step with a checkpoint and prints this command",
    )
    p_train.add_argument("--algo-help", action="store_true", help=argparse.SUPPRESS)
    _add_run_parser(
        sub,
        "sft",
        SFTConfig,
        "supervised cold start on a task's demonstrations",
        "continue the unfinished SFT in --output-dir from its latest checkpoint, with the "
        "config saved there (flags may change only steps, checkpoint_every, progress, threads)",
    )

    p_demo = sub.add_parser(
        "demo", help="cold-start SFT then RL on 2-digit addition, with a summary and a plot"
    )
    # None: not given (a resumed demo keeps its own settings; fresh ones get the defaults).
    p_demo.add_argument("--algo", default=None, help="a registered loss (gspo algos) [gspo]")
    p_demo.add_argument("--seed", type=int, default=None, help="[0]")
    p_demo.add_argument("--output-dir", default="runs/demo")
    sft_steps, rl_steps = DEMO_DEFAULTS["sft_steps"], DEMO_DEFAULTS["steps"]
    p_demo.add_argument(
        "--sft-steps", type=int, default=None, help=f"cold-start SFT steps [{sft_steps}]"
    )
    p_demo.add_argument("--steps", type=int, default=None, help=f"RL steps [{rl_steps}]")
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
        "saved settings (--steps may change); running an unfinished demo again does the same. "
        "Ctrl-C stops after a step with a checkpoint",
    )
    p_demo.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    p_demo.add_argument(
        "--threads", type=int, default=0, help="torch CPU threads (0: torch's default)"
    )
    p_demo.add_argument(
        "--progress", type=parse_bool, default=True, metavar="V", help="live progress bars [True]"
    )
    add_log_level(p_demo)

    algos.add_parser(sub)

    add_cli_parsers(sub, _add_config_flags)
    add_eval_parser(sub, _add_config_flags)  # gspo eval
    add_serve_parser(sub)  # gspo serve
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    set_log_level(getattr(args, "log_level", "error"))
    try:
        preflight(args, _overrides)  # configs, machine, data: before torch or a model loads
        if args.command == "train":
            return _train(args)
        if args.command == "sft":
            return _sft(args)
        if args.command == "demo":
            return run_demo(args)
        if args.command == "algos":
            return algos.run(args)
        if args.command == "eval":
            quiet_transformers()
            return run_eval_cli(args, _overrides)
        if args.command in ("compare", "report"):
            return run_cli(args, _overrides)
        if args.command == "serve":
            return run_serve(args)
    except RunFinished as exc:  # --resume of a finished run: nothing changes
        print(f"gspo {args.command}: {exc}")
        return 0
    except ConfigError as exc:
        print(f"gspo {args.command}: {name_flags(str(exc), _typed(args))}", file=sys.stderr)
        return 2
    except (FileNotFoundError, PermissionError, IsADirectoryError, ValueError) as exc:
        print(f"gspo {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except (ImportError, RuntimeError) as exc:
        # What the preflight could not see (a --resume run's config is read from its checkpoint
        # later): a missing extra, whose message names the pip command, or CUDA asked for
        # without one (gspo.models.policy.resolve_device). Other errors keep their traceback.
        if "pip install" in str(exc) or "sees no CUDA device" in str(exc):
            print(f"gspo {args.command}: error: {exc}", file=sys.stderr)
            return 2
        if isinstance(exc, ImportError):
            raise
        # Both load torch (the CLI is torch-free until a run starts): only after a failed run.
        from gspo.backend.ray_backend import WorkerLostError
        from gspo.orchestration.loop import NonFiniteTrainingError

        if not isinstance(exc, (NonFiniteTrainingError, WorkerLostError)):
            raise
        print(f"gspo {args.command}: stopped: {exc}", file=sys.stderr)
        return 3
    return 1


def _output_dir(args: argparse.Namespace, overrides: dict[str, Any], cls: type) -> str:
    """The output folder the command line asks for (flag > config file > preset > default),
    read without building the config: building it validates fields and imports torch."""
    requested = requested_values(args.preset, args.config, overrides)
    return str(requested.get("output_dir", flat_fields(cls)["output_dir"].default))


def _run_config(args: argparse.Namespace, cls: type, resumed: Callable[..., Any]) -> Any:
    """The config of a ``gspo train`` or ``gspo sft`` run (``cls``), its output folder claimed
    before torch loads (one run per folder: refuse, or move the earlier run aside). A resume
    is ``resumed(output_dir, overrides)``: the run's saved config with the safe changes asked
    for (``overrides``: the flags')."""
    overrides = _overrides(args, cls)
    out = _output_dir(args, overrides, cls)
    claim_output_dir(out, args.command, resume=args.resume, overwrite=args.overwrite)
    if args.resume:
        cfg = resumed(out, overrides)
    else:
        cfg = build(cls, preset=args.preset, file=args.config, overrides=overrides)
    quiet_transformers()
    return cfg


def _add_run_parser(
    sub: Any, name: str, cls: type, summary: str, resume_help: str
) -> argparse.ArgumentParser:
    """``gspo train`` or ``gspo sft``: the flags of its config ``cls``, --resume, --overwrite."""
    p = sub.add_parser(name, help=summary, epilog=TRAIN_EVAL_DEFAULTS)
    _add_config_flags(p, cls)
    p.add_argument("--resume", action="store_true", help=resume_help)
    p.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)
    return p


def _train(args: argparse.Namespace) -> int:
    def resumed(out: str, overrides: dict[str, Any]) -> TrainConfig:
        # What the preset and config file say counts as asked for too.
        return resume_config(out, requested_values(args.preset, args.config, overrides))

    cfg = _run_config(args, TrainConfig, resumed)
    # Loads torch: the CLI stays torch-free until a run starts.
    from gspo.compose.train import train
    from gspo.interface.report import curve_table, plot_run  # as train, only for a run

    try:
        result = train(cfg, resume=args.resume)
    except KeyboardInterrupt as exc:  # a second Ctrl-C, or one before the first step
        return interrupted("train", cfg.run.output_dir, exc)
    out = result.output_dir
    history = result.run_history  # from step 0, across resumes
    plot = plot_run(history, out / "curves.png", title=f"{cfg.loss.algo} on {cfg.task.task}")
    print(curve_table(history))
    if result.final_eval:
        print(eval_label(history, result.interrupted is not None))
        print(json.dumps(result.final_eval, indent=2))
    print(f"metrics: {out / 'metrics.jsonl'}\nplot: {plot}")
    if result.interrupted is not None:
        step = max((r["step"] for r in history), default=0)
        line = stopped_line(
            "train", cfg.run.output_dir, step, result.checkpoint, result.interrupted
        )
        print(line, file=sys.stderr)
        return exit_code(result.interrupted)
    return 0


def eval_label(history: list[dict[str, Any]], stopped: bool) -> str:
    """The line above the printed evaluation: its step, and whether a stop came before the end
    (after Ctrl-C the latest evaluation may be step 0's, the model before any training)."""
    step = max((r["step"] for r in history if any(k.startswith("eval/") for k in r)), default=0)
    why = " (the latest before the run was stopped)" if stopped else ""
    return f"held-out evaluation at step {step}{why}:"


def _sft(args: argparse.Namespace) -> int:
    cfg = _run_config(args, SFTConfig, sft_resume_config)
    # Loads torch: the CLI stays torch-free until a run starts.
    from gspo.compose.sft import run_sft

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


def run_eval_cli(args: Any, overrides: Any) -> int:
    """``gspo eval``: build the config from the flags, run, print a summary."""
    given = eval_overrides(args, overrides(args, EvalConfig), echo=_stderr)
    cfg = build(EvalConfig, preset=args.preset, file=args.config, overrides=given)
    check_data(cfg)  # every bad row at once, before torch and the model
    # Loads torch: the CLI stays torch-free until a run starts.
    from gspo.compose.evaluate import evaluate

    report = evaluate(cfg)
    m = report["metrics"]
    given = f"completions {cfg.completions_key!r}" if cfg.completions_key else None
    print(f"{report['data']}: {int(m['problems'])} problems, {given or f'model {cfg.model}'}")
    rows = [("greedy accuracy", "greedy_accuracy"), ("greedy success", "success")]
    rows += [("given reward", "given_reward"), ("given solved", "given_solved")]
    if cfg.samples > 0 and not given:
        rows += [
            ("sampled success", "sampled_success"),  # multi-turn environments
            (f"avg@{cfg.samples}", f"avg@{cfg.samples}"),
            (f"pass@{cfg.samples}", f"pass@{cfg.samples}"),
        ]
    for label, key in rows:
        if key in m:
            print(f"  {label:16s} {m[key]:.3f} ± {m[key + '_se']:.3f}")
    for label, key in (
        ("greedy length", "greedy_response_length"),
        ("sampled length", "response_length"),
        ("greedy truncated", "greedy_truncated_fraction"),
        ("greedy turns", "turns_mean"),  # multi-turn environments
        ("sampled truncated", "truncated_fraction"),
    ):
        if key in m:
            print(f"  {label:16s} {m[key]:.3g}")
    print(
        f"  time {report['seconds']['total']:.0f} s"
        + (f"; report: {cfg.output}" if cfg.output else "")
    )
    return 0


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
