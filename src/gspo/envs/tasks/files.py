"""Tasks from user data files: local .jsonl / .json / .parquet, one problem per row.

Files are read with :func:`datasets.load_dataset` from local paths only (no hub access). Every
problem with a file is reported as a :class:`DataError` that names the file, the row (0-based,
plus the line number for .jsonl) and the field, so a bad row can be found and fixed.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import tempfile
import zlib
from pathlib import Path
from typing import Any

from gspo.envs.rewards import extract_boxed, extract_hashes, get_reward, uses_sandbox
from gspo.envs.tasks.base import Example, Task

__all__ = ["ANSWER_FORMATS", "EXTENSIONS", "DataError", "load_examples", "make_file_task"]

EXTENSIONS: dict[str, str] = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}
"""Supported file extensions and the ``datasets`` builder that reads each."""


class DataError(ValueError):
    """A user data file is missing, unreadable or has a bad row."""


def _jsonl_line_numbers(path: Path) -> list[int]:
    """1-based line number of each row of a JSON-lines file (datasets skips blank lines)."""
    with path.open(encoding="utf-8") as f:
        return [number for number, line in enumerate(f, start=1) if line.strip()]


def _json_lines_error(path: Path, text: str) -> str | None:
    """The first line of ``text`` that is not a JSON object, as an error message, or None."""
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as e:
            return f"{path} line {number}: invalid JSON: {e}"
        if not isinstance(value, dict):
            return f"{path} line {number}: expected a JSON object, got {type(value).__name__}"
    return None


def _not_utf8(path: Path, data: bytes) -> str:
    """Where ``data`` (the file's bytes) stops being UTF-8: the row and line, not the byte
    offset Python's decoder names, so the bad row can be found in an editor."""
    row = 0
    for number, line in enumerate(data.split(b"\n"), start=1):
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as e:
            where = f"row {row} (line {number})" if path.suffix == ".jsonl" else f"line {number}"
            return (
                f"{path} {where}: not UTF-8 text (byte 0x{line[e.start]:02x} at column "
                f"{e.start + 1}); save the file as UTF-8"
            )
        row += bool(line.strip())
    return f"{path}: not UTF-8 text"


def _find_json_error(path: Path) -> str | None:
    """Locate invalid JSON ourselves: datasets only reports a deep, position-less error."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return _not_utf8(path, data)
    if path.suffix == ".jsonl":
        return _json_lines_error(path, text)
    try:
        json.loads(text)
    except json.JSONDecodeError as e:
        # datasets also accepts JSON lines in a .json file: only an error if it is neither.
        if _json_lines_error(path, text) is None:
            return None
        return f"{path}: invalid JSON: {e}"
    return None


def _read_json_rows(path: Path) -> list[Any]:
    """Rows of a valid JSON / JSON-lines file, for files whose columns mix types."""
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    if isinstance(data, dict) and all(isinstance(v, list) for v in data.values()):
        # Column-oriented {"prompt": [...], "answer": [...]}.
        columns = list(data)
        length = min((len(v) for v in data.values()), default=0)
        return [{c: data[c][i] for c in columns} for i in range(length)]
    # A .jsonl with a single row parses as one object.
    return [data] if isinstance(data, dict) else list(data)


def _load_rows(path: Path, split: str) -> tuple[list[str], list[dict[str, Any]]]:
    """(column names, rows) of a local data file, read with ``datasets``."""
    import datasets  # heavy; only needed when a file is actually loaded

    builder = EXTENSIONS[path.suffix]
    if path.suffix == ".jsonl":
        # Checked up front: datasets would read a line like "[1, 2]" as a "text" column.
        problem = _find_json_error(path)
        if problem is not None:
            raise DataError(problem)
    try:
        dataset = datasets.load_dataset(builder, data_files={split: str(path)}, split=split)
    except Exception as e:
        if builder != "json":
            raise DataError(f"{path}: could not be read as {builder}: {e}") from e
        problem = _find_json_error(path)
        if problem is not None:
            raise DataError(problem) from e
        # Valid JSON that pyarrow cannot put in one schema (e.g. a column holding numbers in
        # some rows and strings in others): read it directly instead of failing.
        try:
            rows = _read_json_rows(path)
        except (ValueError, TypeError, KeyError, IndexError) as inner:
            raise DataError(f"{path}: could not be read as JSON rows: {e}") from inner
        if not all(isinstance(row, dict) for row in rows):
            raise DataError(f"{path}: expected a list of JSON objects") from e
        columns = list(dict.fromkeys(key for row in rows for key in row))
        return columns, [{c: row.get(c) for c in columns} for row in rows]
    return list(dataset.column_names), dataset.to_list()


def _where(path: Path, index: int, lines: list[int] | None) -> str:
    line = f" (line {lines[index]})" if lines is not None and index < len(lines) else ""
    return f"{path} row {index}{line}"


def _text_field(value: Any, field: str, where: str, *, numbers_ok: bool) -> str:
    """A row's prompt/answer/demo as a non-empty string, or DataError saying what is wrong."""
    if value is None:
        raise DataError(f"{where}: field {field!r} is missing or null")
    if numbers_ok and isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if numbers_ok and isinstance(value, float) and math.isfinite(value):
        # Integral floats print as ints: a column mixing 3 and 2.5 is read as 3.0 and 2.5.
        return str(int(value)) if value.is_integer() else repr(value)
    if not isinstance(value, str):
        expected = "a string or a number" if numbers_ok else "a string"
        raise DataError(
            f"{where}: field {field!r} must be {expected}, got {type(value).__name__} {value!r}"
        )
    if not value.strip():
        raise DataError(f"{where}: field {field!r} is empty")
    return value


ANSWER_FORMATS = ("raw", "gsm8k", "boxed")
"""How a data file's answer field holds the final answer (see :func:`load_examples`)."""


def _final_answer(text: str, answer_format: str, field: str, where: str) -> str:
    """The final answer inside an answer field written in ``answer_format``."""
    if answer_format == "raw":
        return text

    if answer_format == "gsm8k":
        found = extract_hashes(text)
        marker = "'#### <answer>'"
    else:
        found = extract_boxed(text)
        marker = "'\\boxed{...}'"
    if found is None:
        raise DataError(
            f"{where}: field {field!r} has no {marker} final answer (answer_format="
            f"{answer_format!r}): {text[-80:]!r}"
        )
    return found


def load_examples(
    path: str | Path,
    *,
    prompt_key: str = "prompt",
    answer_key: str = "answer",
    demo_key: str | None = None,
    split: str = "train",
    on_error: str = "raise",
    skipped: list[str] | None = None,
    answer_format: str = "raw",
    answer_optional: bool = False,
    image_key: str | None = None,
) -> list[Example]:
    """Load problems from a local .jsonl, .json or .parquet file (or one of them gzipped,
    ``.jsonl.gz``).

    Each row needs a non-empty string ``prompt_key`` and a non-empty ``answer_key`` (numbers
    are converted to strings). With ``demo_key``, that column gives the demo (null allowed,
    meaning no demo for that row). All other columns go into ``Example.meta``. ``split`` names
    the split for ``datasets``; it does not select part of the file. Raises :class:`DataError`
    (a ValueError) naming the file, row and field for any problem.

    ``on_error="skip"`` drops malformed rows instead (problems with the file as a whole still
    raise); each dropped row's message is appended to ``skipped`` when a list is given, so the
    caller can report the count. Nothing is dropped silently.

    ``answer_format`` says how to read the reference answer: ``raw`` takes the field as it is;
    ``gsm8k`` takes what follows the last ``####`` (GSM8K's answer field is the worked
    solution, then ``#### 72``); ``boxed`` takes the last ``\\boxed{...}`` (MATH's
    ``solution`` field). The full field is then kept in ``meta["solution"]``; a row without
    the marker is a :class:`DataError` naming it.

    ``answer_optional`` (rows scored by their tests, e.g. the code reward): the answer column
    may be absent and a row's answer null or empty; such rows get the answer ``""``.

    ``image_key`` names a column of images (:func:`_row_images`): each is read and decoded
    here, so a missing or corrupt image is a :class:`DataError` naming file, row and field
    (or a skipped row) before any training.
    """
    if answer_format not in ANSWER_FORMATS:
        raise ValueError(
            f"answer_format must be one of {', '.join(ANSWER_FORMATS)}, got {answer_format!r}"
        )
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    path = Path(path)
    if path.is_dir():
        raise DataError(f"{path}: is a directory, not a data file")
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    if path.suffix == ".gz" and Path(path.stem).suffix in EXTENSIONS:
        return _load_gzip(path, dict(prompt_key=prompt_key, answer_key=answer_key,
            demo_key=demo_key, split=split, on_error=on_error, skipped=skipped,
            answer_format=answer_format, answer_optional=answer_optional, image_key=image_key))  # fmt: skip
    if path.suffix not in EXTENSIONS:
        raise DataError(
            f"{path}: unsupported extension {path.suffix!r} "
            f"(expected one of {', '.join(EXTENSIONS)})"
        )
    if path.stat().st_size == 0:
        raise DataError(f"{path}: file is empty")
    columns, rows = _load_rows(path, split)
    wanted = [prompt_key, answer_key] + ([demo_key] if demo_key is not None else [])
    wanted += [image_key] if image_key is not None else []
    for key in wanted:
        if key not in columns and not (answer_optional and key == answer_key):
            raise DataError(
                f"{path}: missing column {key!r} (available columns: {', '.join(columns)})"
            )
    if not rows:
        raise DataError(f"{path}: no rows")
    lines = _jsonl_line_numbers(path) if path.suffix == ".jsonl" else None
    examples = []
    for index, row in enumerate(rows):
        where = _where(path, index, lines)
        try:
            prompt = _text_field(row[prompt_key], prompt_key, where, numbers_ok=False)
            value = row.get(answer_key)
            if answer_optional and (
                value is None or (isinstance(value, str) and not value.strip())
            ):
                answer = solution = ""
            else:
                answer = _text_field(value, answer_key, where, numbers_ok=True)
                solution = answer
                answer = _final_answer(answer, answer_format, answer_key, where)
            demo = None
            if demo_key is not None and row[demo_key] is not None:
                demo = _text_field(row[demo_key], demo_key, where, numbers_ok=False)
            images: tuple = ()
            if image_key is not None:
                images = _row_images(row[image_key], image_key, where, path.parent)
                prompt = _place_images(prompt, len(images), prompt_key, where)
        except DataError as exc:
            if on_error == "raise":
                raise
            if skipped is not None:
                skipped.append(str(exc))
            continue
        meta = {key: value for key, value in row.items() if key not in wanted}
        if images and "problem" not in meta:
            # The data checks tell rows apart by prompt, answer and meta["problem"]: rows
            # that ask the same about different images are different problems.
            meta["problem"] = "images:" + _images_digest(images)
        if answer_format != "raw" and solution:
            meta["solution"] = solution
        examples.append(Example(prompt=prompt, answer=answer, demo=demo, meta=meta, images=images))
    return examples


def _load_gzip(path: Path, args: dict[str, Any]) -> list[Example]:
    """:func:`load_examples` of a gzip-compressed file (HumanEval ships ``HumanEval.jsonl.gz``):
    read from a decompressed copy, its messages naming ``path``."""
    with tempfile.TemporaryDirectory() as folder:
        plain = Path(folder) / path.stem
        try:
            plain.write_bytes(gzip.decompress(path.read_bytes()))
        except (OSError, EOFError, zlib.error) as exc:
            raise DataError(f"{path}: could not be decompressed: {exc}") from None
        try:
            return load_examples(plain, **args)
        except DataError as exc:
            raise DataError(str(exc).replace(str(plain), str(path))) from None


def _row_images(value: Any, field: str, where: str, folder: Path) -> tuple:
    """A row's images: one or a list of paths (relative to the data file's folder, or
    absolute), raw bytes, or ``{"bytes": ..., "path": ...}`` (a Hugging Face ``Image`` column
    in parquet). Each is decoded once here to check it; the example keeps the path or bytes."""
    from gspo.models.vision import load_image

    if value is None:
        raise DataError(f"{where}: field {field!r} is missing or null")
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    out = []
    for j, item in enumerate(items):
        name = f"{where}: field {field!r}" + (f" item {j}" if len(items) > 1 else "")
        if isinstance(item, dict):  # datasets' Image feature: bytes, else its path
            item = item.get("bytes") or item.get("path")
        if isinstance(item, str):
            item = str(folder / item) if not Path(item).is_absolute() else item
        try:
            load_image(item, where=name)
        except ValueError as exc:
            raise DataError(str(exc)) from None
        except ImportError:
            raise DataError(
                f"{name}: reading images needs Pillow: pip install 'gspo[vision]'"
            ) from None
        out.append(bytes(item) if isinstance(item, (bytearray, memoryview)) else item)
    return tuple(out)


def _images_digest(images: tuple) -> str:
    digest = hashlib.blake2b(digest_size=8)
    for item in images:
        digest.update(Path(item).read_bytes() if isinstance(item, str) else bytes(item))
    return digest.hexdigest()


def _place_images(prompt: str, count: int, field: str, where: str) -> str:
    """The prompt with one ``<image>`` per image: as written where it has them, else the
    images first (a prompt without placeholders is about its images)."""
    from gspo.models.vision import IMAGE_PLACEHOLDER

    have = prompt.count(IMAGE_PLACEHOLDER)
    if have == 0 and count == 0:
        return prompt
    if have == 0:
        return IMAGE_PLACEHOLDER * count + "\n" + prompt
    if have != count:
        raise DataError(
            f"{where}: field {field!r} has {have} {IMAGE_PLACEHOLDER} placeholder(s) for "
            f"{count} image(s)"
        )
    return prompt


def environment_pays(completion: str, example: Example) -> float:
    """The reward of a file task whose environment (``--env``) pays its own: never called."""
    raise RuntimeError(
        "task='file' has no reward (the run's environment pays its own rewards); "
        "set --reward to score completions without it"
    )


def make_file_task(
    train_path: str | Path,
    test_path: str | Path | None,
    reward_name: str | None,
    **keys: Any,
) -> Task:
    """A task from a train file, an optional test file (None = no test split) and a reward name
    (None: the run's environment pays its own rewards, :func:`environment_pays`).

    ``keys`` are passed to :func:`load_examples` (``prompt_key``, ``answer_key``,
    ``demo_key``). The reward is looked up with :func:`gspo.envs.rewards.get_reward` first, so a
    typo fails before any file is read. Rows scored by tests (a reward that runs the code
    sandbox) need no answer.
    """
    reward = environment_pays if reward_name is None else get_reward(reward_name)
    allowed = {
        "prompt_key",
        "answer_key",
        "demo_key",
        "on_error",
        "answer_format",
        "answer_optional",
        "image_key",
    }
    unknown = set(keys) - allowed
    if unknown:
        raise ValueError(f"unknown keyword(s) for load_examples: {', '.join(sorted(unknown))}")
    skipped: list[str] = []
    keys.setdefault("answer_optional", uses_sandbox(reward))
    train = load_examples(train_path, split="train", skipped=skipped, **keys)
    test = (
        load_examples(test_path, split="test", skipped=skipped, **keys)
        if test_path is not None
        else []
    )
    return Task(
        name=f"file:{Path(train_path).stem}",
        train=train,
        test=test,
        reward=reward,
        description=f"user data: train {train_path}, test {test_path}, reward "
        f"{reward_name or 'paid by the environment'}",
        skipped_rows=skipped,
    )
