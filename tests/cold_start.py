"""Cold-start checkpoints for the learning tests (tests/data/cold_start/, made by the commands
in its README): the RL learning tests start from these files instead of running an SFT first.

A fresh 250-step SFT of a tiny model lands in very different places on different CPUs (float
reduction order): the same command and seed gave held-out greedy accuracy 0.25 on one machine
and 0.03 on another, and the RL tests calibrated on the first failed on the second. A stored
checkpoint gives every machine the same start.
"""

from __future__ import annotations

from pathlib import Path

DATA = Path(__file__).parent / "data" / "cold_start"
ADDITION_D64 = DATA / "addition_d64"
"""The default tiny model (hidden 64, 4 heads, 2 KV heads; head size 16), SFT seed 1, 250
steps: held-out greedy accuracy 0.555 at RL step 0 of the demo preset (200 problems)."""
ADDITION_D128 = DATA / "addition_d128"
"""Hidden 128, 4 heads, 2 KV heads (head size 32: the smallest vLLM's CPU attention runs), SFT
seed 2, 250 steps: held-out greedy accuracy 0.46 at RL step 0 of the demo preset."""
D128_SHAPE = ["--hidden-size", "128", "--num-heads", "4", "--num-kv-heads", "2"]
