"""Data checks (issue 36): duplicate prompts and train/test overlap counted for every task and
dropped with ``dedupe``; training's context rules on held-out prompts (truncated under
``long_prompts truncate``, no longer all skipped) and in ``gspo eval``; a held-out set left empty
stops the run; multi-turn runs leave ``max_total_tokens`` after the prompt."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from gspo.compose.parts import build_task
from gspo.compose.prompts import fit_text, prepare_prompts, run_prompt_limit
from gspo.config import SFTConfig, TrainConfig
from gspo.config.fields import compose
from gspo.envs.tasks.base import Example, Task
from gspo.envs.tasks.checks import EmptyHeldOutError, check_duplicates
from gspo.interface.cli import main


class CharFormat:
    """A prompt format of one token per character after a BOS (``wrap``: a template's text)."""

    def __init__(self, wrap: tuple[str, str] = ("", "")) -> None:
        self.wrap = wrap

    def encode(self, prompts: list[str]) -> list[list[int]]:
        return [[1] + [ord(c) for c in self.wrap[0] + p + self.wrap[1]] for p in prompts]


TOKENIZER = SimpleNamespace(unk_token_id=None, bos_token_id=1, eos_token_id=2)


def model_of(context: int):
    return SimpleNamespace(config=SimpleNamespace(max_position_embeddings=context))


def ex(prompt: str, answer: str = "2") -> Example:
    return Example(prompt=prompt, answer=answer)


def task_of(train: list[str], test: list[str]) -> Task:
    return Task("t", [ex(p) for p in train], [ex(p) for p in test], reward=lambda c, e: 0.0)


# --- duplicates -----------------------------------------------------------------------------


def test_duplicates_and_overlap_are_counted_and_kept_by_default(capsys):
    task = task_of(["1+1=", "2+2=", "1+1= ", "3+3="], ["2+2=", "4+4=", "4+4="])
    checked = check_duplicates(task)
    assert checked.data_checks == {
        "data/duplicates": 1,  # "1+1= " repeats "1+1=" (whitespace does not count)
        "data/test_duplicates": 1,
        "data/train_test_overlap": 1,  # "2+2=" is in both splits
    }
    assert checked.train == task.train and checked.test == task.test  # report only
    assert "1 duplicate training problems" in capsys.readouterr().err


def test_dedupe_drops_repeats_and_held_out_rows_seen_in_training():
    task = task_of(["1+1=", "2+2=", "1+1=", "3+3="], ["2+2=", "4+4=", "4+4=", "5+5="])
    checked = check_duplicates(task, dedupe=True)
    assert [e.prompt for e in checked.train] == ["1+1=", "2+2=", "3+3="]
    assert [e.prompt for e in checked.test] == ["4+4=", "5+5="]
    assert checked.data_checks["data/train_test_overlap"] == 1


def test_a_task_names_its_problem_when_every_prompt_is_the_same():
    # A game whose opening comes from the environment's reset has one prompt for every row:
    # its rows are told apart by meta["problem"] (the seed), not reported as repeats.
    def game(seed: int) -> Example:
        return Example(prompt="play", answer="", meta={"problem": f"seed {seed}"})

    checked = check_duplicates(Task("g", [game(0), game(1), game(1)], [game(2), game(0)], None))
    assert checked.data_checks == {
        "data/duplicates": 1,
        "data/test_duplicates": 0,
        "data/train_test_overlap": 1,
    }


def test_clean_data_prints_nothing(capsys):
    assert check_duplicates(task_of(["1+1="], ["2+2="])).data_checks["data/duplicates"] == 0
    assert capsys.readouterr().err == ""


def write_rows(path, prompts: list[str]) -> str:
    path.write_text("".join(json.dumps({"prompt": p, "answer": "2"}) + "\n" for p in prompts))
    return str(path)


def file_cfg(tmp_path, train: list[str], test: list[str], cls=TrainConfig, **kw):
    return compose(
        cls,
        dict(
            device="cpu",
            output_dir=str(tmp_path / "run"),
            task="file",
            train_file=write_rows(tmp_path / "train.jsonl", train),
            test_file=write_rows(tmp_path / "test.jsonl", test),
            reward="exact_match",
            **kw,
        ),
    )


def test_file_task_reports_duplicates_and_dedupe_drops_them(tmp_path):
    train, test = ["1+1=", "1+1=", "2+2="], ["2+2=", "3+3="]
    task = build_task(file_cfg(tmp_path, train, test))
    assert task.data_checks["data/duplicates"] == 1
    assert task.data_checks["data/train_test_overlap"] == 1
    assert len(task.train) == 3 and len(task.test) == 2
    task = build_task(file_cfg(tmp_path, train, test, dedupe=True))
    assert [e.prompt for e in task.train] == ["1+1=", "2+2="]
    assert [e.prompt for e in task.test] == ["3+3="]


@pytest.mark.parametrize("cls", [TrainConfig, SFTConfig])
def test_held_out_set_emptied_by_dedupe_stops_the_run(tmp_path, cls):
    cfg = file_cfg(tmp_path, ["1+1=", "2+2="], ["2+2=", "1+1="], cls=cls, dedupe=True)
    with pytest.raises(EmptyHeldOutError, match="held-out set is empty: dedupe dropped all 2"):
        build_task(cfg)


def test_held_out_file_of_malformed_rows_only_stops_the_run(tmp_path):
    cfg = file_cfg(tmp_path, ["1+1="], ["2+2="], bad_rows="skip")
    (tmp_path / "test.jsonl").write_text('{"prompt": "", "answer": "2"}\n')
    with pytest.raises(EmptyHeldOutError, match=r"every row of .*test\.jsonl was skipped"):
        build_task(cfg)


def test_procedural_task_repeats_are_reported_not_dropped():
    # 1-digit addition has 100 problems, fewer in its train split: 300 draws must repeat.
    task = build_task(TrainConfig.of(task="addition", difficulty=1, n_train=300, n_test=5))
    assert task.data_checks["data/duplicates"] > 0
    assert task.data_checks["data/train_test_overlap"] == 0  # the splits never share a problem
    assert len(task.train) == 300  # the default is report-only: training draws as before


# --- context rules ----------------------------------------------------------------------------


def prepare(cfg: TrainConfig, task: Task, context: int = 64, multi_turn: bool = False):
    return prepare_prompts(cfg, task, CharFormat(), TOKENIZER, model_of(context), multi_turn)


def test_truncate_keeps_long_held_out_prompts_cut_to_the_limit(capsys):
    # The reported bug: under truncate every long held-out row was skipped (test_problems 0).
    cfg = TrainConfig.of(max_new_tokens=8, long_prompts="truncate")
    task = task_of(["1+1="], ["x" * 100 + "1+1=", "2+2="])
    _, _, test_set, data = prepare(cfg, task)
    assert data["data/test_problems"] == 2 and data["data/test_prompts_truncated"] == 1
    assert data["data/test_prompts_skipped"] == 0
    cut = test_set[0].prompt
    assert cut.endswith("1+1=") and len(CharFormat().encode([cut])[0]) == 64 - 8
    assert "1 held-out prompts truncated" in capsys.readouterr().err


def test_held_out_set_left_empty_by_the_limit_stops_the_run():
    cfg = TrainConfig.of(max_new_tokens=8, long_prompts="skip")
    task = task_of(["1+1="], ["x" * 100])
    with pytest.raises(EmptyHeldOutError, match="all 1 held-out prompts are over"):
        prepare(cfg, task)
    cfg = TrainConfig.of(max_new_tokens=8, long_prompts="skip", eval_every=0)  # no evaluation
    assert prepare(cfg, task)[3]["data/test_prompts_skipped"] == 1


def test_multi_turn_prompts_leave_room_for_max_total_tokens():
    assert run_prompt_limit(0, 8, 40, False, model_of(64))[0] == 56
    limit, named = run_prompt_limit(0, 8, 40, True, model_of(64))
    assert limit == 24 and "max_total_tokens=40" in named
    cfg = TrainConfig.of(max_new_tokens=8, max_total_tokens=40)
    task = task_of(["y" * 30], ["1+1="])
    prepare(cfg, task)  # one turn: 31 tokens + 8 fit in 64
    with pytest.raises(ValueError, match=r"training problem 0 has a 31-token prompt.*max_total"):
        prepare(cfg, task, multi_turn=True)  # 31 + 40 do not
    with pytest.raises(ValueError, match="max_total_tokens=64 leaves no room"):
        run_prompt_limit(0, 8, 64, True, model_of(64))


def test_fit_text_keeps_the_template_and_the_longest_end():
    fmt = CharFormat(("<user>", "</user>"))
    text = fit_text(fmt, "abcdefghij", 1 + 13 + 4)
    assert text == "ghij"
    assert fit_text(fmt, "abc", 100) == "abc"
    assert fit_text(fmt, "abc", 5) is None  # the template alone is over the limit


# --- gspo eval ------------------------------------------------------------------------------

LONG = "1+" * 200 + "1="  # 402 characters against the tiny model's 256 positions


def eval_argv(tmp_path, *extra: str) -> list[str]:
    data = write_rows(tmp_path / "eval.jsonl", ["1+1=", LONG, "2+2="])
    return [
        "eval", "--model", "tiny", "--data", data, "--reward", "exact_match",
        "--samples", "0", "--max-new-tokens", "3", "--hidden-size", "32", "--num-layers", "1",
        "--device", "cpu", "--output", str(tmp_path / "eval.json"), "--progress", "false",
        *extra,
    ]  # fmt: skip


def test_gspo_eval_refuses_a_prompt_past_the_context_naming_its_row(tmp_path, capsys):
    assert main(eval_argv(tmp_path)) == 2
    err = capsys.readouterr().err.strip()
    lines = [x for x in err.splitlines() if x.startswith("gspo eval")]  # (datasets' bar aside)
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "eval.jsonl row 1 has a 403-token prompt" in err
    assert "256-token context" in err and "long_prompts" in err


@pytest.mark.parametrize("policy, problems", [("skip", 2), ("truncate", 3)])
def test_gspo_eval_skips_or_truncates_and_counts(tmp_path, capsys, policy, problems):
    assert main(eval_argv(tmp_path, "--long-prompts", policy)) == 0
    report = json.loads((tmp_path / "eval.json").read_text())
    assert report["metrics"]["problems"] == problems
    assert report["prompts"][f"prompts_{policy}{'ped' if policy == 'skip' else 'd'}"] == 1
    assert "over the 253 tokens" in capsys.readouterr().err


def test_gspo_eval_long_prompts_typo_is_one_line(capsys):
    assert main(["eval", "--long-prompts", "truncat"]) == 2
    assert "did you mean 'truncate'" in capsys.readouterr().err


def test_a_constant_opening_prompt_is_one_problem_per_answer():
    # Environments like guess open every game with one prompt; their answers tell games apart.
    task = Task("g", [ex("guess 1-16:", "3"), ex("guess 1-16:", "5")], [ex("guess 1-16:", "3")],
                reward=lambda c, e: 0.0)  # fmt: skip
    counts = check_duplicates(task).data_checks
    assert counts["data/duplicates"] == 0 and counts["data/train_test_overlap"] == 1


def test_training_refusal_names_the_held_out_file_row(tmp_path):
    cfg = file_cfg(tmp_path, ["1+1="], ["2+2=", "x" * 100], max_new_tokens=8)
    task = build_task(cfg)
    with pytest.raises(ValueError, match=r"test\.jsonl row 1 has a 101-token prompt"):
        prepare(cfg, task)


def test_gspo_train_dedupe_emptying_the_held_out_set_exits_2(tmp_path, capsys):
    data = write_rows(tmp_path / "rows.jsonl", ["1+1=", "2+2="])
    argv = [
        "train", "--preset", "smoke", "--task", "file", "--train-file", data, "--test-file", data,
        "--reward", "exact_match", "--dedupe", "true", "--eval-every", "2", "--device", "cpu",
        "--threads", "1",
        "--output-dir", str(tmp_path / "run"), "--progress", "false",
    ]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "gspo train: error: the held-out set is empty: dedupe dropped all 2" in err
    assert "Traceback" not in err


def test_truncated_training_prompts_are_said_in_their_own_line(capsys):
    cfg = TrainConfig.of(max_new_tokens=8, long_prompts="truncate")
    task = task_of(["x" * 100 + "1+1=", "2+2="], ["3+3="])
    _, _, _, data = prepare(cfg, task)
    assert data["data/prompts_truncated"] == 1
    assert "data: 1 training prompts truncated, 0 skipped" in capsys.readouterr().err
