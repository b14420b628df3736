"""Resuming a run: the saved config is the run's identity; flags may change only safe fields.

``gspo train --output-dir D --resume`` rebuilds the config saved in D's latest checkpoint.
Flags given with ``--resume`` (and ``--config`` / ``--preset``) may change the fields of
:data:`SAFE_ON_RESUME` (how long the run goes, how often it evaluates and checkpoints, how it
logs); each change is printed. Any other difference (model, task, algorithm, batch shape, seed,
learning rate, ...) would make the weights, optimizer state and data order of the checkpoint
belong to another run, so it is refused with a message naming the fields.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gspo.config import PRESETS, ConfigError, SFTConfig, TrainConfig, build, coerce, load_file
from gspo.config.fields import flat_fields, flatten, to_dict
from gspo.config.train import SFT_SAFE_ON_RESUME
from gspo.core.checkpoint_paths import checkpoint_root, latest_checkpoint

SAFE_ON_RESUME = frozenset(
    {
        "output_dir",
        "steps",
        "stop_after",
        "eval_every",
        "checkpoint_every",
        "keep_checkpoints",
        "max_bad_steps",
        "progress",
        "tensorboard",
        "wandb",
        "threads",
        "reward_workers",
        "reward_placement",
        "backend",
        "trainer_workers",
        "placement",
        "ray_address",
    }
)
"""Fields a resumed run may change: they decide how long the run goes and what it reports, not
what a step computes (``threads`` changes only the float reduction order; ``reward_workers`` only how many rewards
are scored at once). The layout may change too: the local backend and any number of FSDP2 ranks
read each other's checkpoints (``gspo.backend.reshard``) and compute the same update up to the
order of float sums; ``rollout_workers`` may change between 0 and 1 (one engine sampling with
the step's generator), not beyond (more workers sample other streams)."""


RAY_ONLY_DEFAULTS = {
    "trainer_workers": 1,
    "rollout_workers": 0,
    "ray_address": None,
    "placement": "separate",
    "reward_placement": "auto",
}
"""The layout fields the local backend refuses other values of, with the values it takes: a
Ray run resumed with ``--backend local`` gets these unless the flags say otherwise."""


def follow_layout(saved: dict[str, Any], requested: dict[str, Any]) -> dict[str, Any]:
    """The Ray-only fields a move to the local backend resets (those not asked for explicitly),
    so that ``--resume --backend local`` alone continues a Ray run in one process; {} unless
    the run moves from Ray to local. The other way needs nothing: the local values are valid
    on Ray."""
    if saved.get("backend", "local") == "local" or requested.get("backend") != "local":
        return {}
    return {
        key: default
        for key, default in RAY_ONLY_DEFAULTS.items()
        if key not in requested and saved.get(key, default) != default
    }


RESUME_FIELDS = (
    ", ".join(sorted(SAFE_ON_RESUME - {"output_dir"})) + " and rollout_workers between 0 and 1"
)
"""The fields ``--resume`` lets change, as ``gspo train --help`` and the README list them."""


def _safe(key: str, old: Any, new: Any) -> bool:
    if key == "rollout_workers":
        return max(int(old), int(new)) <= 1
    return key in SAFE_ON_RESUME


def requested_values(
    preset: str | None, file: str | Path | None, overrides: dict[str, Any]
) -> dict[str, Any]:
    """What a command line asks for explicitly: preset < config file < flags (no defaults)."""
    values: dict[str, Any] = {}
    if preset is not None:
        if preset not in PRESETS:
            raise ConfigError(f"unknown preset {preset!r}; valid: {', '.join(PRESETS)}")
        names = flat_fields(TrainConfig)
        values.update({k: v for k, v in PRESETS[preset].items() if k in names})
    if file is not None:
        values.update(flatten(TrainConfig, load_file(file)))
    values.update(overrides)
    return values


class RunFinished(Exception):
    """``--resume`` of a run that reached its last step and saved its model: nothing to do
    (the command prints the message and exits 0, changing nothing)."""


def saved_config(output_dir: str | Path) -> tuple[dict[str, Any], int, Path]:
    """(config dict, step, checkpoint folder) of the latest checkpoint under ``output_dir``."""
    found = latest_checkpoint(output_dir)
    if found is None:
        raise FileNotFoundError(f"--resume: no checkpoint under {checkpoint_root(output_dir)}")
    state = json.loads((found / "state.json").read_text())
    # Flat, as checkpoints are written; a nested one (keys by part) is read as well.
    return flatten(TrainConfig, dict(state["config"])), int(state["step"]), found


def _differences(saved: dict[str, Any], requested: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """{field: (saved value, requested value)} for requested values that differ from saved."""
    defaults = to_dict(TrainConfig())
    out: dict[str, tuple[Any, Any]] = {}
    for key, value in requested.items():
        new = coerce(TrainConfig, key, value)
        old = saved.get(key, defaults[key])
        if isinstance(old, list):  # a list field (plugins) read back from JSON: a tuple
            old = tuple(old)
        if key == "output_dir":
            same = Path(str(old)).resolve() == Path(str(new)).resolve()
        else:
            same = old == new
        if not same:
            out[key] = (old, new)
    return out


def check_changes(saved: dict[str, Any], requested: dict[str, Any], where: str) -> dict[str, Any]:
    """The safe changes ``requested`` makes to ``saved``; ConfigError naming any unsafe one."""
    diff = _differences(saved, requested)
    unsafe = {k: v for k, v in diff.items() if not _safe(k, *v)}
    if unsafe:
        listed = "\n  - ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in unsafe.items())
        raise ConfigError(
            f"--resume continues the run saved in {where}; these settings would make a "
            f"different run:\n  - {listed}\nDrop them to resume (the run's own config is "
            f"restored), or start a new run in another --output-dir. A resumed run may change "
            f"only: {', '.join(sorted(SAFE_ON_RESUME))}."
        )
    return {k: new for k, (_, new) in diff.items()}


def resume_config(
    output_dir: str | Path, requested: dict[str, Any], *, echo: Any = print
) -> TrainConfig:
    """The config of the run in ``output_dir`` with the safe ``requested`` changes applied.

    ``requested`` holds what the user asked for explicitly (preset, config file and flags).
    Prints which run and step it resumes, and each change.
    """
    saved, step, found = saved_config(output_dir)
    # stop_after (a global step) belongs to the invocation that asked for it: a resume without
    # --stop-after runs to `steps`, not back into the earlier stop.
    saved = {**saved, "stop_after": None}
    asked = {k: v for k, v in requested.items() if k != "output_dir"}
    asked = {**follow_layout(saved, asked), **asked}  # Ray -> local: the Ray-only fields too
    changes = check_changes(saved, asked, str(found))
    # The folder holding the checkpoint is the run's folder, wherever it was first written.
    values = {**saved, **changes, "output_dir": str(output_dir)}
    cfg = build(TrainConfig, overrides=values)
    if cfg.run.steps < step:
        raise ConfigError(
            f"--resume: the checkpoint in {output_dir} is at step {step}, past steps={cfg.run.steps}"
            f" (pass --steps N with N > {step} to train further)"
        )
    if step == cfg.run.steps and (Path(output_dir) / "final").is_dir():
        raise RunFinished(
            f"the run in {output_dir} is already finished (step {step} of {cfg.run.steps}, model in "
            f"{Path(output_dir) / 'final'}); nothing to do (pass --steps N with N > {step} to "
            "train further)"
        )
    echo(
        f"resuming {output_dir} at step {step} of {cfg.run.steps} (checkpoint {found.name}): "
        f"{cfg.loss.algo} on {cfg.task.task}, model {cfg.model.model}, seed {cfg.run.seed}"
    )
    for key, new in changes.items():
        old = saved.get(key, to_dict(TrainConfig())[key])
        echo(f"  changed on resume: {key} {old!r} -> {new!r}")
    return cfg


def sft_resume_config(
    output_dir: str | Path, requested: dict[str, Any], *, echo: Any = print
) -> SFTConfig:
    """The config of the unfinished SFT in ``output_dir`` with the safe ``requested`` changes;
    ConfigError naming any other change."""
    found = latest_checkpoint(output_dir)
    if found is None and (Path(output_dir) / "model.safetensors").is_file():
        raise RunFinished(
            f"the SFT in {output_dir} is already finished (its model is saved there); nothing "
            "to do (--overwrite starts a new one)"
        )
    if found is None:
        raise FileNotFoundError(
            f"--resume: no SFT checkpoint under {checkpoint_root(output_dir)} (a finished SFT "
            "keeps only its model)"
        )
    state = json.loads((found / "state.json").read_text())
    saved, step = dict(state["config"]), int(state["step"])
    changes = {}
    for key, value in requested.items():
        new = coerce(SFTConfig, key, value)
        old = saved.get(key)
        old = tuple(old) if isinstance(old, list) else old  # plugins, read back from JSON
        if key != "output_dir" and old != new:
            changes[key] = new
    unsafe = sorted(k for k in changes if k not in SFT_SAFE_ON_RESUME)
    if unsafe:
        raise ConfigError(
            f"--resume continues the SFT saved in {found}; {', '.join(unsafe)} would make a "
            f"different run (a resumed SFT may change only {', '.join(sorted(SFT_SAFE_ON_RESUME))})"
        )
    cfg = build(SFTConfig, overrides={**saved, **changes, "output_dir": str(output_dir)})
    if cfg.steps <= step:
        raise ConfigError(
            f"--resume: the SFT checkpoint in {output_dir} is at step {step}; pass --steps N "
            f"with N > {step}"
        )
    echo(f"resuming SFT {output_dir} at step {step} of {cfg.steps} (checkpoint {found.name})")
    return cfg
