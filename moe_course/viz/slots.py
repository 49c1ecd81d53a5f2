"""Pictures of Soft MoE slots: which patches each slot averages (Puigcerver et al., Fig. 10)."""

from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np

from moe_course.viz.images import _show


def show_slot_weights(images: np.ndarray, dispatch_weights: np.ndarray, patch_size: int, slots: Sequence[int], *,
                      slots_per_expert: int = 1, title: str = "", cmap: str = "magma"):
    """One row per image (n, H, W, C): the image, then for each slot in ``slots`` the image under a heat map of
    that slot's dispatch weights over the patches (D[:, j], summing to 1 over the patches), in %.

    dispatch_weights: (n, patches, slots) float, patches row-major (no class token). All heat maps share one
    colour scale, explained by the colour bar. Returns the matplotlib Figure.
    """
    n, h, w, _ = images.shape
    grid = (h // patch_size, w // patch_size)
    weights = 100 * np.asarray(dispatch_weights)[..., list(slots)]  # (n, patches, len(slots)), in %
    vmax = float(weights.max())
    fig, axes = plt.subplots(n, len(slots) + 1, figsize=(1.45 * (len(slots) + 1) + 0.9, 1.5 * n), squeeze=False)
    for i in range(n):
        _show(axes[i, 0], images[i])
        axes[i, 0].set_title("input" if i == 0 else "", fontsize=8)
        for col, j in enumerate(slots, start=1):
            ax = axes[i, col]
            _show(ax, images[i])
            heat = np.kron(weights[i, :, col - 1].reshape(grid), np.ones((patch_size, patch_size)))
            shown = ax.imshow(heat, cmap=cmap, alpha=0.6, vmin=0, vmax=vmax)
            if i == 0:
                ax.set_title(f"slot {j} (expert {j // slots_per_expert})", fontsize=8)
        for ax in axes[i]:
            ax.set_xticks([])
            ax.set_yticks([])
    fig.colorbar(shown, ax=axes, fraction=0.03, pad=0.02, label="dispatch weight of the patch (% of the slot)")
    if title:
        fig.suptitle(title, fontsize=9)
    return fig
