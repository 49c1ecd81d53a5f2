"""Pictures of routing decisions: dropped patches (V-MoE Fig. 5) and expert-by-class heat maps (Fig. 8)."""

from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np

from moe_course.viz.images import _show


def show_dropped_patches(images: np.ndarray, kept: dict[str, np.ndarray], patch_size: int):
    """A grid: one column per image (n, H, W, C), one row per setting; dropped patches painted white.

    kept: {row title: (n, patches) bool, True where the patch was processed}, patches in row-major order.
    Returns the matplotlib Figure.
    """
    n, h, w, _ = images.shape
    fig, axes = plt.subplots(len(kept), n, figsize=(1.5 * n, 1.6 * len(kept)), squeeze=False)
    for row, (title, mask) in enumerate(kept.items()):
        grid = np.asarray(mask).reshape(n, h // patch_size, w // patch_size)
        for i in range(n):
            ax = axes[row, i]
            shown = images[i].copy()
            dropped = ~np.kron(grid[i], np.ones((patch_size, patch_size), bool))
            shown[dropped] = 1.0
            _show(ax, shown)
            ax.set_xticks([])
            ax.set_yticks([])
            if i == 0:
                ax.set_ylabel(title, fontsize=8)
    fig.tight_layout()
    return fig


def show_expert_class_heatmaps(tables: Sequence[np.ndarray], titles: Sequence[str],
                               class_names: Sequence[str] | None = None):
    """One heat map per MoE layer: rows = classes, columns = experts, colour = mean routing weight.

    tables: (classes, experts) arrays, e.g. from ``moe_course.analysis.routing.expert_class_weights``.
    Returns the matplotlib Figure.
    """
    fig, axes = plt.subplots(1, len(tables), figsize=(3.2 * len(tables), 3.0), squeeze=False)
    for ax, table, title in zip(axes[0], tables, titles):
        im = ax.imshow(table, cmap="viridis", aspect="auto")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("expert")
        ax.set_yticks(range(table.shape[0]))
        ax.set_yticklabels(class_names or range(table.shape[0]), fontsize=7)
        fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    return fig
