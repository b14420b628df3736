"""Data files with images: paths next to the file, bytes, parquet; bad images named or skipped."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("PIL")
from PIL import Image

from gspo.envs.tasks.files import DataError, load_examples, make_file_task


def _png(colour=(255, 0, 0), size=(12, 9)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, format="PNG")
    return buf.getvalue()


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture
def folder(tmp_path) -> Path:
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "red.png").write_bytes(_png())
    (tmp_path / "img" / "blue.png").write_bytes(_png((0, 0, 255), (30, 8)))
    (tmp_path / "img" / "broken.png").write_bytes(_png()[:30])
    return tmp_path


def test_jsonl_paths_relative_to_the_file(folder):
    data = _write_jsonl(
        folder / "train.jsonl",
        [
            {"prompt": "colour?", "answer": "red", "image": "img/red.png"},
            {
                "prompt": "<image> vs <image>",
                "answer": "no",
                "image": ["img/red.png", "img/blue.png"],
            },
        ],
    )
    rows = load_examples(data, image_key="image")
    assert rows[0].prompt == "<image>\ncolour?"  # no placeholder: the image goes first
    assert rows[0].images == (str(folder / "img" / "red.png"),)
    assert len(rows[1].images) == 2 and rows[1].prompt == "<image> vs <image>"
    assert "image" not in rows[0].meta


def test_parquet_with_image_bytes(folder):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    table = pa.table(
        {
            "prompt": ["<image>count="],
            "answer": ["1"],
            "image": [{"bytes": _png(), "path": None}],
        }
    )
    pq.write_table(table, folder / "train.parquet")
    rows = load_examples(folder / "train.parquet", image_key="image")
    assert isinstance(rows[0].images[0], bytes)
    assert Image.open(io.BytesIO(rows[0].images[0])).size == (12, 9)


@pytest.mark.parametrize(
    ("image", "problem"),
    [
        ("img/missing.png", "no image file"),
        ("img/broken.png", "not a readable image"),
        (None, "missing or null"),
    ],
)
def test_bad_image_names_file_row_field(folder, image, problem):
    data = _write_jsonl(
        folder / "train.jsonl",
        [
            {"prompt": "a", "answer": "1", "image": "img/red.png"},
            {"prompt": "b", "answer": "2", "image": image},
        ],
    )
    with pytest.raises(DataError) as info:
        load_examples(data, image_key="image")
    message = str(info.value)
    assert f"{data} row 1 (line 2)" in message and "'image'" in message and problem in message


def test_placeholder_count_mismatch_is_a_row_error(folder):
    data = _write_jsonl(
        folder / "train.jsonl",
        [{"prompt": "<image> and <image>", "answer": "1", "image": "img/red.png"}],
    )
    with pytest.raises(DataError, match=r"line 1\).*2 <image> placeholder\(s\) for 1 image"):
        load_examples(data, image_key="image")


def test_bad_rows_skip_counts_bad_images(folder):
    data = _write_jsonl(
        folder / "train.jsonl",
        [
            {"prompt": "a", "answer": "1", "image": "img/red.png"},
            {"prompt": "b", "answer": "2", "image": "img/broken.png"},
            {"prompt": "c", "answer": "3", "image": "img/gone.png"},
        ],
    )
    task = make_file_task(data, None, "exact_match", image_key="image", on_error="skip")
    assert [e.prompt for e in task.train] == ["<image>\na"]
    assert len(task.skipped_rows) == 2 and "line 3" in task.skipped_rows[1]


def test_cli_refuses_a_missing_image_before_training(folder):
    data = _write_jsonl(
        folder / "train.jsonl", [{"prompt": "a", "answer": "1", "image": "img/gone.png"}]
    )
    src = str(Path(__file__).resolve().parents[1] / "src")
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "gspo.interface.cli", "train", "--model", "tiny-vl"),
            *("--task", "file", "--train-file", str(data), "--image-key", "image"),
            *("--reward", "exact_match", "--output-dir", str(folder / "run"), "--device", "cpu"),
        ],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": src, "PATH": "/usr/bin:/bin"},
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    line = [ln for ln in proc.stderr.splitlines() if "gone.png" in ln]
    assert line and "line 1" in line[0] and "'image'" in line[0]
