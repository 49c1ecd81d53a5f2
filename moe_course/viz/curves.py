"""Training curves from a run's metric history."""

from __future__ import annotations

import matplotlib.pyplot as plt


def plot_history(history: list[dict], keys: tuple[str, ...] = ("task_loss", "accuracy", "val_accuracy")):
    """One panel per metric against the step (x: optimizer steps). Returns the matplotlib Figure."""
    keys = [k for k in keys if any(k in h for h in history)]
    fig, axes = plt.subplots(1, len(keys), figsize=(4 * len(keys), 3), squeeze=False)
    for ax, key in zip(axes[0], keys):
        points = [(h["step"], h[key]) for h in history if key in h]
        ax.plot(*zip(*points), marker="." if len(points) < 30 else None)
        ax.set_xlabel("step")
        ax.set_title(key)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig
