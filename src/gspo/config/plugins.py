"""User code named on the command line and in config files: ``module:attribute`` references
(``--reward mymod:score``, ``--env mymod:make_env``, ``--task mymod:build``) and plugin modules
(``--plugin mymod``) whose import registers tasks, rewards, environments or losses.

A module is found as ``python -m`` finds one: the working directory first, then installed
packages. A reference is checked without importing anything: the module is located with
:func:`importlib.util.find_spec` and its top-level names are read from its source with
:mod:`ast`, so a misspelt module or attribute is reported before torch (seconds) loads. The
module is imported for real when the run builds its parts (:func:`resolve`). Plugins are
imported when the config is validated: the names they register must exist by then.

Plain data otherwise: this module imports nothing else of gspo.
"""

from __future__ import annotations

import ast
import difflib
import importlib
import importlib.util
import logging
import os
import pkgutil
import sys
import traceback
from pathlib import Path
from typing import Any

KINDS = {"reward": "function", "env": "factory", "task": "builder"}
"""What each config field's ``module:attribute`` names (for messages)."""


class PluginError(ValueError):
    """User code named in a config cannot be found or imported (one line, naming the module)."""


def is_ref(value: Any) -> bool:
    """Whether ``value`` is a ``module:attribute`` reference rather than a registered name."""
    return isinstance(value, str) and ":" in value


def split_ref(value: str) -> tuple[str, str]:
    module, _, attr = value.partition(":")
    return module.strip(), attr.strip()


def _closest(value: str, choices: list[str]) -> str:
    """``; did you mean 'x'?`` for the closest of ``choices``, or ''."""
    close = difflib.get_close_matches(value, choices, n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def cwd_on_path() -> None:
    # `python -m` puts the working directory first on sys.path; the `gspo` script does not.
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


def _shown(path: str | None) -> str:
    """A module's file as messages show it: relative to the working directory when inside it."""
    if not path:
        return "built-in"
    try:
        rel = Path(path).resolve().relative_to(Path.cwd().resolve())
        return f"./{rel}"
    except ValueError:
        return path


def _neighbours(module: str) -> list[str]:
    """The modules a misspelt ``module`` may have meant, for did-you-mean: those of the working
    directory (``x.py`` files and packages), or for ``pkg.x`` the modules of ``pkg``."""
    parent, _, _ = module.rpartition(".")
    if not parent:
        return sorted(
            p.stem if p.suffix == ".py" else p.name
            for p in Path.cwd().iterdir()
            if p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").is_file())
        )
    try:
        spec = importlib.util.find_spec(parent)
    except Exception:  # the parent itself is missing or broken: nothing to suggest
        return []
    where = spec.submodule_search_locations if spec is not None else None
    return [f"{parent}.{m.name}" for m in pkgutil.iter_modules(where)] if where else []


def _find(module: str, what: str) -> Any:
    """The module's spec, or PluginError naming it (with the closest module of the cwd)."""
    cwd_on_path()
    try:
        spec = importlib.util.find_spec(module)
    except Exception as exc:  # a dotted name whose parent package is missing or fails to import
        spec, why = None, f" ({type(exc).__name__}: {exc})"
    else:
        why = ""
    if spec is None:
        hint = _closest(module, _neighbours(module))
        raise PluginError(
            f"{what}: no module {module!r} in the working directory or installed{why}{hint}"
        )
    return spec


def _top_level_names(source: str) -> set[str] | None:
    """Names a module's source binds at top level, or None when that cannot be known from the
    source (a star import or a module ``__getattr__``)."""
    tree = ast.parse(source)
    names: set[str] = set()

    def bind(target: ast.AST) -> None:
        for node in ast.walk(target):
            if isinstance(node, ast.Name):
                names.add(node.id)

    def visit(body: list[ast.stmt]) -> bool:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    bind(target)
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                bind(node.target)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    if alias.name == "*":
                        return False
                    names.add(alias.asname or alias.name.split(".")[0])
            elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
                # Names bound under a condition (try: import x except: x = None) count too.
                for block in ("body", "orelse", "finalbody"):
                    if not visit(getattr(node, block, [])):
                        return False
                for handler in getattr(node, "handlers", []):
                    if not visit(handler.body):
                        return False
        return True

    if not visit(tree.body):
        return None
    return None if "__getattr__" in names else names


def ref_problem(field: str, value: str) -> str | None:
    """The problem of ``--<field> module:attribute`` (None: fine), found without importing the
    module (its parent packages are imported, as Python's own lookup does)."""
    module, attr = split_ref(value)
    what = f"--{field} {value}"
    kind = KINDS.get(field, "attribute")
    if not module or not attr:
        return f"{what}: expected module:{kind} (e.g. mymodule:my_{kind})"
    try:
        spec = _find(module, what)
    except PluginError as exc:
        return str(exc)
    origin = spec.origin if spec.has_location else None
    if not origin or not origin.endswith(".py"):
        return None  # a compiled or namespace module: its names are known once it is imported
    try:
        names = _top_level_names(Path(origin).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError) as exc:
        return f"{what}: cannot read module {module!r} ({_shown(origin)}): {exc}"
    if names is None or attr in names:
        return None
    public = sorted(n for n in names if not n.startswith("_"))
    hint = _closest(attr, public)
    return f"{what}: module {module!r} ({_shown(origin)}) has no {kind} {attr!r}{hint}"


def _import(module: str, what: str) -> Any:
    """Import ``module``; an error inside it is one line naming the module and the exception
    (its traceback too at --log-level debug)."""
    spec = _find(module, what)
    try:
        return importlib.import_module(module)
    except Exception as exc:
        if logging.getLogger().isEnabledFor(logging.DEBUG):
            traceback.print_exc()
        where = _shown(spec.origin if spec.has_location else None)
        raise PluginError(
            f"{what}: importing module {module!r} ({where}) failed: {type(exc).__name__}: {exc}"
            " (--log-level debug shows the traceback)"
        ) from None


def resolve(field: str, value: str) -> Any:
    """The object ``module:attribute`` names, imported now (PluginError if it cannot be)."""
    what = f"--{field} {value}"
    problem = ref_problem(field, value)
    if problem:
        raise PluginError(problem)
    module, attr = split_ref(value)
    loaded = _import(module, what)
    try:
        found = getattr(loaded, attr)
    except AttributeError:
        kind = KINDS.get(field, "attribute")
        raise PluginError(f"{what}: module {module!r} has no {kind} {attr!r}") from None
    if not callable(found):
        raise PluginError(f"{what}: {attr!r} is a {type(found).__name__}, not a callable")
    return found


def plugin_list(value: Any) -> tuple[str, ...]:
    """A ``plugins`` value as module names: a list, or one string of comma-separated names."""
    items = value.split(",") if isinstance(value, str) else list(value or ())
    return tuple(dict.fromkeys(str(item).strip() for item in items if str(item).strip()))


def load_plugins(modules: Any) -> list[str]:
    """Import each plugin module (each registers what it defines); the problems, one per
    module that cannot be found or imported."""
    problems = []
    for module in plugin_list(modules):
        try:
            _import(module, f"--plugin {module}")
        except PluginError as exc:
            problems.append(str(exc))
    return problems
