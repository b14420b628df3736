"""Moved: the engine and correction fields to `gspo.config.fields`, their checks to
`gspo.config.validation`, the engine builder to `gspo.rollout.build`. This path re-exports
every name it had so existing imports keep working."""

from gspo.config.fields import CORRECTIONS, ROLLOUT_ENGINES, CorrectionFields, EngineFields, _doc
from gspo.config.validation import validate_engine
from gspo.rollout.build import build_engine, check_engine_available, close_engine, vllm_options

__all__ = [
    "CORRECTIONS",
    "ROLLOUT_ENGINES",
    "CorrectionFields",
    "EngineFields",
    "_doc",
    "build_engine",
    "check_engine_available",
    "close_engine",
    "validate_engine",
    "vllm_options",
]
