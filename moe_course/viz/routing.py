"""Pictures of routing decisions: dropped patches (V-MoE Fig. 5) and expert-by-class heat maps (Fig. 8)."""

from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import to_rgba
from matplotlib.patches import Patch, Rectangle

from moe_course.viz.images import _show


def show_dropped_patches(images: np.ndarray, kept: dict[str, np.ndarray], patch_size: int, *,
                         titles: Sequence[str] | None = None, boxes: np.ndarray | None = None,
                         show_counts: bool = False, color: str = "tab:red", alpha: float = 0.6,
                         legend: str = "dropped patch (all its expert choices dropped)"):
    """A grid: one column per image (n, H, W, C), one row per setting; dropped patches tinted with ``color``.

    kept: {row title: (n, patches) bool, True where the patch was processed}, patches in row-major order.
    titles: one per image (e.g. its class), written over the first row. boxes: (n, 4) object boxes (top, left,
    h, w) in pixels, drawn in green. show_counts: write "kept/total" under every panel. The tint is translucent
    so the content of a dropped patch stays visible. legend: what the tint means (Mixture-of-Depths: a patch that
    skips the block). Returns the matplotlib Figure.
    """
    n, h, w, _ = images.shape
    rgba = np.array(to_rgba(color, alpha))
    fig, axes = plt.subplots(len(kept), n, figsize=(1.45 * n + 0.8, 1.5 * len(kept) + 0.5), squeeze=False)
    for row, (row_title, mask) in enumerate(kept.items()):
        grid = np.asarray(mask).reshape(n, h // patch_size, w // patch_size)
        for i in range(n):
            ax = axes[row, i]
            _show(ax, images[i])
            dropped = ~np.kron(grid[i], np.ones((patch_size, patch_size), bool))
            ax.imshow(dropped[..., None] * rgba)
            if boxes is not None:
                top, left, bh, bw = boxes[i]
                ax.add_patch(Rectangle((left - 0.5, top - 0.5), bw, bh, fill=False, ec="tab:green", lw=1.2))
            if show_counts:
                ax.set_xlabel(f"{int(grid[i].sum())}/{grid[i].size} kept", fontsize=8)
            ax.set_xticks([])
            ax.set_yticks([])
            if i == 0:
                ax.set_ylabel(row_title, fontsize=10)
            if row == 0 and titles is not None:
                ax.set_title(titles[i], fontsize=10)
    fig.legend(handles=[Patch(color=color, alpha=alpha, label=legend)],
               loc="lower center", ncol=1, fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return fig


def show_expert_class_heatmaps(tables: Sequence[np.ndarray], titles: Sequence[str],
                               class_names: Sequence[str] | None = None):
    """One heat map per MoE layer: rows = classes, columns = experts, colour = mean routing weight.

    tables: (classes, experts) arrays, e.g. from ``moe_course.analysis.routing.expert_class_weights``. All
    panels share one colour scale, so a stronger pattern in one layer is visible as such. Returns the Figure.
    """
    vmin = min(float(t.min()) for t in tables)
    vmax = max(float(t.max()) for t in tables)
    fig, axes = plt.subplots(1, len(tables), figsize=(3.4 * len(tables) + 1.0, 3.2), squeeze=False)
    for ax, table, title in zip(axes[0], tables, titles):
        im = ax.imshow(table, cmap="viridis", aspect="auto", vmin=vmin, vmax=vmax)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("expert")
        ax.set_xticks(range(table.shape[1]))
        ax.set_ylabel("class")
        ax.set_yticks(range(table.shape[0]))
        ax.set_yticklabels(class_names or range(table.shape[0]), fontsize=8)
    fig.tight_layout()
    fig.colorbar(im, ax=list(axes[0]), label="mean routing weight (gate)", fraction=0.03, pad=0.03)
    return fig
