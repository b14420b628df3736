"""Named presets: partial configs applied over the defaults (``--preset``).

Plain data; keys a config class does not have are skipped for it (``smoke`` also serves SFT).
"""

from __future__ import annotations

from typing import Any

PRESETS: dict[str, dict[str, Any]] = {
    # The README's main job: a tiny model on 2-digit addition, visible learning in minutes.
    "demo": dict(
        task="addition", steps=800, prompts_per_step=16, group_size=8, max_new_tokens=6, lr=1e-4
    ),
    # Seconds-long smoke runs for tests.
    "smoke": dict(
        hidden_size=32,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        n_train=64,
        n_test=8,
        steps=2,
        prompts_per_step=2,
        group_size=4,
        max_new_tokens=4,
        num_minibatches=2,
        eval_every=0,
        checkpoint_every=0,
        progress=False,
    ),
    # GSPO paper settings (arXiv 2507.18071 §5.1): 4 minibatches, clip 3e-4 / 4e-4, no KL.
    "gspo-paper": dict(algo="gspo", num_minibatches=4, clip_low=3e-4, clip_high=4e-4, kl_coef=0.0),
    # The paper's GRPO baseline ranges: 0.2 / 0.27.
    "grpo-paper": dict(algo="grpo", num_minibatches=4, clip_low=0.2, clip_high=0.27, kl_coef=0.0),
    # LUSPO with its paper ranges (clip-higher): 2e-3 / 2.5e-3.
    "luspo-paper": dict(algo="luspo", num_minibatches=4, clip_low=2e-3, clip_high=2.5e-3),
}
