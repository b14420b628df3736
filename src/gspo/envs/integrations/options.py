"""The options an integration's task name carries: ``PREFIX:NAME,key=value,...``, and the
import of the integration's optional package."""

from __future__ import annotations

import ast
import importlib
from typing import Any


def import_extra(module: str, prefix: str, package: str, install: str) -> Any:
    """The integration's package ``module``, imported when a task first needs it (an optional
    extra); if it is missing, an ImportError saying how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(f"--task {prefix}:... needs {package}: {install}") from None


def _split_options(text: str) -> list[str]:
    """``a=1,b=(2, 3)`` -> ``['a=1', 'b=(2, 3)']``: commas inside brackets or quotes stay."""
    parts, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return [p.strip() for p in [*parts, text[start:]] if p.strip()]


def parse_name(prefix: str, spec: str) -> tuple[str, dict[str, Any]]:
    """``NAME[,key=value...]`` -> (NAME, options); values are Python literals, else strings."""
    name, _, rest = spec.partition(",")
    options: dict[str, Any] = {}
    for item in _split_options(rest):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--task {prefix}:{spec}: expected key=value options, got {item!r}")
        try:
            options[key.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            options[key.strip()] = value.strip()
    return name.strip(), options
