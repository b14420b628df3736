"""The comparison report (gspo.interface.report.build_report) on small hand-made run folders.

Each fake run has a config.json and a metrics.jsonl whose numbers are chosen so that the
report's means and standard errors can be worked out by hand.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from plotcheck import capture_plots

from gspo.interface.cli import main
from gspo.interface.report import (
    build_report,
    discover_runs,
    fmt_mean_se,
    group_runs,
    line_style,
    load_run,
    mean_se,
    read_config,
    smooth,
    smoothing_note,
    symlog_threshold,
    tail_mean,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
STEPS = 10


def fake_run(
    root: Path,
    name: str,
    *,
    algo: str,
    seed: int,
    reward: list[float],
    acc: tuple[float, float],
    clip: float,
    length: float = 5.0,
    config_json: bool = True,
    **config,
) -> Path:
    """A run folder with STEPS training records, evals at steps 0 and STEPS, and its config."""
    run = root / name
    run.mkdir(parents=True)
    cfg = {"algo": algo, "seed": seed, "output_dir": str(run), "task": "addition", "steps": STEPS}
    cfg.update(config)
    if config_json:
        (run / "config.json").write_text(json.dumps(cfg))
    else:  # only the config saved with a checkpoint
        state = run / "checkpoints" / f"step_{STEPS:06d}"
        state.mkdir(parents=True)
        (state / "state.json").write_text(json.dumps({"step": STEPS, "config": cfg}))
    rows = [{"step": 0, "eval/greedy_accuracy": acc[0], "eval/problems": 8}]
    for t in range(1, STEPS + 1):
        rows.append(
            {
                "step": t,
                "reward/mean": reward[t - 1],
                "response_length/mean": length,
                "clip/fraction": clip,
                "clip/seq_fraction": clip,
                "ratio/max": 1.0 + clip,
                "ratio/min": 1.0 - clip,
                "kl/old_new": "nan" if t == 1 else 1e-4,  # NaN stored as a string, skipped
                "time/rollout_s": 0.5,
                "time/train_s": 0.25,
            }
        )
    rows.append({"step": STEPS, "eval/greedy_accuracy": acc[1], "eval/problems": 8})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def ramp(start: float, slope: float) -> list[float]:
    return [start + slope * t for t in range(STEPS)]


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    """grpo x 3 seeds and gspo x 2 seeds, each seed with its own cold-start model path."""
    root = tmp_path / "runs"
    for seed, acc in zip((0, 1, 2), (0.5, 0.6, 0.7), strict=True):
        fake_run(
            root,
            f"grpo_seed{seed}",
            algo="grpo",
            seed=seed,
            reward=ramp(0.1 * seed, 0.01),
            acc=(0.2, acc),
            clip=0.001,
            model=f"sft/seed{seed}",
        )
    for seed, acc in zip((0, 1), (0.8, 0.9), strict=True):
        fake_run(
            root,
            f"gspo_seed{seed}",
            algo="gspo",
            seed=seed,
            reward=[0.5] * STEPS,
            acc=(0.2, acc),
            clip=0.1 * (seed + 1),
            length=3.0 + seed,
            model=f"sft/seed{seed}",
        )
    return root


def test_mean_se_and_tail_by_hand() -> None:
    mean, se, n = mean_se([0.5, 0.6, 0.7])
    assert n == 3
    assert mean == pytest.approx(0.6)
    assert se == pytest.approx(0.1 / math.sqrt(3))  # sample std 0.1
    assert mean_se([2.0]) == (2.0, 0.0, 1)
    assert math.isnan(mean_se([math.nan])[0])
    assert tail_mean([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 0.2) == pytest.approx(9.5)
    assert tail_mean([1, 2, 3], 0.01) == 3  # at least one value
    assert smooth([1.0, 3.0, 5.0], 2) == [1.0, 2.0, 4.0]
    assert fmt_mean_se(0.6, 0.057735) == "0.600 ± 0.058"
    assert fmt_mean_se(0.001, 0.0) == "1.00e-03 ± 0.000"


@pytest.mark.slow
def test_report_files_and_hand_computed_table(runs: Path, tmp_path: Path, monkeypatch) -> None:
    plots = capture_plots(monkeypatch)
    out = tmp_path / "report"
    report = build_report([runs], out, tail=0.2)
    assert set(report.summary.groups) == {"grpo", "gspo"}  # model follows the seed: no split

    for name in ("curves_vs_step.png", "curves_vs_time.png"):
        png = out / name
        assert png.read_bytes()[:8] == PNG_MAGIC
    # What the figures draw: held-out accuracy, mean over seeds, at steps 0 and 10 (grpo:
    # 0.2 then the mean of 0.5, 0.6, 0.7); the time axis is 0.75 s per step.
    step_plot, time_plot = plots["curves_vs_step.png"], plots["curves_vs_time.png"]
    acc = step_plot["held-out greedy accuracy"]
    assert acc["grpo (n=3)"] == ([0.0, 10.0], pytest.approx([0.2, 0.6]))
    assert acc["gspo (n=2)"] == ([0.0, 10.0], pytest.approx([0.2, 0.85]))
    assert time_plot["held-out greedy accuracy"]["grpo (n=3)"][0] == pytest.approx([0.0, 7.5])
    # Train reward, moving average over max(1, 10 // 25) = 1 step: the seeds' mean ramp.
    xs, ys = step_plot["train reward"]["grpo (n=3)"]
    assert xs == [float(t) for t in range(1, STEPS + 1)]
    assert ys == pytest.approx([0.1 + 0.01 * t for t in range(STEPS)])
    raw = sorted(p.name for p in (out / "raw").iterdir())
    assert len([p for p in raw if p.endswith(".jsonl")]) == 5
    assert "grpo_seed2.jsonl" in raw and "grpo_seed2.config.json" in raw
    assert (out / "raw" / "gspo_seed1.jsonl").read_text() == (
        runs / "gspo_seed1" / "metrics.jsonl"
    ).read_text()

    data = json.loads((out / "summary.json").read_text())
    # Run paths relative to the report folder: a committed report names no machine's folders.
    paths = data["groups"]["gspo"]["runs"]
    assert not any(Path(p).is_absolute() for p in paths)
    assert [(out / p).resolve() for p in paths] == [
        (runs / f"gspo_seed{k}").resolve() for k in range(len(paths))
    ]
    grpo = data["groups"]["grpo"]["columns"]
    gspo = data["groups"]["gspo"]["columns"]
    # Held-out accuracy at the end: the last eval of each seed.
    assert grpo["held-out acc. (end)"]["per_seed"] == [0.5, 0.6, 0.7]
    assert grpo["held-out acc. (end)"]["mean"] == pytest.approx(0.6)
    assert grpo["held-out acc. (end)"]["se"] == pytest.approx(0.1 / math.sqrt(3))
    # Reward at the end = mean of the last 20% (2) steps: 0.1 s + 0.085 for seed s.
    assert grpo["reward (end)"]["per_seed"] == pytest.approx([0.085, 0.185, 0.285])
    assert grpo["reward (end)"]["mean"] == pytest.approx(0.185)
    assert grpo["reward (end)"]["se"] == pytest.approx(0.1 / math.sqrt(3))
    # Whole-run reward: the ramp's mean, 0.1 s + 0.045.
    assert grpo["reward (whole run)"]["mean"] == pytest.approx(0.145)
    # gspo: clip fraction 0.1 and 0.2 -> 0.15 ± 0.05; length 3 and 4 -> 3.5 ± 0.5.
    assert gspo["clip fraction (end)"]["mean"] == pytest.approx(0.15)
    assert gspo["clip fraction (end)"]["se"] == pytest.approx(0.05)
    assert gspo["response length (end)"]["mean"] == pytest.approx(3.5)
    assert gspo["response length (end)"]["se"] == pytest.approx(0.5)
    assert gspo["ratio spread (end)"]["per_seed"] == pytest.approx([0.2, 0.4])
    assert grpo["response length (start)"]["mean"] == pytest.approx(5.0)
    # KL skips the NaN of step 1; wall time = 10 steps x 0.75 s.
    assert grpo["KL old/new (end)"]["mean"] == pytest.approx(1e-4)
    assert grpo["wall time s"]["per_seed"] == pytest.approx([7.5, 7.5, 7.5])

    md = (out / "summary.md").read_text()
    table = md[md.index("## End of training") : md.index("## Paired")]
    rows = {
        line.split("|")[1].strip(): line for line in table.splitlines() if line.startswith("| `")
    }
    grpo_cells = [c.strip() for c in rows["`grpo`"].split("|")[1:-1]]
    gspo_cells = [c.strip() for c in rows["`gspo`"].split("|")[1:-1]]
    header = next(line for line in md.splitlines() if line.startswith("| condition | seeds"))
    col = {name.strip(): i for i, name in enumerate(header.split("|")[1:-1])}
    assert grpo_cells[col["seeds"]] == "3"
    assert grpo_cells[col["held-out acc. (end)"]] == "0.600 ± 0.058"
    assert grpo_cells[col["held-out acc. (start)"]] == "0.200 ± 0.000"
    assert grpo_cells[col["reward (end)"]] == "0.185 ± 0.058"
    assert grpo_cells[col["clip fraction (end)"]] == "1.00e-03 ± 0.000"
    assert gspo_cells[col["held-out acc. (end)"]] == "0.850 ± 0.050"
    assert gspo_cells[col["clip fraction (end)"]] == "0.150 ± 0.050"
    assert gspo_cells[col["response length (end)"]] == "3.500 ± 0.500"
    assert "![against RL step](curves_vs_step.png)" in md
    # Paired by seed against grpo (seeds 0 and 1 shared): accuracy +0.3 on both seeds; clip
    # fraction ratios 0.1 / 0.001 and 0.2 / 0.001.
    paired = md[md.index("## Paired by seed, against `grpo`") : md.index("## Per run")]
    row = next(line for line in paired.splitlines() if line.startswith("| `gspo`"))
    cells = [c.strip() for c in row.split("|")[1:-1]]
    assert cells[1] == "0, 1"
    assert cells[2] == "0.300 ± 0.000"  # Δ held-out acc. (end)
    assert cells[-1] == "150.000 ± 50.000"  # ratio of clip fractions
    # The verdict line (gspo.core.comparison): +0.3 on both seeds is still "cannot tell" with
    # 2 seeds (a difference needs >= 10), and the line says why and gives the interval.
    verdict = next(x for x in paired.splitlines() if x.startswith("- held-out acc. (end): gspo"))
    assert "gspo - grpo: +0.300 ± 0.000" in verdict and "95% CI [+0.300, +0.300]" in verdict
    assert "cannot tell at this power" in verdict and "fewer than 10 seeds" in verdict
    other = build_report([runs], tmp_path / "ref", tail=0.2, reference="gspo")
    assert "against `gspo`" in other.markdown.read_text()
    with pytest.raises(ValueError, match="unknown reference"):
        build_report([runs], tmp_path / "bad", reference="ppo")
    assert "| `grpo` | 2 | 10 |" in md  # the per-run table: seed 2, 10 steps


def test_conditions_beyond_algo_get_their_own_group(tmp_path: Path) -> None:
    for seed in (0, 1):
        for clip in (None, 1e-3):
            fake_run(
                tmp_path,
                f"gspo_{clip}_{seed}",
                algo="gspo",
                seed=seed,
                reward=[0.5] * STEPS,
                acc=(0, 1),
                clip=0.1,
                clip_low=clip,
            )
    groups = group_runs([load_run(p) for p in discover_runs([tmp_path])])
    assert sorted(groups) == ["gspo clip_low=0.001", "gspo clip_low=default"]
    assert all([r.seed for r in g] == [0, 1] for g in groups.values())
    # The same cold start made in two folders adds `model` to the labels unless ignored.
    runs = [load_run(p) for p in discover_runs([tmp_path])]
    for run in runs:
        run.config["model"] = f"{'a' if run.config['clip_low'] else 'b'}/sft/seed{run.seed}"
    # Per-seed paths read the same once the seed is taken out: the seeds still pool.
    assert sorted(group_runs(runs)) == [
        "gspo clip_low=0.001 model=a/sft/seed<k>",
        "gspo clip_low=default model=b/sft/seed<k>",
    ]
    assert sorted(group_runs(runs, ignore=["model"])) == sorted(groups)


def test_config_from_checkpoint_state_and_clear_errors(tmp_path: Path) -> None:
    run = fake_run(
        tmp_path, "old", algo="luspo", seed=3, reward=[0.0] * STEPS, acc=(0, 0), clip=0.0,
        config_json=False,
    )  # fmt: skip
    assert read_config(run)["algo"] == "luspo"
    assert load_run(run).seed == 3

    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0.0}\n')
    with pytest.raises(ValueError, match="no run config found"):
        load_run(bare)
    with pytest.raises(FileNotFoundError, match=r"no metrics\.jsonl"):
        discover_runs([tmp_path / "old" / "checkpoints"])
    with pytest.raises(FileNotFoundError, match="no such run folder"):
        discover_runs([tmp_path / "missing"])

    twin = fake_run(
        tmp_path, "twin", algo="luspo", seed=3, reward=[0.0] * STEPS, acc=(0, 0), clip=0.0
    )
    with pytest.raises(ValueError, match="seed 3"):
        group_runs([load_run(run), load_run(twin)])


def test_cli_report(
    runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    plots = capture_plots(monkeypatch)
    out = tmp_path / "cli-report"
    assert (
        main(
            ["report", str(runs / "grpo_seed0"), str(runs / "gspo_seed0"), "--output-dir", str(out)]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "| `grpo` | 1 |" in printed and "| `gspo` | 1 |" in printed
    # The time plot draws both runs against their wall time, 0.75 s a step.
    xs, _ = plots["curves_vs_time.png"]["train reward"]["grpo (n=1)"]
    assert xs == pytest.approx([0.75 * t for t in range(1, STEPS + 1)])
    assert "gspo (n=1)" in plots["curves_vs_time.png"]["train reward"]
    assert main(["report", str(tmp_path / "nowhere")]) == 2
    assert "no such run folder" in capsys.readouterr().err


def paired_row(md: str, label: str) -> list[str]:
    paired = md[md.index("## Paired by seed") : md.index("## Per run")]
    row = next(line for line in paired.splitlines() if line.startswith(f"| `{label}`"))
    return [c.strip() for c in row.split("|")[1:-1]]


@pytest.mark.slow
def test_paired_table_without_evaluations_or_shared_seeds(tmp_path: Path) -> None:
    # The smoke preset evaluates nothing (eval_every 0): seeds still pair on the other columns.
    root = tmp_path / "runs"
    for algo in ("grpo", "gspo"):
        for seed in (0, 1):
            run = fake_run(
                root,
                f"{algo}{seed}",
                algo=algo,
                seed=seed,
                reward=ramp(0.1, 0.01),
                acc=(0, 0),
                clip=0.01,
            )
            rows = (run / "metrics.jsonl").read_text().splitlines()
            kept = [r for r in rows if "eval/" not in r]
            (run / "metrics.jsonl").write_text("\n".join(kept) + "\n")
    md = build_report([root], tmp_path / "r1").markdown.read_text()
    cells = paired_row(md, "gspo")
    assert cells[1] == "0, 1"
    assert cells[2] == "—"  # Δ held-out accuracy: not logged
    assert cells[3] == "0.000 ± 0.000"  # Δ reward (end)
    # No seed in common: no differences at all under "none".
    other = tmp_path / "other"
    for algo, seeds in (("grpo", (0, 1)), ("luspo", (5, 6))):
        for seed in seeds:
            fake_run(
                other,
                f"{algo}{seed}",
                algo=algo,
                seed=seed,
                reward=ramp(0.1, 0.01),
                acc=(0, 0.5),
                clip=0.01,
            )
    cells = paired_row(build_report([other], tmp_path / "r2").markdown.read_text(), "luspo")
    assert cells[1] == "none" and set(cells[2:]) == {"—"}


def test_log_panels_and_line_styles() -> None:
    assert symlog_threshold([0.0, 0.0, math.nan]) is None  # all zero: a linear axis
    assert symlog_threshold([0.0, 0.2, 0.03]) == pytest.approx(0.01)
    styles = [line_style(i) for i in range(12)]
    assert len(set(styles)) == 12  # every group of a 12-way comparison looks different
    assert len({s[0] for s in styles[:4]}) == 4 and len({s[1] for s in styles[:4]}) == 4


def _two_by_two(root: Path) -> None:
    """grpo and gspo x seeds 0 and 1, each seed with its own cold start, lr 1e-3."""
    for algo in ("grpo", "gspo"):
        for seed in (0, 1):
            fake_run(root, f"{algo}{seed}", algo=algo, seed=seed, reward=[0.5] * STEPS,
                     acc=(0, 1), clip=0.1, model=f"sft/seed{seed}", lr=1e-3)  # fmt: skip


@pytest.mark.parametrize(
    "extra, expected",
    [
        # Another lr on a seed of its own: not pooled with the others' seeds 0 and 1.
        (dict(seed=2, lr=1e-2, model="sft/seed2"), {"gspo lr=0.01": [2]}),
        # Another cold start on seed 0: the per-seed cold starts still pool seeds 0 and 1.
        (dict(seed=0, lr=1e-3, model="other/seed0"), {"gspo model=other/seed<k>": [0]}),
        # One more seed of the same settings joins its condition.
        (dict(seed=2, lr=1e-3, model="sft/seed2"), {}),
    ],
)
def test_one_extra_run_keeps_the_seeds_of_each_condition_pooled(tmp_path, extra, expected):
    _two_by_two(tmp_path)
    fake_run(tmp_path, "extra", algo="gspo", reward=[0.5] * STEPS, acc=(0, 1), clip=0.1, **extra)
    groups = group_runs([load_run(p) for p in discover_runs([tmp_path])])
    seeds = {label: [r.seed for r in runs] for label, runs in groups.items()}
    pooled = {label: s for label, s in seeds.items() if label not in expected}
    assert sorted(pooled.values()) == ([[0, 1], [0, 1, 2]] if not expected else [[0, 1], [0, 1]])
    assert {label: s for label, s in seeds.items() if label in expected} == expected


def test_a_mean_below_its_standard_error_prints_at_its_precision() -> None:
    assert fmt_mean_se(8.67e-19, 1e-3) == "0.000 ± 0.001"
    assert fmt_mean_se(-8.67e-19, 1e-3) == "0.000 ± 0.001"  # no "-0.000"
    assert fmt_mean_se(2e-6, 2.3e-4) == "0.0000 ± 0.0002"
    assert fmt_mean_se(5e-5, 1e-5) == "5.00e-05 ± 1.00e-05"  # measured: kept as it was
    assert fmt_mean_se(0.001, 0.0) == "1.00e-03 ± 0.000"


def test_log_panels_draw_zeros_at_zero_and_name_the_smoothing(tmp_path, monkeypatch) -> None:
    """A clip fraction of 0 on some steps is drawn at 0 on a symlog axis, never at a floor; a
    10-step run is not smoothed and the title does not call it a moving average."""
    from matplotlib.figure import Figure

    plots = capture_plots(monkeypatch)
    scales, titles = {}, []
    inner = Figure.savefig

    def spy(self, fname, *args, **kwargs):
        scales.update({ax.get_title(): ax.get_yscale() for ax in self.axes})
        titles.append(self.get_suptitle())
        return inner(self, fname, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", spy)
    run = fake_run(tmp_path / "runs", "r", algo="gspo", seed=0, reward=[0.5] * STEPS,
                   acc=(0, 1), clip=0.0)  # fmt: skip
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for r in rows:
        if r.get("step") == 5 and "clip/fraction" in r:
            r["clip/fraction"] = 0.02
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    build_report([run], tmp_path / "report")
    _, ys = plots["curves_vs_step.png"]["clipped-token fraction"]["gspo (n=1)"]
    assert ys == pytest.approx([0.0] * 4 + [0.02] + [0.0] * 5)
    assert scales["clipped-token fraction"] == "symlog"
    assert all("moving average" not in t and "not smoothed" in t for t in titles)
    assert smoothing_note(4) == "moving average over 4 steps"


def test_one_seed_says_n_1_instead_of_a_zero_standard_error():
    assert fmt_mean_se(0.5, 0.0, 1) == "0.500 (n = 1)"
    assert fmt_mean_se(0.6, 0.057735, 3) == "0.600 ± 0.058"
