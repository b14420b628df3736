"""Side-by-side runs: several algorithms x several seeds with identical data, init and budget.

``run_compare(*plan(["grpo", "gspo", "luspo"], [0, 1, 2], out), out)`` runs every (algorithm,
seed) pair with one shared training config that differs only in ``algo`` and ``seed``. The trainer draws the
data order, sampling and minibatch shuffles from ``seed`` alone, so runs of one seed see the
same prompts in the same order. The starting model is shared too: with ``sft_steps > 0`` a
cold-start SFT runs once per seed (``<out>/sft/seed<k>``) and every algorithm of that seed starts
from it; otherwise ``model`` (a checkpoint directory, or ``tiny`` whose random init follows the
seed) is used by all. The report (:func:`gspo.interface.report.build_report`) goes to ``<out>/report``.

Finished runs whose saved config equals the requested one are reused, not rerun, so an
interrupted comparison continues where it stopped.

Clip ranges: each algorithm keeps its own paper default unless ``clip_low`` / ``clip_high`` are
set, which then apply to all of them (token and sequence ratios live on scales orders of
magnitude apart, so a warning is printed when they are set for a mix of ratio levels).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from gspo.compose.resume import requested_values
from gspo.config import ConfigError, SFTConfig, TrainConfig, build, coerce, to_dict
from gspo.config.names import did_you_mean, losses
from gspo.config.plugins import load_plugins
from gspo.interface.logs import quiet_transformers

NOT_SHARED_WITH_SFT = frozenset(
    {"output_dir", "steps", "lr", "warmup_steps", "model", "checkpoint_every"}
)
"""Fields the per-seed cold start does not copy from the RL config; it copies every other field
the two configs share (task, data, model shape, seed, device ...), so SFT sees the RL run's task
and model."""


@dataclass
class CompareResult:
    output_dir: Path
    run_dirs: list[Path]
    sft_dirs: dict[int, Path]
    report_dir: Path
    seconds: float


def parse_algos(text: str | Sequence[str]) -> list[str]:
    """``"grpo,gspo"`` or a list -> validated, de-duplicated algorithm names."""
    LOSSES = losses()
    names = [a.strip() for a in (text.split(",") if isinstance(text, str) else text)]
    names = [a for a in names if a]
    if not names:
        raise ConfigError("--algos needs at least one algorithm")
    bad = [a for a in names if a not in LOSSES]
    if bad:
        hint = did_you_mean(bad[0], LOSSES)
        raise ConfigError(
            f"unknown algo {', '.join(bad)}{hint}; valid: {', '.join(sorted(LOSSES))}"
        )
    if len(set(names)) != len(names):
        raise ConfigError(f"--algos lists an algorithm twice: {','.join(names)}")
    return names


def parse_seeds(text: str | int | Sequence[int], base: int = 0) -> list[int]:
    """``3`` (three seeds from ``base``) or ``"0,4,7"`` (these seeds) -> a list of seeds."""
    if isinstance(text, int):
        count = text
    elif isinstance(text, str) and "," not in text:
        try:
            count = int(text)
        except ValueError:
            raise ConfigError(f"--seeds: expected a count or a comma list, got {text!r}") from None
    else:
        try:
            seeds = [int(s) for s in (text.split(",") if isinstance(text, str) else text)]
        except ValueError:
            raise ConfigError(f"--seeds: expected integers, got {text!r}") from None
        if len(set(seeds)) != len(seeds) or not seeds:
            raise ConfigError(f"--seeds: need distinct seeds, got {text!r}")
        return seeds
    if count < 1:
        raise ConfigError(f"--seeds must be at least 1, got {count}")
    return list(range(base, base + count))


def run_name(algo: str, seed: int) -> str:
    return f"{algo}_seed{seed}"


def _finished(run_dir: Path, cfg: TrainConfig) -> bool:
    """A run folder that already holds this exact config's completed run."""
    saved = run_dir / "config.json"
    if not saved.is_file() or not (run_dir / "final").is_dir():
        return False
    try:
        return json.loads(saved.read_text()) == json.loads(json.dumps(to_dict(cfg)))
    except json.JSONDecodeError:
        return False


def plan(
    algos: Sequence[str],
    seeds: Sequence[int],
    output_dir: str | Path,
    *,
    preset: str | None = None,
    config_file: str | Path | None = None,
    overrides: dict[str, Any] | None = None,
    sft_steps: int = 0,
    sft_overrides: dict[str, Any] | None = None,
) -> tuple[list[TrainConfig], dict[int, SFTConfig]]:
    """Every run's TrainConfig and every seed's SFTConfig, all validated before any work."""
    out = Path(output_dir)
    overrides = dict(overrides or {})
    for key in ("algo", "seed", "output_dir"):
        if key in overrides:
            raise ConfigError(f"compare sets {key} itself; use --algos / --seeds / --output-dir")
    if sft_steps < 0:
        raise ConfigError(f"--sft-steps must be >= 0, got {sft_steps}")
    cold = overrides.get("model", "tiny")  # the random-init model --sft-steps cold-starts
    if sft_steps > 0 and cold not in ("tiny", "tiny-vl", "tiny-qwen-vl"):
        raise ConfigError(
            "--sft-steps cold-starts a tiny model (tiny, tiny-vl or tiny-qwen-vl); it cannot be "
            "combined with --model"
        )
    sft_cfgs: dict[int, SFTConfig] = {}
    cfgs: list[TrainConfig] = []
    for seed in seeds:
        seed_overrides = dict(overrides, seed=seed)
        if sft_steps > 0:
            sft_dir = out / "sft" / f"seed{seed}"
            seed_overrides["model"] = str(sft_dir)
        for algo in algos:
            cfgs.append(
                build(
                    TrainConfig,
                    preset=preset,
                    file=config_file,
                    overrides=dict(
                        seed_overrides,
                        algo=algo,
                        output_dir=str(out / "runs" / run_name(algo, seed)),
                    ),
                )
            )
        if sft_steps > 0:
            first = to_dict(cfgs[-1])
            shared = {
                f.name: first[f.name]
                for f in fields(SFTConfig)
                if f.name not in NOT_SHARED_WITH_SFT and f.name in first
            }
            sft_cfgs[seed] = build(
                SFTConfig,
                overrides=dict(
                    shared,
                    **(sft_overrides or {}),
                    model=cold,
                    steps=sft_steps,
                    output_dir=str(sft_dir),
                ),
            )
    registry = losses()  # each loss says whether its clip bounds token or sequence quantities
    levels = {registry[a].token_clip for a in algos}
    clip_set = any(None is not b for c in cfgs for b in (c.loss.clip_low, c.loss.clip_high))
    if clip_set and len(levels) > 1:
        print(
            "gspo compare: warning: clip_low/clip_high apply to every algorithm, but token-level "
            "(grpo) and sequence-level ratios need ranges orders of magnitude apart",
            file=sys.stderr,
        )
    return cfgs, sft_cfgs


def run_compare(
    cfgs: list[TrainConfig],
    sft_cfgs: dict[int, SFTConfig],
    output_dir: str | Path,
    *,
    tail: float = 0.1,
    title: str = "",
    reference: str | None = None,
    log=print,
) -> CompareResult:
    """Run the planned (algo, seed) pairs (:func:`plan`'s configs) from the same start and
    write ``<output_dir>/report``."""
    t0 = time.perf_counter()
    out = Path(output_dir)
    # Both load torch: the CLI stays torch-free until a run starts (every config is checked first).
    from gspo.compose.sft import run_sft
    from gspo.compose.train import train
    from gspo.interface.report import build_report  # it loads tqdm and the metric sinks

    out.mkdir(parents=True, exist_ok=True)
    sft_dirs: dict[int, Path] = {}
    fresh: set[int] = set()  # seeds whose cold start was (re)made: their RL runs are rerun too
    for seed, sft_cfg in sft_cfgs.items():
        sft_dir = Path(sft_cfg.output_dir)
        marker = sft_dir / "sft_config.json"
        wanted = json.loads(json.dumps(to_dict(sft_cfg)))
        if marker.is_file() and json.loads(marker.read_text()) == wanted:
            log(f"[sft seed {seed}] reusing {sft_dir}")
        else:
            log(f"[sft seed {seed}] cold start: {sft_cfg.steps} steps on {sft_cfg.task}")
            result = run_sft(sft_cfg)
            acc = result.eval.get("greedy_accuracy", float("nan"))
            won = result.eval.get("success")  # multi-turn environments: solved episodes
            extra = f", success {won:.3f}" if won is not None else ""
            log(
                f"[sft seed {seed}] {result.seconds:.0f} s, held-out greedy accuracy {acc:.3f}{extra}"
            )
            marker.write_text(json.dumps(wanted, indent=2))
            fresh.add(seed)
        sft_dirs[seed] = sft_dir
    run_dirs: list[Path] = []
    for i, cfg in enumerate(cfgs, 1):
        run_dir = Path(cfg.run.output_dir)
        run_dirs.append(run_dir)
        tag = f"[{i}/{len(cfgs)} {cfg.loss.algo} seed {cfg.run.seed}]"
        if cfg.run.seed not in fresh and _finished(run_dir, cfg):
            log(f"{tag} reusing finished run {run_dir}")
            continue
        t_run = time.perf_counter()
        result = train(cfg)
        acc = result.final_eval.get("eval/greedy_accuracy")
        extra = f", held-out greedy accuracy {acc:.3f}" if acc is not None else ""
        won = result.final_eval.get("eval/success")
        extra += f", success {won:.3f}" if won is not None else ""
        log(f"{tag} {time.perf_counter() - t_run:.0f} s{extra}")
    report = build_report(run_dirs, out / "report", tail=tail, title=title, reference=reference)
    return CompareResult(
        output_dir=out,
        run_dirs=run_dirs,
        sft_dirs=sft_dirs,
        report_dir=report.output_dir,
        seconds=time.perf_counter() - t0,
    )


# --------------------------------------------------------------------------------------------
# Command line: `gspo compare` and `gspo report` (wired into gspo.interface.cli)
# --------------------------------------------------------------------------------------------


def add_cli_parsers(sub: Any, add_config_flags: Any) -> None:
    """Add the ``compare`` and ``report`` subcommands to the ``gspo`` parser's subparsers."""

    p = sub.add_parser(
        "compare",
        help="run several algorithms x seeds from the same start, then write a report",
        description=(
            "Run every algorithm of --algos with every seed of --seeds, identical data order, "
            "model init and budget (all other flags apply to every run), then write "
            "<output-dir>/report: plots, a mean ± standard error table and the raw metrics."
        ),
    )
    p.add_argument("--algos", required=True, help="comma list, e.g. grpo,gspo,luspo")
    p.add_argument(
        "--seeds", default="3", help="a count (seeds from --seed on) or a comma list [3]"
    )
    p.add_argument(
        "--sft-steps",
        type=int,
        default=0,
        help="cold-start SFT steps, run once per seed and shared by its algorithms "
        "(0: start from --model as is) [0]",
    )
    p.add_argument(
        "--sft-lr", type=float, default=None, help="cold-start learning rate [SFT default]"
    )
    p.add_argument("--sft-batch-size", type=int, default=None, help="cold-start batch size")
    p.add_argument("--tail", type=float, default=0.1, help="share of final steps for 'end' [0.1]")
    p.add_argument("--title", default="", help="title of the report")
    p.add_argument("--reference", default=None, help="condition for the paired table [first algo]")
    add_config_flags(p, TrainConfig)

    r = sub.add_parser(
        "report",
        help="compare finished runs: plots, a mean ± standard error table, raw metrics",
        description=(
            "Group finished runs (folders with metrics.jsonl and config.json, or folders "
            "containing such runs) by their settings and write the comparison report."
        ),
    )
    r.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    r.add_argument("--output-dir", default="runs/report", help="report folder [runs/report]")
    r.add_argument("--tail", type=float, default=0.1, help="share of final steps for 'end' [0.1]")
    r.add_argument("--title", default="", help="title of the report")
    r.add_argument("--reference", default=None, help="condition for the paired table [first]")
    r.add_argument(
        "--ignore",
        default="",
        help="comma list of config keys that do not split conditions (e.g. model, when the "
        "same cold start was made in two folders)",
    )


def run_cli(args: Any, overrides_of: Any) -> int:
    """Run ``gspo compare`` or ``gspo report`` from parsed arguments; returns the exit code."""
    if args.command == "report":
        from gspo.interface.report import build_report  # it loads tqdm and the metric sinks

        report = build_report(
            args.run_dirs,
            args.output_dir,
            tail=args.tail,
            title=args.title,
            reference=args.reference,
            ignore=[k.strip() for k in args.ignore.split(",") if k.strip()],
        )
        _print_report(report.markdown)
        return 0
    overrides = overrides_of(args, TrainConfig)
    output_dir = overrides.pop("output_dir", "runs/compare")
    base_seed = int(overrides.pop("seed", 0))
    if "algo" in overrides:
        raise ConfigError("compare takes --algos (a comma list), not --algo")
    sft_overrides = {}
    if args.sft_lr is not None:
        sft_overrides["lr"] = args.sft_lr
    if args.sft_batch_size is not None:
        sft_overrides["batch_size"] = args.sft_batch_size
    # Plugins first: --algos may name a loss one of them registers.
    requested = requested_values(args.preset, args.config, overrides)
    problems = load_plugins(coerce(TrainConfig, "plugins", requested.get("plugins", ())))
    if problems:
        raise ConfigError(problems[0])
    algos, seeds = parse_algos(args.algos), parse_seeds(args.seeds, base=base_seed)
    cfgs, sft_cfgs = plan(  # the configs' problems before transformers (and torch) is imported
        algos,
        seeds,
        output_dir,
        preset=args.preset,
        config_file=args.config,
        overrides=overrides,
        sft_steps=args.sft_steps,
        sft_overrides=sft_overrides,
    )
    quiet_transformers()  # checkpoint writes would print a bar each
    result = run_compare(
        cfgs, sft_cfgs, output_dir, tail=args.tail, title=args.title, reference=args.reference
    )
    _print_report(result.report_dir / "summary.md")
    print(f"compare: {len(result.run_dirs)} runs in {result.seconds:.0f} s")
    return 0


def _print_report(markdown: Path) -> None:
    """Print the summary table of a report and where its files are."""
    text = markdown.read_text()
    start = text.find("## End of training")
    end = text.find("## Per run")
    if start >= 0:
        print(text[start:end].strip())
    print(f"report: {markdown} (plots, summary.json and raw/ beside it)")
