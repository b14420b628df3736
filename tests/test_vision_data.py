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


def _colour_rows(folder: Path, n: int) -> list[dict]:
    """Rows asking the colour of a one-colour image saved next to the data file."""
    colours = {"red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255)}
    rows = []
    for i in range(n):
        name = list(colours)[i % 3]
        size = (20 + 3 * i, 14 + 5 * (i % 4))  # sizes differ row to row
        (folder / "img" / f"{i}.png").write_bytes(_png(colours[name], size))
        rows.append({"prompt": "colour?", "answer": name, "image": f"img/{i}.png"})
    return rows


def test_train_and_eval_on_an_image_data_file(folder):
    from gspo.compose.evaluate import evaluate
    from gspo.compose.train import train
    from gspo.config import EvalConfig, TrainConfig, build

    rows = _colour_rows(folder, 12)
    data = _write_jsonl(folder / "train.jsonl", rows[:8])
    test = _write_jsonl(folder / "test.jsonl", rows[8:])
    common = {"model": "tiny-vl", "device": "cpu", "threads": 1, "image_key": "image"}
    cfg = build(
        TrainConfig,
        preset="smoke",
        overrides={
            **common,
            "task": "file",
            "train_file": str(data),
            "test_file": str(test),
            "reward": "exact_match",
            "eval_every": 1,
            "output_dir": str(folder / "run"),
        },
    )
    result = train(cfg)
    assert len([r for r in result.history if "reward/mean" in r]) == 2
    assert result.final_eval["eval/problems"] == 4.0
    # Same prompt text, different images: not duplicates (the data checks see the images).
    checks = [r for r in result.history if "data/duplicates" in r]
    assert checks and all(r["data/duplicates"] == 0 for r in checks)
    assert all(r["data/train_test_overlap"] == 0 for r in checks)
    report = evaluate(
        build(
            EvalConfig,
            overrides={
                **common,
                "model": str(folder / "run" / "final"),
                "data": str(test),
                "reward": "exact_match",
                "output": str(folder / "eval.json"),
                "max_new_tokens": 4,
            },
        )
    )
    assert report["metrics"]["problems"] == 4
