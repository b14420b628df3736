"""Loading user data files (.jsonl / .json / .parquet) into examples, with precise errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gspo.envs.rewards import numeric_match
from gspo.envs.tasks import DataError, Example, load_examples, make_file_task


@pytest.fixture(autouse=True)
def _private_datasets_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # load_dataset writes Arrow caches; keep them out of the user's ~/.cache during tests.
    import datasets.config

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")


def write_jsonl(path: Path, rows: list[object]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


ROWS = [
    {"prompt": "1+1=", "answer": "2", "source": "a", "level": 1},
    {"prompt": "2+3=", "answer": 5, "source": "b", "level": 2},
]


def test_jsonl_loads_with_meta_and_numeric_answers(tmp_path: Path) -> None:
    examples = load_examples(write_jsonl(tmp_path / "d.jsonl", ROWS))
    assert examples == [
        Example("1+1=", "2", meta={"source": "a", "level": 1}),
        Example("2+3=", "5", meta={"source": "b", "level": 2}),
    ]


def test_parquet_loads_with_custom_keys_and_demo(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "d.parquet"
    table = pa.table({"q": ["1+1=", "2+2="], "a": [2, 4], "sol": ["2", None], "id": [7, 8]})
    pq.write_table(table, path)
    examples = load_examples(path, prompt_key="q", answer_key="a", demo_key="sol")
    assert examples == [
        Example("1+1=", "2", demo="2", meta={"id": 7}),
        Example("2+2=", "4", demo=None, meta={"id": 8}),
    ]


def test_json_array_and_mixed_type_columns(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    path.write_text(json.dumps([{"prompt": "p", "answer": 3}, {"prompt": "q", "answer": "x"}]))
    assert [e.answer for e in load_examples(path)] == ["3", "x"]
    floats = write_jsonl(
        tmp_path / "f.jsonl", [{"prompt": "p", "answer": 3}, {"prompt": "q", "answer": 2.5}]
    )
    assert [e.answer for e in load_examples(floats)] == ["3", "2.5"]


def test_missing_field_names_file_row_line_and_field(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    # A blank line: datasets skips it, so row 1 is on line 3.
    path.write_text('{"prompt": "a", "answer": "1"}\n\n{"prompt": "b"}\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"d\.jsonl row 1 \(line 3\): field 'answer'") as info:
        load_examples(path)
    assert str(path) in str(info.value)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        ({"prompt": "", "answer": "1"}, "field 'prompt' is empty"),
        ({"prompt": "  ", "answer": "1"}, "field 'prompt' is empty"),
        ({"prompt": 5, "answer": "1"}, "field 'prompt' must be a string"),
        ({"prompt": "a", "answer": None}, "field 'answer' is missing or null"),
        ({"prompt": "a", "answer": ""}, "field 'answer' is empty"),
        ({"prompt": "a", "answer": [1]}, "field 'answer' must be a string or a number"),
    ],
)
def test_bad_row_values(tmp_path: Path, row: dict[str, object], problem: str) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [ROWS[0], row])
    with pytest.raises(DataError, match=rf"row 1 \(line 2\): {problem}"):
        load_examples(path)


def test_missing_column_lists_available_columns(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", ROWS)
    with pytest.raises(DataError, match=r"missing column 'question' \(available columns: prompt"):
        load_examples(path, prompt_key="question")
    with pytest.raises(DataError, match="missing column 'sol'"):
        load_examples(path, demo_key="sol")


def test_malformed_json_line_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    lines = [json.dumps(ROWS[0])] * 6 + ['{"prompt": "x", "answer": oops}', json.dumps(ROWS[1])]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"bad\.jsonl line 7: invalid JSON: "):
        load_examples(path)


def test_non_object_json_line(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [ROWS[0], [1, 2]])
    with pytest.raises(DataError, match="line 2: expected a JSON object"):
        load_examples(path)


def test_malformed_json_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('[{"prompt": "a", "answer": "1"},\n {"prompt": }]', encoding="utf-8")
    with pytest.raises(DataError, match=r"bad\.json: invalid JSON: .*line 2"):
        load_examples(path)


def test_missing_file_unknown_extension_and_empty_file(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"nope\.jsonl: no such file"):
        load_examples(tmp_path / "nope.jsonl")
    csv = tmp_path / "d.csv"
    csv.write_text("prompt,answer\na,1\n")
    with pytest.raises(DataError, match=r"d\.csv: unsupported extension '\.csv'"):
        load_examples(csv)
    empty = tmp_path / "e.jsonl"
    empty.write_text("")
    with pytest.raises(DataError, match="empty"):
        load_examples(empty)


def test_make_file_task(tmp_path: Path) -> None:
    train = write_jsonl(tmp_path / "train.jsonl", ROWS)
    test = write_jsonl(tmp_path / "test.jsonl", ROWS[:1])
    task = make_file_task(train, test, "numeric")
    assert task.name == "file:train"
    assert len(task.train) == 2 and len(task.test) == 1
    assert task.reward is numeric_match
    assert task.reward("it is 5", task.train[1]) == 1.0
    assert make_file_task(train, None, "exact_match").test == []
    with pytest.raises(ValueError, match="valid names"):
        make_file_task(train, test, "nope")
    with pytest.raises(ValueError, match="promt_key"):
        make_file_task(train, test, "numeric", promt_key="q")
