"""The progress bars' ETA: time left at the phase's average rate (gspo.orchestration.logging.eta_s),
which is what the SFT and RL bars show. tqdm's default moving average of the last steps
forgets the slow evaluation steps between them and was off by up to 140% in the demo."""

from __future__ import annotations

import io

import pytest
from tqdm import tqdm

from gspo.config import TrainConfig
from gspo.orchestration.logging import eta_s, progress_bar
from gspo.orchestration.loop import _progress
from gspo.orchestration.phases import Phase, PhasedBar, phased_eta


def test_eta_arithmetic():
    assert eta_s(60.0, 400, 800) == 60.0  # half done in a minute: a minute left
    assert eta_s(30.0, 100, 400) == 90.0
    assert eta_s(12.0, 300, 300) == 0.0  # done
    assert eta_s(5.0, 0, 300) is None  # nothing to extrapolate from yet


def test_a_slow_evaluation_step_counts_in_the_eta():
    # 24 fast steps of 0.1 s, then one of 10 s (a held-out evaluation): the average rate
    # carries the slow step over the 75 steps left; a moving average of recent steps would not.
    elapsed = 24 * 0.1 + 10.0
    assert eta_s(elapsed, 25, 100) == pytest.approx(12.4 / 25 * 75)


def _shown_remaining(bar, elapsed_s: float, n: int) -> str:
    """The 'elapsed<remaining' text the bar prints at n steps after elapsed_s seconds."""
    meter = dict(bar.format_dict, elapsed=elapsed_s, n=n)
    text = tqdm.format_meter(**meter)
    return text.split("<", 1)[1].split(",", 1)[0]


@pytest.mark.parametrize("make", ["sft", "rl"])
def test_the_bars_show_the_average_rate_eta(make):
    if make == "sft":
        bar = progress_bar(800, desc="sft", file=io.StringIO())
    else:
        cfg = TrainConfig.of(progress=True, algo="gspo", steps=800)
        bar = _progress(cfg, 0, 800)
        bar.fp = io.StringIO()
    for _ in range(5):
        bar.last_print_t -= 1.0  # each update a second after the last: tqdm takes its rate
        bar.update(1)
    # a moving average (tqdm's default smoothing) would hold its own rate here
    assert bar.smoothing == 0 and bar.format_dict["rate"] is None
    assert _shown_remaining(bar, 60.0, 400) == tqdm.format_interval(eta_s(60.0, 400, 800))
    assert _shown_remaining(bar, 30.0, 100) == "03:30"  # 30 s / 100 x 700 left
    bar.close()


def test_the_demo_eta_counts_the_phases_still_to_come():
    # SFT steps cost 1.6 RL steps: 25 of 100 SFT steps in 10 s is 0.25 s per unit of 100; the
    # 75 SFT steps left (12,000 units) and 400 RL steps (40,000 units) take 130 s more.
    phases = [Phase("SFT", 100, 1.6), Phase("GSPO", 400, 1.0)]
    per_unit = 10.0 / (25 * phases[0].units)
    assert phased_eta(phases, 0, [25, 0], per_unit) == pytest.approx(10.0 / 25 * 75 + 400 * 0.25)
    # In the last phase only its own steps are left.
    assert phased_eta(phases, 1, [100, 300], 0.5 / 100) == pytest.approx(50.0)


def _fake_clock(monkeypatch, clock: list[float]) -> None:
    monkeypatch.setattr("gspo.orchestration.phases.time.perf_counter", lambda: clock[0])


def test_progress_bar_inside_a_phase_is_a_view_of_the_one_bar(monkeypatch):
    clock = [0.0]
    _fake_clock(monkeypatch, clock)
    phases = [Phase("SFT", 100, 1.6), Phase("GSPO", 400, 1.0)]
    with PhasedBar(phases, file=io.StringIO()) as one:
        with one.phase("SFT"):
            bar = progress_bar(100, desc="sft")
            assert not isinstance(bar, tqdm)
            for _ in range(25):  # 25 SFT steps in 10 s
                clock[0] += 0.4
                bar.update(1)
                bar.set_postfix(loss="0.5")
            bar.close()
            shown = one.bar.format_dict
            # the whole demo's time left, not the SFT bar's 30 s
            assert shown["n"] == 25 * 160 and shown["total"] == 100 * 160 + 400 * 100
            left = (shown["total"] - shown["n"]) / shown["rate"]
            assert left == pytest.approx(10.0 / 25 * 75 + 400 * 0.25)
            assert "[1/2] SFT 25/100, loss=0.5" in str(one.bar)
        assert phases[0].steps == 100
        with one.phase("GSPO"):
            clock[0] = 100.0  # SFT's other 75 steps ran elsewhere: a resumed RL run
            bar = progress_bar(400, desc="gspo", initial=300)
            clock[0] += 1.0
            bar.update(1)  # one RL step in 1 s: 99 s left
            shown = one.bar.format_dict
            assert (shown["total"] - shown["n"]) / shown["rate"] == pytest.approx(99.0)
            assert "[2/2] GSPO 301/400" in str(one.bar)
    # outside it, a plain tqdm bar again
    plain = progress_bar(10, desc="sft", file=io.StringIO())
    assert isinstance(plain, tqdm)
    plain.close()
