"""What ``gspo train``, ``sft``, ``demo`` and ``eval`` check before torch, a model or any work
loads: the configs, the machine (extras, CUDA), the data files read whole (every bad row in one
message), and for ``eval`` what to score, where the report goes and the checkpoint's own
generation settings. Imports nothing heavy."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gspo.compose.resume import requested_values
from gspo.config import ConfigError, EvalConfig, SFTConfig, TrainConfig, build
from gspo.config.machine import machine_problems
from gspo.config.options_task import TaskOptions
from gspo.config.validation import config_error
from gspo.envs.rewards import get_reward, uses_sandbox
from gspo.envs.tasks.files import load_examples, options_file_task

from .demo import DEMO_DEFAULTS

GENERATION_FIELDS = ("max_new_tokens", "chat_template", "system_prompt")
"""What ``gspo eval`` takes from the run that made a checkpoint when the command line does not
say: how that model was trained to answer (a run trained with 8 new tokens is scored with 8)."""

NO_DATA = (
    "what to score? give --data FILE (a .jsonl/.json/.parquet of problems) or --task NAME (the "
    "held-out split of a task, e.g. --task addition)"
)


def preflight(args: argparse.Namespace, overrides: Callable[..., dict[str, Any]]) -> None:
    """Build and check the configs a command will run (cheap: plain dataclasses, torch-free
    registries), what they need from the machine, and their data files, so that every such
    mistake is reported at once, before the command's slow imports and work. The command
    builds its config again when it runs; ``--resume`` configs come from the run folder and are
    checked there."""
    if args.command in ("train", "sft"):
        if args.resume:
            return
        cls = {"train": TrainConfig, "sft": SFTConfig}[args.command]
        cfgs = [build(cls, preset=args.preset, file=args.config, overrides=overrides(args, cls))]
    elif args.command == "eval":
        flags = overrides(args, EvalConfig)
        _check_machine([build(EvalConfig, preset=args.preset, file=args.config, overrides=flags)])
        given = eval_overrides(args, flags)
        cfgs = [build(EvalConfig, preset=args.preset, file=args.config, overrides=given)]
    elif args.command == "demo":  # its RL config must be valid before the cold start runs
        given = {k: getattr(args, k) for k in DEMO_DEFAULTS if getattr(args, k) is not None}
        demo = {**DEMO_DEFAULTS, **given}  # a resumed demo's own settings are checked on resume
        common = dict(seed=demo["seed"], threads=args.threads, device="cpu", task="addition")
        cfgs = [
            build(SFTConfig, overrides=dict(steps=demo["sft_steps"], n_test=0, **common)),
            build(
                TrainConfig,
                preset="demo",
                overrides=dict(algo=demo["algo"], steps=demo["steps"], **common),
            ),
        ]
    else:
        return
    _check_machine(cfgs)
    for cfg in cfgs:
        check_data(cfg)


def _check_machine(cfgs: list[Any]) -> None:
    problems = [p for cfg in cfgs for p in machine_problems(cfg)]
    if problems:
        raise config_error(list(dict.fromkeys(problems)), header="cannot start")


def check_data(cfg: TrainConfig | SFTConfig | EvalConfig) -> None:
    """Read the run's data files whole, as the run will, torch-free: every bad row of both
    files in one DataError (with ``bad_rows='skip'`` the run drops them and counts them)."""
    if isinstance(cfg, EvalConfig):
        if cfg.data:
            reward = get_reward(cfg.reward)
            load_examples(
                cfg.data,
                prompt_key=cfg.prompt_key,
                answer_key=cfg.answer_key,
                answer_format=cfg.answer_format,
                answer_optional=uses_sandbox(reward),
                image_key=cfg.image_key,
            )
        return
    if isinstance(cfg, SFTConfig):
        if cfg.task == "file":
            options_file_task(TaskOptions.of(cfg), cfg.reward, cfg.demo_key)
    elif cfg.task.task == "file":
        options_file_task(cfg.task, cfg.reward.reward, None)


def eval_overrides(
    args: argparse.Namespace, given: dict[str, Any], echo: Callable[[str], None] | None = None
) -> dict[str, Any]:
    """``gspo eval``'s fields from the command line, checked before a model loads: something to
    score (``--data`` or ``--task``), an ``--output`` that holds no earlier report (unless
    ``--overwrite``), and the generation settings of the run that trained ``--model`` where the
    command line does not give them (said through ``echo``)."""
    requested = requested_values(args.preset, args.config, given)
    if not requested.get("data") and not requested.get("task"):
        raise ConfigError(NO_DATA)
    output = requested.get("output", EvalConfig.output)
    if output and Path(output).exists() and not args.overwrite:
        raise ConfigError(
            f"--output {output} already exists: pass --overwrite to replace it, or choose "
            "another --output"
        )
    found, saved = run_settings(str(requested.get("model", EvalConfig.model)))
    taken = {k: saved[k] for k in GENERATION_FIELDS if k in saved and k not in requested}
    if taken and echo is not None:
        listed = ", ".join(f"{k} {v!r}" for k, v in taken.items())
        echo(f"gspo eval: {listed} from {found} (the flags override them)")
    return {**taken, **given}


def run_settings(model: str) -> tuple[Path | None, dict[str, Any]]:
    """(file, config) of the gspo run that saved the checkpoint folder ``model``: a train run's
    ``config.json`` beside its ``final/``, or an SFT's ``sft_config.json`` in its folder;
    (None, {}) for a model gspo did not train."""
    folder = Path(model)
    if not folder.is_dir():
        return None, {}
    for path in (folder / "sft_config.json", folder.parent / "config.json"):
        if path.is_file() and (path.name == "sft_config.json" or folder.name == "final"):
            try:
                saved = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if isinstance(saved, dict) and "max_new_tokens" in saved:
                return path, saved
    return None, {}
