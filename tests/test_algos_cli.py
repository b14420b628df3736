"""`gspo algos` lists the registry; `gspo compare` runs the objectives of gspo.core.losses_family."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gspo.core.losses import LOSSES
from gspo.interface.cli import main


def test_algos_lists_every_registered_objective(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["algos", "--markdown"]) == 0
    table = capsys.readouterr().out
    names = [n for n in LOSSES if not n.startswith("test_")]
    paper = {"grpo", "gspo", "luspo", "gspo_token", "cispo", "sapo", "sapo_seq", "gmpo"}
    assert paper <= set(names)  # a new objective adds a row; no count to update
    for name in names:
        row = next(line for line in table.splitlines() if line.startswith(f"| {name} |"))
        spec = LOSSES[name]
        assert spec.default_aggregation in row and spec.source.split(",")[0] in row
    assert "IS weight clamped to [0, 5]" in table  # CISPO's cap, spelled out
    assert "log r in [-0.4, 0.4]" in table and "no clip" in table
    assert main(["algos", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    by_name = {r["name"]: r for r in rows}
    assert by_name["sapo"]["options"] == {"tau_pos": 1.0, "tau_neg": 1.05}
    assert by_name["sapo"]["clip_low"] is None
    assert by_name["grpo"]["options"] == {"dual_clip": None}
    assert (by_name["gspo"]["clip_low"], by_name["gspo"]["clip_high"]) == (3e-4, 4e-4)


def test_compare_runs_the_new_objectives(tmp_path: Path, capsys) -> None:
    out = tmp_path / "cmp"
    code = main(
        ["compare", "--algos", "cispo,sapo,sapo_seq,gmpo", "--seeds", "1", "--preset", "smoke",
         "--device", "cpu", "--output-dir", str(out)]
    )  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    for name in ("cispo", "sapo", "sapo_seq", "gmpo"):
        assert f"| `{name}` | 1 |" in printed


def test_algos_prints_a_terminal_table_by_default(capsys):
    assert main(["algos"]) == 0
    out = capsys.readouterr().out
    assert "| algo |" not in out  # no raw Markdown in a terminal
    for name in ("grpo", "gspo", "luspo", "cispo"):
        assert f"\n{name}\n" in f"\n{out}"
    assert "  default clip" in out and "IS weight clamped to [0, 5]" in out
