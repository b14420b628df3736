"""Plain config data: the helpers every config's fields are declared with, and the names of
a few choices.

The fields themselves are declared once, in the option classes (:mod:`gspo.config.options`,
:mod:`gspo.config.options_train`); :func:`field_group` picks some of them into the flat groups
``gspo sft`` and ``gspo eval`` take whole (:mod:`gspo.config.train`).

This module imports nothing else of gspo, so any layer may read its config from here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import field, fields
from typing import Any

OLD_LOGPROBS = ("engine", "recompute")
MINIBATCH_GROUPINGS = ("shuffled", "groups")
DTYPES = ("float32", "bfloat16", "float16", "float64")
CORRECTIONS = ("truncate", "mask")


class ConfigError(ValueError):
    """A configuration problem, reported before any work starts."""


def _doc(text: str, default: Any = dataclasses.MISSING, **kw: Any) -> Any:
    """A dataclass field carrying its documentation in metadata (shown by ``--help``)."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: default, metadata={"doc": text}, **kw)
    return field(default=default, metadata={"doc": text}, **kw)


def field_group(
    name: str, sources: tuple[type, ...], names: tuple[str, ...], doc: str, module: str
) -> type:
    """A dataclass of the fields ``names`` of the dataclasses ``sources``, with their types,
    defaults and docs (declared once, there), in the order of ``names``.

    For the flat configs of ``gspo sft`` and ``gspo eval``, which take whole groups of the
    fields ``TrainConfig``'s parts declare."""
    declared = {f.name: f for source in sources for f in fields(source)}

    def same(f: dataclasses.Field) -> Any:
        if f.default_factory is not dataclasses.MISSING:
            return field(default_factory=f.default_factory, metadata=f.metadata)
        return field(default=f.default, metadata=f.metadata)

    return dataclasses.make_dataclass(
        name,
        [(n, declared[n].type, same(declared[n])) for n in names],
        namespace={"__doc__": doc, "__module__": module},
        frozen=True,  # as the option classes, and the flat configs built on these groups
    )


def field_docs(cls: type) -> dict[str, str]:
    return {name: f.metadata.get("doc", "") for name, f in flat_fields(cls).items()}


def _parts(cls: type) -> dict[str, type]:
    """{part name: option class} of a config composed of parts (``TrainConfig``); {} for a flat
    one (its fields are plain values)."""
    return {
        f.name: f.default_factory
        for f in fields(cls)
        if isinstance(f.default_factory, type) and dataclasses.is_dataclass(f.default_factory)
    }


def flat_fields(cls: type) -> dict[str, dataclasses.Field]:
    """Every field of config class ``cls`` by its flat name (the CLI flag's, the config-file
    key's): a composed config's parts' fields in part order, a flat config's own."""
    parts = _parts(cls)
    out: dict[str, dataclasses.Field] = {}
    for f in fields(cls):
        out.update({g.name: g for g in fields(parts[f.name])} if f.name in parts else {f.name: f})
    return out


def flatten(cls: type, values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with nested keys (``{"loss": {"algo": "grpo"}}``) turned flat (``algo``);
    flat keys stay. A part name whose value is no mapping is a flat key (``model: tiny``)."""
    parts = _parts(cls)
    out: dict[str, Any] = {}
    for key, value in values.items():
        if key not in parts or not isinstance(value, dict):
            out[key] = value
            continue
        owned = [f.name for f in fields(parts[key])]
        for inner, v in value.items():
            inner = str(inner).replace("-", "_")
            if inner not in owned:
                raise ConfigError(f"unknown config key {key}.{inner}: {key} has {', '.join(owned)}")
            out[inner] = v
    return out


def compose(cls: type, values: dict[str, Any]) -> Any:
    """A config of class ``cls`` from flat (or nested) ``values``, unchecked: each flat field
    goes to the part that declares it. TypeError for a key no part has, as a dataclass's own
    constructor."""
    parts = _parts(cls)
    if not parts:
        return cls(**values)
    owner = {g.name: part for part, c in parts.items() for g in fields(c)}
    grouped: dict[str, dict[str, Any]] = {part: {} for part in parts}
    for key, value in flatten(cls, values).items():
        if key in parts and isinstance(value, parts[key]):  # a whole part, as built
            grouped[key] = {**vars(value), **grouped[key]}
        elif key in owner:
            grouped[owner[key]][key] = value
        else:
            raise TypeError(f"{cls.__name__} has no field {key!r}")
    return cls(**{part: parts[part](**given) for part, given in grouped.items()})


def to_dict(cfg: Any) -> dict[str, Any]:
    """The flat dict of a config, as config files and checkpoints hold it: a composed config's
    parts (``TrainConfig.loss``, ...) are flattened into their fields (no field is a dict)."""
    out: dict[str, Any] = {}
    for key, value in dataclasses.asdict(cfg).items():
        out.update(value if isinstance(value, dict) else {key: value})
    return out
