"""Helpers shared by test_wiring.py and the files split from it.

Imported by name: pytest puts tests/ on sys.path.
"""

from __future__ import annotations

import json
from pathlib import Path

from gspo.config import TrainConfig, build
from gspo.interface import cli

SOURCES = ("flags", "file")


def cli_cfg(tmp_path: Path, source: str, **values) -> TrainConfig:
    """The TrainConfig ``gspo train --preset smoke ...`` builds, with ``values`` given as flags
    or in a JSON config file."""
    argv = ["train", "--preset", "smoke", "--device", "cpu", "--threads", "0"]
    argv += ["--output-dir", str(tmp_path / "run")]
    if source == "flags":
        for key, value in values.items():
            argv += [f"--{key.replace('_', '-')}", str(value)]
    else:
        tmp_path.mkdir(parents=True, exist_ok=True)
        path = tmp_path / "config.json"
        path.write_text(json.dumps(values))
        argv += ["--config", str(path)]
    args = cli._parser().parse_args(argv)
    return build(
        TrainConfig,
        preset=args.preset,
        file=args.config,
        overrides=cli._overrides(args, TrainConfig),
    )
