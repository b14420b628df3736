"""Reading a user data file into raw rows, torch- and ``datasets``-free, so that ``gspo train``,
``sft`` and ``eval`` check their data whole before torch and the model load (seconds on a busy
machine), and every unreadable row is found in one pass instead of one per run.

JSON (``.jsonl``, ``.json``) is read line by line here: a line that is not UTF-8, not JSON or
not an object is a row problem (named by row and line, skippable); a problem with the file as a
whole (missing, empty, a ``.json`` that parses neither as JSON nor as JSON lines, a corrupt
``.gz``) is a file problem. ``.jsonl.gz`` / ``.json.gz`` are read as they ship (HumanEval's
``HumanEval.jsonl.gz``). Parquet is read with pyarrow (``datasets``' own reader).
"""

from __future__ import annotations

import gzip
import json
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "EXTENSIONS",
    "KINDS",
    "SKIPPED_METRICS",
    "DataError",
    "RawRows",
    "RowProblem",
    "file_format",
    "read_rows",
]

EXTENSIONS: dict[str, str] = {
    ".jsonl": "json",
    ".json": "json",
    ".parquet": "parquet",
    ".jsonl.gz": "json",
    ".json.gz": "json",
}
"""Supported file extensions and the format each holds."""

KINDS: dict[str, str] = {
    "invalid_json": "invalid JSON",
    "not_utf8": "not UTF-8",
    "missing_field": "missing field",
    "empty_field": "empty field",
    "bad_field": "bad field",
    "bad_image": "bad image",
}
"""The kinds of bad row (key: the ``data/skipped_rows_<key>`` count; value: how messages say it)."""

SKIPPED_METRICS: dict[str, str] = {
    "invalid_json": "data/skipped_rows_invalid_json",
    "not_utf8": "data/skipped_rows_not_utf8",
    "missing_field": "data/skipped_rows_missing_field",
    "empty_field": "data/skipped_rows_empty_field",
    "bad_field": "data/skipped_rows_bad_field",
    "bad_image": "data/skipped_rows_bad_image",
}
"""The metric counting each kind of row ``--bad-rows skip`` dropped (logged where non-zero)."""


class DataError(ValueError):
    """A user data file is missing, unreadable or has bad rows (all of them in the message)."""


@dataclass(frozen=True)
class RowProblem:
    """One bad row: its kind (a :data:`KINDS` key) and the message naming file, row and field."""

    kind: str
    message: str


@dataclass
class RawRows:
    """The readable rows of a file: each a dict, with where it is (``"f.jsonl row 3 (line
    4)"``), and the rows that could not be read as objects."""

    columns: list[str] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    wheres: list[str] = field(default_factory=list)
    problems: list[RowProblem] = field(default_factory=list)


def file_format(path: Path) -> tuple[str, str] | None:
    """(extension as listed in :data:`EXTENSIONS`, format) of ``path``, or None."""
    name = path.name.lower()
    for ext in sorted(EXTENSIONS, key=len, reverse=True):  # .jsonl.gz before .gz-less ones
        if name.endswith(ext):
            return ext, EXTENSIONS[ext]
    return None


def read_rows(path: Path) -> RawRows:
    """The rows of the data file ``path`` (its existence and extension already checked).
    Raises :class:`DataError` for a problem with the file as a whole."""
    ext, fmt = file_format(path) or ("", "")
    if fmt == "parquet":
        return _parquet_rows(path)
    data = path.read_bytes()
    if ext.endswith(".gz"):
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise DataError(f"{path}: not a readable gzip file ({exc})") from None
    if not data.strip():
        raise DataError(f"{path}: file is empty")
    if ext.startswith(".jsonl"):
        return _json_lines(path, data, lines_named=True)
    return _json_file(path, data)


def _parquet_rows(path: Path) -> RawRows:
    try:
        import pyarrow.parquet as pq
    except ImportError:  # pragma: no cover - pyarrow comes with datasets, a core dependency
        raise DataError(f"{path}: reading parquet needs pyarrow: pip install pyarrow") from None
    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow's errors have no common base worth naming
        raise DataError(f"{path}: could not be read as parquet: {exc}") from None
    rows = table.to_pylist()
    return RawRows(list(table.column_names), rows, [f"{path} row {i}" for i in range(len(rows))])


def _json_lines(path: Path, data: bytes, *, lines_named: bool) -> RawRows:
    """Every non-blank line a row: each line that is not UTF-8, not JSON or not an object is a
    row problem; the others are the rows (row numbers count every non-blank line)."""
    out = RawRows()
    row = 0
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        where = f"{path} row {row} (line {number})" if lines_named else f"{path} line {number}"
        row += 1
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            out.problems.append(
                RowProblem(
                    "not_utf8",
                    f"{where}: not UTF-8 text (byte 0x{raw[e.start]:02x} at column "
                    f"{e.start + 1}); save the file as UTF-8",
                )
            )
            continue
        try:
            value = json.loads(text)
        except json.JSONDecodeError as e:
            out.problems.append(
                RowProblem("invalid_json", f"{path} line {number}: invalid JSON: {e}")
            )
            continue
        if not isinstance(value, dict):
            out.problems.append(
                RowProblem(
                    "invalid_json",
                    f"{path} line {number}: expected a JSON object, got {type(value).__name__}",
                )
            )
            continue
        out.rows.append(value)
        out.wheres.append(where)
    out.columns = list(dict.fromkeys(key for r in out.rows for key in r))
    return out


def _json_file(path: Path, data: bytes) -> RawRows:
    """A ``.json`` file: one JSON value (a list of objects, one object, or columns
    ``{"prompt": [...], ...}``), or JSON lines, as ``datasets`` also reads them."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return _json_lines(path, data, lines_named=False)  # names the lines that are not UTF-8
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        lines = _json_lines(path, data, lines_named=False)
        if lines.rows and not lines.problems:
            return lines
        if len(text.strip().splitlines()) > 1 and len(lines.rows) > len(lines.problems):
            return lines  # mostly JSON lines: name each bad line
        raise DataError(f"{path}: invalid JSON: {e}") from None
    if isinstance(value, dict) and value and all(isinstance(v, list) for v in value.values()):
        columns = list(value)
        length = min(len(v) for v in value.values())
        items: list[Any] = [{c: value[c][i] for c in columns} for i in range(length)]
    elif isinstance(value, dict):
        items = [value]
    elif isinstance(value, list):
        items = value
    else:
        raise DataError(f"{path}: expected a list of JSON objects, got {type(value).__name__}")
    out = RawRows()
    for i, item in enumerate(items):
        if isinstance(item, dict):
            out.rows.append(item)
            out.wheres.append(f"{path} row {i}")
        else:
            kind = type(item).__name__
            out.problems.append(
                RowProblem("invalid_json", f"{path} row {i}: expected a JSON object, got {kind}")
            )
    out.columns = list(dict.fromkeys(key for r in out.rows for key in r))
    return out
