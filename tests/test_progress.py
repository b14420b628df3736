"""The progress bars' ETA: time left at the phase's average rate (gspo.orchestration.logging.eta_s),
which is what the SFT and RL bars show. tqdm's default moving average of the last steps
forgets the slow evaluation steps between them and was off by up to 140% in the demo."""

from __future__ import annotations

import io

import pytest
from tqdm import tqdm

from gspo.config import TrainConfig
from gspo.config.combinations import split
from gspo.orchestration.logging import eta_s, progress_bar
from gspo.orchestration.loop import _progress


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
        cfg = split(TrainConfig(progress=True, algo="gspo", steps=800))
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
