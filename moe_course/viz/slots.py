"""Pictures of Soft MoE slots: which patches each slot averages (Puigcerver et al., Fig. 10)."""

from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np

from moe_course.viz.images import _show


def show_slot_weights(images: np.ndarray, dispatch_weights: np.ndarray, patch_size: int, slots: Sequence[int], *,
                      slots_per_expert: int = 1, title: str = "", cmap: str = "RdBu_r"):
    """One row per image (n, H, W, C): the image, then for each slot in ``slots`` a map of that slot's dispatch
    weights over the patches (D[:, j], summing to 1 over the patches) minus the uniform share 1/patches, in
    percentage points.

    dispatch_weights: (n, patches, slots) float, patches row-major (no class token). The maps are drawn beside
    the image, not over it, on one fixed diverging colour scale for all maps: white is a patch the slot weighs like
    any other, full blue a patch it ignores (weight 0), full red a patch with twice the uniform share or more --
    so a near-uniform slot looks pale instead of being stretched to full colour. Returns the matplotlib Figure.
    """
    n, h, w, _ = images.shape
    grid = (h // patch_size, w // patch_size)
    weights = np.asarray(dispatch_weights)[..., list(slots)]  # (n, patches, len(slots))
    uniform = 100 / weights.shape[1]
    excess = 100 * weights - uniform  # percentage points above (red) or below (blue) the uniform share
    fig, axes = plt.subplots(n, len(slots) + 1, figsize=(1.45 * (len(slots) + 1) + 0.9, 1.5 * n), squeeze=False)
    for i in range(n):
        _show(axes[i, 0], images[i])
        axes[i, 0].set_title("input" if i == 0 else "", fontsize=8)
        for col, j in enumerate(slots, start=1):
            ax = axes[i, col]
            shown = ax.imshow(excess[i, :, col - 1].reshape(grid), cmap=cmap, vmin=-uniform, vmax=uniform,
                              extent=(0, w, h, 0))
            if i == 0:
                ax.set_title(f"slot {j} (expert {j // slots_per_expert})", fontsize=8)
        for ax in axes[i]:
            ax.set_xticks([])
            ax.set_yticks([])
    fig.colorbar(shown, ax=axes, fraction=0.03, pad=0.02,
                 label=f"dispatch weight minus uniform {uniform:.2f}% (points)")
    if title:
        fig.suptitle(title, fontsize=9)
    return fig
