"""Run configuration: dataclasses, each field documented, plus presets and validation.

Split by job:

- plain data, importable from any layer (they import nothing else of gspo): ``fields``
  (``ConfigError``, ``to_dict``, ``field_docs``, ``flat_fields``), ``options`` and
  ``options_train`` (each component's options: the fields), ``train`` (``TrainConfig``, composed
  of the options; ``SFTConfig``), ``eval_config`` (``EvalConfig``), ``presets``;
- the interface side, for the CLI and the composition root: ``validation`` (every problem of a
  config, checked against the registries) and ``coercion`` (``build``: defaults < preset < file
  < flags, values coerced to field types).

Lower layers import the plain-data modules (``gspo.config.train``), not this package's names.
"""

from .coercion import _base_type, build, coerce, from_dict, load_file
from .eval_config import EvalConfig
from .fields import (
    CORRECTIONS,
    DTYPES,
    MINIBATCH_GROUPINGS,
    OLD_LOGPROBS,
    ConfigError,
    _doc,
    field_docs,
    to_dict,
)
from .options import ROLLOUT_ENGINES
from .presets import PRESETS
from .train import EngineFields, SFTConfig, SharedFields, TrainConfig
from .validation import _validate_eval, _validate_model_fields, validate, validate_engine

__all__ = [
    "CORRECTIONS",
    "DTYPES",
    "MINIBATCH_GROUPINGS",
    "OLD_LOGPROBS",
    "PRESETS",
    "ROLLOUT_ENGINES",
    "ConfigError",
    "EngineFields",
    "EvalConfig",
    "SFTConfig",
    "SharedFields",
    "TrainConfig",
    "_base_type",
    "_doc",
    "_validate_eval",
    "_validate_model_fields",
    "build",
    "coerce",
    "field_docs",
    "from_dict",
    "load_file",
    "to_dict",
    "validate",
    "validate_engine",
]
