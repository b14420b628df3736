"""Turning outside values into a config: coercion of file and flag values to field types,
config files (YAML or JSON), and ``build`` with its precedence.

Precedence when building a config: defaults < preset < config file (YAML or JSON) < command-line
flags. Unknown keys and bad values are rejected before any work starts, with messages naming them.
"""

from __future__ import annotations

import json
import types
import typing
from pathlib import Path
from typing import Any

from .fields import ConfigError, compose, flat_fields, flatten
from .names import did_you_mean
from .presets import PRESETS
from .validation import config_error, config_problems


def _base_type(annotation: Any) -> tuple[type, bool]:
    """(the scalar type, whether None is allowed) of a field annotation like ``int | None``."""
    hint = annotation
    if isinstance(hint, str):  # `from __future__ import annotations`
        hint = eval(hint, {"typing": typing}, {})
    args = typing.get_args(hint)
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        non_none = [a for a in args if a is not type(None)]
        return non_none[0], True
    return hint, False


def coerce(cls: type, key: str, value: Any) -> Any:
    """Convert ``value`` (from a file or the command line) to the type of field ``key`` (a flat
    name: ``algo``, not ``loss.algo``)."""
    by_name = flat_fields(cls)
    if key not in by_name:
        hint = did_you_mean(key, by_name)
        valid = "" if hint else f"; valid keys: {', '.join(by_name)}"
        raise ConfigError(f"unknown config key {key!r}{hint}{valid}")
    typ, optional = _base_type(by_name[key].type)
    if typing.get_origin(typ) is tuple:  # a list of names (plugins): a list, or "a,b"
        if isinstance(value, str) or value is None:
            value = (value or "").split(",")
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{key}: expected a list of names, got {value!r}")
        return tuple(dict.fromkeys(v.strip() for v in value if v.strip()))
    if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
        if optional:
            return None
        raise ConfigError(f"{key} cannot be None")
    try:
        if typ is bool:
            if isinstance(value, bool):
                return value
            text = str(value).lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if typ is int:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            if isinstance(value, bool):
                raise ValueError(value)
            return int(value) if not isinstance(value, str) else int(value, 10)
        if typ is float:
            if isinstance(value, bool):
                raise ValueError(value)
            return float(value)
        return str(value)
    except ValueError:
        raise ConfigError(f"{key}: expected {typ.__name__}, got {value!r}") from None


def load_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML or JSON config file into a dict (keys may use - or _; nested keys, such as
    ``loss: {algo: grpo}``, are kept nested: :func:`gspo.config.fields.flatten` reads them)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    text = p.read_text()
    try:
        if p.suffix == ".json":
            data = json.loads(text)
        else:
            import yaml  # on use: only YAML config files need it (not a declared dependency)

            data = yaml.safe_load(text)
    except Exception as exc:  # parse errors of either format
        raise ConfigError(f"{p}: cannot parse config: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: a config file must hold a mapping of keys to values")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def build(
    cls: type,
    *,
    preset: str | None = None,
    file: str | Path | None = None,
    overrides: dict[str, Any] | None = None,
) -> Any:
    """Defaults < preset < file < overrides, every value coerced and the result validated.

    Every problem is reported together in one ConfigError: unknown keys, values of the wrong
    type, and what validation finds in the rest (a bad value is left at its default there)."""
    values: dict[str, Any] = {}
    problems: list[str] = []
    if preset is not None:
        if preset not in PRESETS:
            hint = did_you_mean(preset, PRESETS)
            raise ConfigError(f"unknown preset {preset!r}{hint}; valid: {', '.join(PRESETS)}")
        valid = flat_fields(cls)
        values.update({k: v for k, v in PRESETS[preset].items() if k in valid})
    if file is not None:
        values.update(flatten(cls, load_file(file)))
    values.update(flatten(cls, overrides or {}))
    for k, v in list(values.items()):
        try:
            values[k] = coerce(cls, k, v)
        except ConfigError as exc:
            problems.append(str(exc))
            del values[k]
    cfg = compose(cls, values)
    for problem in config_problems(cfg):
        if problem not in problems:
            problems.append(problem)
    if problems:
        raise config_error(problems)
    return cfg


def from_dict(cls: type, data: dict[str, Any]) -> Any:
    """Rebuild a saved config, flat or nested (unknown keys rejected, values validated)."""
    return build(cls, overrides=data)
