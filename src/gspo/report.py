"""Plots and compact tables from a run's metrics.jsonl."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .logging import read_metrics


def train_records(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in history if "reward/mean" in r]


def eval_records(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in history if "eval/greedy_accuracy" in r]


def block_means(
    history: list[dict[str, Any]], key: str, blocks: int = 8
) -> list[tuple[int, int, float]]:
    """(first step, last step, mean of ``key``) over ``blocks`` equal blocks of training steps."""
    rows = [r for r in train_records(history) if key in r]
    if not rows:
        return []
    size = max(len(rows) // blocks, 1)
    out = []
    for i in range(0, len(rows), size):
        chunk = rows[i : i + size]
        out.append((chunk[0]["step"], chunk[-1]["step"], sum(r[key] for r in chunk) / len(chunk)))
    return out


def curve_table(history: list[dict[str, Any]], blocks: int = 8) -> str:
    """A Markdown table of reward, response length and clip fraction over blocks of steps."""
    keys = ("reward/mean", "response_length/mean", "clip/fraction")
    cols = {k: block_means(history, k, blocks) for k in keys}
    lines = ["| steps | reward | response length | clip fraction |", "|---|---|---|---|"]
    for i, (a, b, r) in enumerate(cols["reward/mean"]):
        length = cols["response_length/mean"][i][2]
        clip = cols["clip/fraction"][i][2] if i < len(cols["clip/fraction"]) else float("nan")
        lines.append(f"| {a}-{b} | {r:.3f} | {length:.2f} | {clip:.3f} |")
    return "\n".join(lines)


def plot_run(history: list[dict[str, Any]], path: str | Path, title: str = "") -> Path:
    """PNG with reward, held-out accuracy and response length against step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = train_records(history)
    evals = eval_records(history)
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    steps = [r["step"] for r in train]
    axes[0].plot(
        steps, [r["reward/mean"] for r in train], alpha=0.35, label="train reward (per step)"
    )
    smooth = block_means(history, "reward/mean", blocks=max(len(train) // 10, 1))
    axes[0].plot(
        [(a + b) / 2 for a, b, _ in smooth],
        [m for *_, m in smooth],
        label="train reward (block mean)",
    )
    if evals:
        axes[0].plot(
            [r["step"] for r in evals],
            [r["eval/greedy_accuracy"] for r in evals],
            "o-",
            label="held-out greedy accuracy",
        )
    axes[0].set_xlabel("RL step")
    axes[0].set_ylim(-0.02, 1.02)
    axes[0].legend(fontsize=8)
    axes[0].set_title("reward")
    axes[1].plot(steps, [r["response_length/mean"] for r in train], label="mean response length")
    axes[1].set_xlabel("RL step")
    axes[1].set_ylabel("tokens")
    axes[1].set_title("response length")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_metrics_file(metrics_path: str | Path, out: str | Path) -> Path:
    return plot_run(read_metrics(metrics_path), out)
