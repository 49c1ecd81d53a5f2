"""Pictures of expert buffers: which token sits in which slot (V-MoE Sec. 2.4, App. C), and the one-hot
dispatch and combine tensors that move tokens into the slots and back (GShard's einsum form)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap, to_rgba
from matplotlib.patches import Patch


def show_buffers(buffers: dict[str, np.ndarray], num_tokens: int, *, dropped: dict[str, np.ndarray] | None = None,
                 token_group: np.ndarray | None = None, group_name: str = "image"):
    """One panel per allocation: the experts' buffers as rows of capacity slots, each slot labelled with its token.

    buffers: {panel title: (experts, capacity) int}, the token in each slot as ``buffer_token_index`` returns it
    for one group; ``num_tokens`` (one past the last token) marks an empty slot, drawn blank. dropped: {panel
    title: (experts,) int}, the choices each expert turned away, written in red at the end of its row.
    token_group: (num_tokens,) int, e.g. the image each token comes from; slots are coloured by it (one colour
    per group, named ``group_name`` in the legend). Returns the matplotlib Figure.

    Raises ValueError when a panel's token index is outside [0, num_tokens] or its ``dropped`` is not one count
    per expert.
    """
    groups = np.zeros(num_tokens, int) if token_group is None else np.asarray(token_group)
    palette = [to_rgba(f"C{i % 10}", 0.45) for i in range(int(groups.max()) + 1)] + [(1, 1, 1, 1)]
    empty_colour = len(palette) - 1
    experts, capacity = np.asarray(next(iter(buffers.values()))).shape
    fig, axes = plt.subplots(len(buffers), 1, figsize=(min(0.42 * capacity + 2.2, 14), 0.42 * experts * len(buffers)
                                                         + 0.9 * len(buffers) + 0.4), squeeze=False)
    for ax, (title, slots) in zip(axes[:, 0], buffers.items()):
        slots = np.asarray(slots)
        if slots.min() < 0 or slots.max() > num_tokens:
            raise ValueError(f"buffers[{title!r}]: token index {int(slots.min())}..{int(slots.max())} outside "
                             f"0..{num_tokens} ({num_tokens} = an empty slot)")
        colour = np.where(slots == num_tokens, empty_colour, groups[np.minimum(slots, num_tokens - 1)])
        ax.imshow(colour, cmap=ListedColormap(palette), vmin=0, vmax=empty_colour, aspect="auto",
                  extent=(-0.5, capacity - 0.5, experts - 0.5, -0.5))
        for e in range(experts):
            for b in range(capacity):
                if slots[e, b] < num_tokens:
                    ax.text(b, e, str(slots[e, b]), ha="center", va="center", fontsize=7)
        ax.set_xticks(np.arange(capacity + 1) - 0.5, minor=True)
        ax.set_yticks(np.arange(experts + 1) - 0.5, minor=True)
        ax.grid(which="minor", color="0.6", lw=0.6)
        ax.tick_params(which="minor", length=0)
        ax.set_yticks(range(experts), [f"expert {e}" for e in range(experts)], fontsize=8)
        ax.set_xticks(range(0, capacity, max(1, capacity // 8)))
        ax.tick_params(axis="x", labelsize=7)
        served = int((slots < num_tokens).sum())
        if dropped is not None:
            turned_away = np.asarray(dropped[title])
            if turned_away.shape != (experts,):
                raise ValueError(f"dropped[{title!r}] has shape {turned_away.shape}, expected ({experts},): one "
                                 f"count per expert")
            for e in range(experts):
                if turned_away[e]:
                    ax.text(capacity - 0.3, e, f" +{int(turned_away[e])} dropped", color="tab:red", va="center",
                            fontsize=8, clip_on=False)
            title = f"{title}: {served} choices served, {int(turned_away.sum())} dropped"
        ax.set_title(title, fontsize=10, loc="left")
    axes[-1, 0].set_xlabel("buffer slot (filled left to right, in the order the allocation visits the choices)",
                           fontsize=8)
    if token_group is not None:
        handles = [Patch(color=palette[g], label=f"{group_name} {g}") for g in range(empty_colour)]
        fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8, frameon=False)
        fig.tight_layout(rect=(0, 0.05, 0.9, 1))
    else:
        fig.tight_layout(rect=(0, 0, 0.9, 1))
    return fig


def show_dispatch_combine(dispatch: np.ndarray, combine: np.ndarray, *, max_tokens: int | None = None):
    """The dispatch and combine tensors of one group side by side, as (tokens) x (experts * capacity) images.

    dispatch: (tokens, experts, capacity), 1 where the token sits in that slot; combine: the same shape, the
    gate in place of the 1. Columns are grouped by expert (thin lines between experts); a row with no mark is a
    token all of whose choices were dropped. max_tokens: draw only the first rows. Returns the matplotlib Figure.

    Raises ValueError when the two tensors differ in shape or are not 3-D.
    """
    dispatch, combine = np.asarray(dispatch), np.asarray(combine)
    if dispatch.ndim != 3 or dispatch.shape != combine.shape:
        raise ValueError(f"dispatch {dispatch.shape} and combine {combine.shape} must both be (tokens, experts, "
                         f"capacity)")
    tokens, experts, capacity = dispatch.shape
    rows = tokens if max_tokens is None else min(tokens, max_tokens)
    fig, axes = plt.subplots(1, 2, figsize=(10, 0.09 * rows + 1.6), sharey=True)
    panels = ((axes[0], dispatch, "dispatch: 1 where the token sits in the slot", "Greys", 1.0),
              (axes[1], combine, "combine: the gate of that choice", "viridis", None))
    for ax, tensor, title, cmap, top in panels:
        flat = tensor[:rows].reshape(rows, experts * capacity)
        shown = ax.imshow(np.ma.masked_equal(flat, 0), cmap=cmap, vmin=0, vmax=top or flat.max(), aspect="auto",
                          interpolation="nearest")
        for e in range(1, experts):
            ax.axvline(e * capacity - 0.5, color="tab:orange", lw=0.8)
        ax.set_xticks([e * capacity + capacity / 2 - 0.5 for e in range(experts)],
                      [f"expert {e}" for e in range(experts)], fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.set_facecolor("white")
        if top is None:
            fig.colorbar(shown, ax=ax, fraction=0.04, label="gate")
    axes[0].set_ylabel("token")
    fig.tight_layout()
    return fig
