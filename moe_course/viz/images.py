"""Pictures of images, patch grids and per-patch values (attention received, later: dropped patches)."""

from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.patches import Rectangle


def _grid(n: int, cols: int, size: float = 1.6):
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(cols * size, rows * size), squeeze=False)
    for ax in axes.flat:
        ax.axis("off")
    return fig, axes.flat


def _show(ax, image: np.ndarray) -> None:
    """image: (H, W, C) float in [0, 1]; one channel is drawn in grey."""
    ax.imshow(image[..., 0] if image.shape[-1] == 1 else image, cmap="gray", vmin=0, vmax=1)


def show_images(images: np.ndarray, labels: Sequence[int] | None = None, class_names: Sequence[str] | None = None,
                boxes: np.ndarray | None = None, cols: int = 8, patch_size: int | None = None):
    """A grid of images (n, H, W, C) with titles, optional object boxes (n, 4) = (top, left, h, w) in pixels and
    an optional patch grid. Returns the matplotlib Figure."""
    fig, axes = _grid(len(images), cols)
    for i, ax in zip(range(len(images)), axes):
        _show(ax, images[i])
        if labels is not None:
            ax.set_title(class_names[labels[i]] if class_names else str(labels[i]), fontsize=9)
        if boxes is not None:
            top, left, h, w = boxes[i]
            ax.add_patch(Rectangle((left - 0.5, top - 0.5), w, h, fill=False, ec="tab:green", lw=1.2))
        if patch_size:
            for edge in np.arange(patch_size, images.shape[1], patch_size) - 0.5:
                ax.axhline(edge, color="tab:orange", lw=0.4)
                ax.axvline(edge, color="tab:orange", lw=0.4)
    fig.tight_layout()
    return fig


def show_patch_values(images: np.ndarray, values: np.ndarray, patch_size: int, *, titles: Sequence[str] | None = None,
                      cols: int = 6, cmap: str = "magma", alpha: float = 0.6, label: str = "value per patch"):
    """Each image (n, H, W, C) beside a heat map of one value per patch laid over it.

    values: (n, patches) in row-major patch order, e.g. the attention each patch receives. One colour scale is
    shared by all images (so colours compare across panels) and drawn as a colour bar titled ``label``.
    titles: one per image, written over its pair of panels. Returns the matplotlib Figure.
    """
    n, h, w, _ = images.shape
    grid = values.reshape(n, h // patch_size, w // patch_size)
    fig, axes = _grid(2 * n, cols)
    axes = list(axes)
    norm = Normalize(vmin=float(values.min()), vmax=float(values.max()))
    for i in range(n):
        _show(axes[2 * i], images[i])
        _show(axes[2 * i + 1], images[i])
        heat = np.kron(grid[i], np.ones((patch_size, patch_size)))
        axes[2 * i + 1].imshow(heat, cmap=cmap, norm=norm, alpha=alpha)
        if titles is not None:
            axes[2 * i].set_title(titles[i], fontsize=9, loc="left")
    fig.tight_layout()
    fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=axes, label=label, fraction=0.025, pad=0.02)
    return fig
