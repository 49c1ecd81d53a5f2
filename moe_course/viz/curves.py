"""Training curves from a run's metric history."""

from __future__ import annotations

import matplotlib.pyplot as plt

# (panel title, y label, [(history key, legend label)]): training metrics are means over the training batches
# of each logging window; validation metrics are measured on the whole validation split.
_PANELS = (
    ("Loss", "cross-entropy (nats)",
     [("task_loss", "training batches"), ("val_loss", "validation split")]),
    ("Accuracy", "accuracy (fraction correct)",
     [("accuracy", "training batches"), ("val_accuracy", "validation split")]),
    ("Auxiliary loss (load balancing)", "aux loss (weighted)", [("aux_loss", "training batches")]),
)


def plot_history(history: list[dict], title: str | None = None):
    """Loss and accuracy against the optimizer step, training batches and validation split in one panel each.

    history: the ``TrainResult.history`` records (step, task_loss, accuracy, aux_loss, val_loss, val_accuracy,
    ...). The auxiliary-loss panel appears only for models that have one (a nonzero aux_loss). Returns the
    matplotlib Figure.
    """
    panels = []
    for name, ylabel, series in _PANELS:
        present = [(key, label) for key, label in series if any(h.get(key) for h in history)]
        if present:
            panels.append((name, ylabel, present))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.2), squeeze=False)
    for ax, (name, ylabel, series) in zip(axes[0], panels):
        for key, label in series:
            points = [(h["step"], h[key]) for h in history if key in h]
            ax.plot(*zip(*points), marker="o" if len(points) < 30 else None, ms=3, label=label)
        ax.set_title(name)
        ax.set_xlabel("optimizer step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if len(series) > 1:
            ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig
