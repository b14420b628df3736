"""Argument-parser pieces of the ``gspo`` command that import nothing heavy.

``gspo --help`` and argument errors must not wait for torch and transformers (about 4 s to
import), so the parser is built from the config dataclasses alone; the commands import the
heavy modules only once they run.
"""

from __future__ import annotations

import argparse
import re
from typing import Any, NoReturn

from gspo.config import EvalConfig
from gspo.config.names import did_you_mean

LOG_LEVELS = ("debug", "info", "warning", "error")

# Any number argparse should take as a flag's value rather than as an unknown flag: -1, -0.5,
# -1e-4, -.5E+3 (argparse's own pattern has no exponent, so `--lr -1e-4` was "expected one
# argument" instead of validation's "lr must be positive").
NEGATIVE_NUMBER = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$|^-inf$")

TRAIN_EVAL_DEFAULTS = (
    "train and eval defaults differ on purpose: train (and sft) default to --model tiny (a "
    "random-init character model, trained from scratch on a built-in task), --max-new-tokens 8 "
    "(enough for the built-in tasks' short answers) and data from --task, or --task file with "
    "--train-file/--test-file; eval defaults to --model smollm2-135m-instruct (a pretrained "
    "model), --max-new-tokens 256 (room for reasoning) and one data file, --data FILE. A "
    "checkpoint gspo trained (a run's final/, an SFT folder) is scored with its run's own "
    "--max-new-tokens, --chat-template and --system-prompt unless given; pass the data flags "
    "(--data or --task) explicitly."
)


class Parser(argparse.ArgumentParser):
    """An ArgumentParser without prefix abbreviations (``--clip-lo`` is an error, not
    ``--clip-low``); subcommand parsers made by ``add_subparsers`` inherit the class."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = NEGATIVE_NUMBER

    def parse_args(self, args: Any = None, namespace: Any = None) -> argparse.Namespace:
        """As argparse's, but an unknown flag is reported by its subcommand's parser, with the
        closest flag of that subcommand suggested."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            parser = self._subcommand_parser(parsed)
            unknown = next((e.split("=")[0] for e in extras if e.startswith("-")), "")
            hint = did_you_mean(unknown, parser._option_string_actions)
            parser.error(f"unrecognized arguments: {' '.join(extras)}{hint}")
        return parsed

    def _subcommand_parser(self, parsed: argparse.Namespace) -> argparse.ArgumentParser:
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                chosen = action.choices.get(getattr(parsed, action.dest, None) or "")
                if chosen is not None:
                    return chosen
        return self

    def error(self, message: str) -> NoReturn:
        # argparse's "invalid choice" (an unknown subcommand) names no near miss before 3.14.
        found = re.match(r"argument .*: invalid choice: '(.*?)' \(choose from (.*)\)", message)
        if found:
            choices = re.findall(r"'([^']*)'", found.group(2))
            message += did_you_mean(found.group(1), choices)
        # One line instead of argparse's usage block (gspo train's runs to 50 lines of flags).
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def parse_bool(text: str) -> bool:
    """``true/false`` (also 1/0, yes/no, on/off), the spelling every config bool flag uses."""
    value = text.lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def add_log_level(parser: argparse.ArgumentParser) -> None:
    """``--log-level``: how much the libraries underneath (transformers, datasets, vLLM) print."""
    parser.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        default="error",
        help="log level of transformers, datasets and vLLM: warning, info or debug also show "
        "their warnings, progress bars and per-step lines [error]",
    )


def add_eval_parser(sub: Any, add_config_flags: Any) -> None:
    """Add ``gspo eval`` to the ``gspo`` parser's subparsers (its flags are EvalConfig's)."""
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
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing --output file (without it gspo eval refuses to overwrite one)",
    )


_PROBLEM_START = re.compile(r"(^  - |^|: )([a-z][a-z0-9_]*)( must | is | =)")


def name_flags(message: str, typed: set[str]) -> str:
    """A config error as the command line's user reads it: each problem that starts with a
    field they typed as a flag names that flag (``lr must be positive`` -> ``--lr must be >
    0``); fields from a config file or preset keep their names, as written there."""

    def flag(match: re.Match) -> str:
        lead, name, verb = match.groups()
        if name not in typed:
            return match.group(0)
        return f"{lead}--{name.replace('_', '-')}{verb}"

    out = []
    for line in message.split("\n"):
        named = _PROBLEM_START.sub(flag, line)
        if named != line:
            named = named.replace("must be positive", "must be > 0")
        out.append(named)
    return "\n".join(out)
