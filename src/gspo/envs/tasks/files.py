"""Tasks from user data files: local .jsonl / .json / .parquet (also .jsonl.gz, .json.gz),
one problem per row.

Files are read by :mod:`gspo.envs.tasks.reading` (no torch, no hub access). Every problem with
a file is reported in one :class:`DataError` that names, for each bad row (up to
:data:`MAX_LISTED`), the file, the row (0-based, plus the line number for JSON lines) and the
field, so that all bad rows can be found and fixed at once.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Any

from gspo.config.names import ANSWER_FORMATS
from gspo.core.images import IMAGE_PLACEHOLDER, load_image
from gspo.envs.rewards import extract_boxed, extract_hashes, get_reward, uses_sandbox
from gspo.envs.tasks.base import Example, Task
from gspo.envs.tasks.reading import (
    EXTENSIONS,
    KINDS,
    DataError,
    RowProblem,
    file_format,
    read_rows,
)

__all__ = [
    "ANSWER_FORMATS",
    "EXTENSIONS",
    "MAX_LISTED",
    "DataError",
    "load_examples",
    "make_file_task",
    "options_file_task",
]

MAX_LISTED = 20
"""Bad rows a DataError lists one by one (the rest are counted by kind)."""


class _RowError(DataError):
    """A bad row's problem, with its kind (a :data:`KINDS` key)."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


def _text_field(value: Any, field: str, where: str, *, numbers_ok: bool) -> str:
    """A row's prompt/answer/demo as a non-empty string, or DataError saying what is wrong."""
    if value is None:
        raise _RowError(f"{where}: field {field!r} is missing or null", "missing_field")
    if numbers_ok and isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if numbers_ok and isinstance(value, float) and math.isfinite(value):
        # Integral floats print as ints: a column mixing 3 and 2.5 is read as 3.0 and 2.5.
        return str(int(value)) if value.is_integer() else repr(value)
    if not isinstance(value, str):
        expected = "a string or a number" if numbers_ok else "a string"
        raise _RowError(
            f"{where}: field {field!r} must be {expected}, got {type(value).__name__} {value!r}",
            "bad_field",
        )
    if not value.strip():
        raise _RowError(f"{where}: field {field!r} is empty", "empty_field")
    return value


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
        raise _RowError(
            f"{where}: field {field!r} has no {marker} final answer (answer_format="
            f"{answer_format!r}): {text[-80:]!r}",
            "bad_field",
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
    kinds: dict[str, int] | None = None,
) -> list[Example]:
    """Load problems from a local .jsonl, .json or .parquet file (or .jsonl.gz, .json.gz).

    Each row needs a non-empty string ``prompt_key`` and a non-empty ``answer_key`` (numbers
    are converted to strings). With ``demo_key``, that column gives the demo (null allowed,
    meaning no demo for that row). All other columns go into ``Example.meta``. ``split`` names
    the split (kept for callers; it does not select part of the file). Raises one
    :class:`DataError` (a ValueError) naming the file, row and field of every bad row (not
    UTF-8, not JSON, missing or empty field, bad image, ...).

    ``on_error="skip"`` drops bad rows instead (problems with the file as a whole still
    raise); each dropped row's message is appended to ``skipped`` and its kind counted in
    ``kinds`` (:data:`KINDS`) when given, so the caller can report them. Nothing is dropped
    silently.

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
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    examples, problems = _read_examples(
        Path(path), prompt_key, answer_key, demo_key, answer_format, answer_optional, image_key
    )
    if problems and on_error == "raise":
        raise DataError(problems_message(problems))
    if skipped is not None:
        skipped.extend(p.message for p in problems)
    if kinds is not None:
        for p in problems:
            kinds[p.kind] = kinds.get(p.kind, 0) + 1
    return examples


def problems_message(problems: list[RowProblem], files: list[str] = (), hint: str = "") -> str:
    """One message for every problem found: the files' own problems, then each bad row (the
    first :data:`MAX_LISTED`), with the count of each kind."""
    listed = [*files, *(p.message for p in problems)]
    if len(listed) == 1:
        return listed[0]
    counts: dict[str, int] = {}
    for p in problems:
        counts[p.kind] = counts.get(p.kind, 0) + 1
    parts = [f"{len(files)} unreadable file(s)"] if files else []
    if problems:
        by_kind = ", ".join(f"{KINDS[k]} {n}" for k, n in counts.items())
        parts.append(f"{len(problems)} bad row(s) ({by_kind})")
    more = len(listed) - MAX_LISTED
    tail = f"\n  ... and {more} more" if more > 0 else ""
    head = f"data: {' and '.join(parts)}{'; ' + hint if hint and problems else ''}:"
    return head + "".join(f"\n  - {line}" for line in listed[:MAX_LISTED]) + tail


def _read_examples(
    path: Path,
    prompt_key: str,
    answer_key: str,
    demo_key: str | None,
    answer_format: str,
    answer_optional: bool,
    image_key: str | None,
) -> tuple[list[Example], list[RowProblem]]:
    """(the good rows' examples, every bad row's problem); DataError for the file's own."""
    if answer_format not in ANSWER_FORMATS:
        raise ValueError(
            f"answer_format must be one of {', '.join(ANSWER_FORMATS)}, got {answer_format!r}"
        )
    if path.is_dir():
        raise DataError(f"{path}: is a directory, not a data file")
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    if file_format(path) is None:
        raise DataError(
            f"{path}: unsupported extension {path.suffix!r} "
            f"(expected one of {', '.join(EXTENSIONS)})"
        )
    if path.stat().st_size == 0:
        raise DataError(f"{path}: file is empty")
    raw = read_rows(path)
    columns, problems = raw.columns, list(raw.problems)
    wanted = [prompt_key, answer_key] + ([demo_key] if demo_key is not None else [])
    wanted += [image_key] if image_key is not None else []
    for key in wanted:
        if raw.rows and key not in columns and not (answer_optional and key == answer_key):
            raise DataError(
                f"{path}: missing column {key!r} (available columns: {', '.join(columns)})"
            )
    if not raw.rows and not problems:
        raise DataError(f"{path}: no rows")
    examples = []
    for row, where in zip(raw.rows, raw.wheres, strict=True):
        try:
            prompt = _text_field(row.get(prompt_key), prompt_key, where, numbers_ok=False)
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
            if demo_key is not None and row.get(demo_key) is not None:
                demo = _text_field(row[demo_key], demo_key, where, numbers_ok=False)
            images: tuple = ()
            if image_key is not None:
                images = _row_images(row.get(image_key), image_key, where, path.parent)
                prompt = _place_images(prompt, len(images), prompt_key, where)
        except _RowError as exc:
            problems.append(RowProblem(exc.kind, str(exc)))
            continue
        meta = {key: value for key, value in row.items() if key not in wanted}
        if images and "problem" not in meta:
            # The data checks tell rows apart by prompt, answer and meta["problem"]: rows
            # that ask the same about different images are different problems.
            meta["problem"] = "images:" + _images_digest(images)
        if answer_format != "raw" and solution:
            meta["solution"] = solution
        examples.append(Example(prompt=prompt, answer=answer, demo=demo, meta=meta, images=images))
    return examples, problems


def _row_images(value: Any, field: str, where: str, folder: Path) -> tuple:
    """A row's images: one or a list of paths (relative to the data file's folder, or
    absolute), raw bytes, or ``{"bytes": ..., "path": ...}`` (a Hugging Face ``Image`` column
    in parquet). Each is decoded once here to check it; the example keeps the path or bytes."""
    if value is None:
        raise _RowError(f"{where}: field {field!r} is missing or null", "missing_field")
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
            raise _RowError(str(exc), "bad_image") from None
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
    have = prompt.count(IMAGE_PLACEHOLDER)
    if have == 0 and count == 0:
        return prompt
    if have == 0:
        return IMAGE_PLACEHOLDER * count + "\n" + prompt
    if have != count:
        raise _RowError(
            f"{where}: field {field!r} has {have} {IMAGE_PLACEHOLDER} placeholder(s) for "
            f"{count} image(s)",
            "bad_field",
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
    keys.setdefault("answer_optional", uses_sandbox(reward))
    on_error = keys.pop("on_error", "raise")
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
    # Both files read, every problem of both gathered: one message lists them all.
    splits: dict[str, list[Example]] = {"train": [], "test": []}
    problems: list[RowProblem] = []
    files: list[str] = []
    for split, path in (("train", train_path), ("test", test_path)):
        if path is None:
            continue
        try:
            splits[split], found = _read_examples(Path(path), **_read_keys(keys))
        except DataError as exc:
            files.append(str(exc))
            continue
        problems += found
    if files or (problems and on_error == "raise"):
        hint = "pass --bad-rows skip to drop the bad rows" if on_error == "raise" else ""
        raise DataError(problems_message(problems, files, hint))
    kinds: dict[str, int] = {}
    for p in problems:
        kinds[p.kind] = kinds.get(p.kind, 0) + 1
    return Task(
        name=f"file:{Path(train_path).stem}",
        train=splits["train"],
        test=splits["test"],
        reward=reward,
        description=f"user data: train {train_path}, test {test_path}, reward "
        f"{reward_name or 'paid by the environment'}",
        skipped_rows=[p.message for p in problems],
        skipped_kinds=kinds,
    )


def options_file_task(opts: Any, reward: str | None, demo_key: str | None = None) -> Task:
    """The task of ``--task file`` from a run's task options (``gspo.config.options.
    TaskOptions``): what the run trains on, and what the CLI reads to check the data before
    torch loads."""
    return make_file_task(
        opts.train_file,
        opts.test_file,
        reward,
        prompt_key=opts.prompt_key,
        answer_key=opts.answer_key,
        on_error="skip" if opts.bad_rows == "skip" else "raise",
        answer_format=opts.answer_format,
        **({"demo_key": demo_key} if demo_key else {}),
        **({"image_key": opts.image_key} if opts.image_key else {}),
    )


def _read_keys(keys: dict[str, Any]) -> dict[str, Any]:
    """:func:`_read_examples`'s arguments from ``make_file_task``'s keywords."""
    return {
        "prompt_key": keys.get("prompt_key", "prompt"),
        "answer_key": keys.get("answer_key", "answer"),
        "demo_key": keys.get("demo_key"),
        "answer_format": keys.get("answer_format", "raw"),
        "answer_optional": keys["answer_optional"],
        "image_key": keys.get("image_key"),
    }
