"""Argument-parser pieces of the ``gspo`` command that import nothing heavy.

``gspo --help`` and argument errors must not wait for torch and transformers (about 4 s to
import), so the parser is built from the config dataclasses alone; the commands import the
heavy modules only once they run.
"""

from __future__ import annotations

import argparse
from typing import Any

TRAIN_EVAL_DEFAULTS = (
    "train and eval defaults differ on purpose: train (and sft) default to --model tiny (a "
    "random-init character model, trained from scratch on a built-in task), --max-new-tokens 8 "
    "(enough for the built-in tasks' short answers) and data from --task, or --task file with "
    "--train-file/--test-file; eval defaults to --model smollm2-135m-instruct (a pretrained "
    "model), --max-new-tokens 256 (room for reasoning) and one data file, --data FILE. Pass "
    "--model, --max-new-tokens and the data flags explicitly to score a trained run the way it "
    "was trained."
)


class Parser(argparse.ArgumentParser):
    """An ArgumentParser without prefix abbreviations (``--clip-lo`` is an error, not
    ``--clip-low``); subcommand parsers made by ``add_subparsers`` inherit the class."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)


def parse_bool(text: str) -> bool:
    """``true/false`` (also 1/0, yes/no, on/off), the spelling every config bool flag uses."""
    value = text.lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def add_eval_parser(sub: Any, add_config_flags: Any) -> None:
    """Add ``gspo eval`` to the ``gspo`` parser's subparsers (its flags are EvalConfig's)."""
    from gspo.config import EvalConfig

    p = sub.add_parser(
        "eval",
        help="score a model: greedy accuracy, avg@k and pass@k with standard errors, JSON report",
        description=(
            "Score --model on --data FILE (GSM8K: --prompt-key question --answer-format gsm8k; "
            "MATH: --prompt-key problem --answer-key solution --answer-format boxed) or on the "
            "held-out split of --task. Reports greedy accuracy, avg@k and pass@k (k = --samples) "
            "with standard errors over problems, mean response length and the truncated share, "
            "and writes them with per-problem records to --output."
        ),
        epilog=TRAIN_EVAL_DEFAULTS,
    )
    add_config_flags(p, EvalConfig)
