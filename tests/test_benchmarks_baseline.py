"""``benchmarks/vs_trl.py --baseline REF``: the REF is checked, its worktree is made and removed,
its runs import gspo from that worktree, and the systems alternate rep by rep. The runs
themselves are faked (no training, no timing asserted)."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


def _git(repo: Path, *args: str) -> str:
    cmd = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args]
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    """A two-commit repository whose src/gspo says which commit it is."""
    if subprocess.run(["git", "--version"], capture_output=True).returncode != 0:
        pytest.skip("git is not installed")
    root = tmp_path / "repo"
    (root / "src" / "gspo").mkdir(parents=True)
    _git(root, "init", "-q")
    init = root / "src" / "gspo" / "__init__.py"
    init.write_text("WHICH = 'old'\n")
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "old")
    old = _git(root, "rev-parse", "--short", "HEAD")
    init.write_text("WHICH = 'new'\n")
    _git(root, "commit", "-q", "-am", "new")
    return root, old


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    for name in ("baseline", "vs_trl"):
        sys.modules.pop(name, None)
    baseline = importlib.import_module("baseline")
    vs_trl = importlib.import_module("vs_trl")
    yield baseline, vs_trl
    for name in ("baseline", "vs_trl"):
        sys.modules.pop(name, None)


def test_an_unknown_ref_is_one_line_and_exit_2(bench, repo, monkeypatch, capsys):
    baseline, vs_trl = bench
    monkeypatch.setattr(baseline, "REPO", repo[0])
    with pytest.raises(SystemExit) as exc:
        vs_trl.main(["--workloads", "d64-add", "--systems", "gspo", "--baseline", "nosuchref"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--baseline 'nosuchref': not a commit" in err


def test_worktree_holds_the_ref_and_is_removed(bench, repo):
    baseline, _ = bench
    root, old = repo
    ref = baseline.resolve(old, root)
    with baseline.worktree(ref, root) as path:
        assert (path / "src" / "gspo" / "__init__.py").read_text() == "WHICH = 'old'\n"
        assert str(path) in _git(root, "worktree", "list")
        # A subprocess given the worktree's src imports the old gspo, ahead of any installed one.
        env = baseline.env_with_src({"PATH": "/usr/bin:/bin"}, path / "src")
        code = "import gspo; print(gspo.WHICH, gspo.__file__)"
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        ).stdout.split()
        assert out[0] == "old" and out[1].startswith(str(path))
    assert not path.exists()
    assert str(path) not in _git(root, "worktree", "list")
    assert (root / "src" / "gspo" / "__init__.py").read_text() == "WHICH = 'new'\n"


def test_systems_alternate_with_their_baseline_twins(bench, repo, monkeypatch, tmp_path, capsys):
    baseline, vs_trl = bench
    root, old = repo
    monkeypatch.setattr(baseline, "REPO", root)
    calls: list[tuple[str, int, str, bool]] = []

    def fake_run(spec):
        src = Path(spec["gspo_src"])
        calls.append((spec["system"], spec["rep"], str(src), src.exists()))
        step_s = {"gspo": 1.0, f"gspo@{old}": 2.0, "trl": 4.0}[spec["system"]]
        keys = ("gen_tokens_per_s", "train_tokens_per_s", "rollout_s", "peak_rss_mb")
        return {
            **dict.fromkeys(keys, 1.0),
            "step_s": step_s,
            "recompute_s": None,
            "base_rss_mb": 1.0,
            "reward_last": 0.5,
            "held_out_greedy": None,
            "gen_tokens_per_step": 6.0,
            "clip_fraction": 0.0,
            "zero_adv_fraction": 0.0,
            "params": 1,
        }

    monkeypatch.setattr(vs_trl, "run_in_subprocess", fake_run)
    monkeypatch.setattr(vs_trl, "prepare_init", lambda w, t, c: ("init", {}))
    out = tmp_path / "out.json"
    argv = ["--workloads", "d64-add", "--systems", "gspo,trl", "--baseline", old]
    vs_trl.main([*argv, "--steps", "2", "--reps", "2", "--no-eval", "--out", str(out)])

    twin = f"gspo@{old}"
    assert [(s, r) for s, r, _, _ in calls] == [
        ("gspo", 0),
        (twin, 0),
        ("trl", 0),
        ("trl", 1),
        (twin, 1),
        ("gspo", 1),
    ]
    srcs = {s: (src, existed) for s, _, src, existed in calls}
    assert srcs["gspo"] == (str(root / "src"), True)
    worktree_src = Path(srcs[twin][0])
    assert srcs[twin][1] and worktree_src.name == "src" and worktree_src.parent.name == old
    assert not worktree_src.exists()  # removed after the run
    printed = capsys.readouterr().out
    assert "speed vs baseline" in printed
    row = next(line for line in printed.splitlines() if line.startswith("| d64-add | gspo |"))
    # Baseline 2 s/step over current 1 s/step in both rounds: 2x, an interval of zero width.
    assert row.rstrip(" |").endswith("| 4.00x (4.00-4.00) | 2.00x (2.00-2.00)")
    assert (
        f"d64-add gspo / {twin}: step speedup 2.00x, 95% CI 2.00-2.00x (±0.0%, 2 paired" in printed
    )
    report = json.loads(out.read_text())
    assert report["paired_ratios"]["d64-add"]["gspo"][f"vs {twin}"]["speedup_step"]["ci95"] == [
        pytest.approx(2.0),
        pytest.approx(2.0),
    ]
    assert [r["order"] for r in report["rounds"]["d64-add"]] == [
        ["gspo", twin, "trl"],
        ["trl", twin, "gspo"],
    ]
    assert report["rounds"]["d64-add"][1]["step_s"] == {"trl": 4.0, twin: 2.0, "gspo": 1.0}
    assert str(tmp_path) not in report["command"]  # --out's folder is named by its label


def test_combine_pairs_the_seeds_of_several_files(bench, tmp_path, capsys):
    """--combine merges runs split across calls by seed and compares them as one call would."""
    from gspo.core.comparison import compare_paired

    _, vs_trl = bench
    gspo = {0: 0.50, 1: 0.52, 2: 0.47, 3: 0.55}
    trl = {0: 0.49, 1: 0.50, 2: 0.48, 3: 0.51}

    def runs(seeds):
        return {
            "d64-add": {
                system: [
                    {"seed": s, "held_out_greedy": acc[s], "reward_last": acc[s] / 2} for s in seeds
                ]
                for system, acc in (("gspo", gspo), ("trl", trl))
            }
        }

    paths = []
    for name, seeds in (("a", [0, 1]), ("b", [2, 3])):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps({"runs": runs(seeds)}))
    out = tmp_path / "merged.json"
    vs_trl.main(["--combine", *map(str, paths), "--n-test", "800", "--out", str(out)])
    merged = json.loads(out.read_text())
    got = merged["learning"]["d64-add"]["held_out_greedy"][0]
    want = compare_paired(gspo, trl, names=("gspo", "trl"), problems=800).to_json()
    assert got == want and got["seeds"] == [0, 1, 2, 3]
    assert "held_out_greedy: gspo - trl" in capsys.readouterr().out
