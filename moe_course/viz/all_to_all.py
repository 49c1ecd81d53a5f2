"""Pictures of expert parallelism: which device's tokens sit in which expert's slots, on every device, at each step
of an MoE layer whose experts are split over devices (V-MoE Sec. 2.4 and App. B; GShard Sec. 3.2)."""

from __future__ import annotations

from typing import Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import to_rgba
from matplotlib.patches import Patch, Rectangle

EMPTY = -1  # a padded slot: no token in it, but it is sent all the same
ABSENT = -2  # at this step the device holds no slot at all for this expert


def show_all_to_all(stages: dict[str, np.ndarray], *, home: np.ndarray | None = None, outputs: Sequence[str] = (),
                    device_names: Sequence[str] | None = None, counts: bool = True):
    """One panel per step of the layer: a devices x experts grid; each cell is the row of buffer slots that device
    holds for that expert, each filled slot coloured by the device whose routing group the token comes from.

    stages: {panel title: (devices, experts, slots) int}: for every slot, the source device of its token
    (0..devices-1), ``EMPTY`` (-1) for a padded slot without a token (drawn white: it travels anyway), or
    ``ABSENT`` (-2) where the device holds no slot for that expert at this step (drawn grey). The number of
    slots may differ from panel to panel -- after the all-to-all a device holds n * B slots for each of its own
    experts, B before it -- and each expert's column keeps the same width, so the panels line up.
    home: (devices, experts) bool, True where the expert's weights live; those cells are outlined.
    outputs: titles of the panels whose slots hold expert outputs rather than inputs; drawn hatched.
    device_names: one label per row (default "device d"). counts: write "filled/slots" in every cell that holds
    slots. Returns the matplotlib Figure.

    Raises ValueError when a stage is not 3-D, the stages disagree on devices or experts, a value is outside
    -2..devices-1, ``home`` is not (devices, experts), ``device_names`` is not one per device, or ``outputs``
    names a panel that is not in ``stages``.
    """
    if not stages:
        raise ValueError("stages is empty: pass {title: (devices, experts, slots) int array}")
    arrays = {title: np.asarray(slots) for title, slots in stages.items()}
    devices, experts = next(iter(arrays.values())).shape[:2]
    for title, slots in arrays.items():
        if slots.ndim != 3 or slots.shape[:2] != (devices, experts):
            raise ValueError(f"stages[{title!r}] has shape {slots.shape}, expected ({devices}, {experts}, slots)")
        if slots.size and (slots.min() < ABSENT or slots.max() >= devices):
            raise ValueError(f"stages[{title!r}]: values {int(slots.min())}..{int(slots.max())} outside "
                             f"{ABSENT}..{devices - 1} (a source device, {EMPTY} = empty slot, {ABSENT} = no slot)")
    if home is not None and np.shape(home) != (devices, experts):
        raise ValueError(f"home has shape {np.shape(home)}, expected (devices, experts) = ({devices}, {experts})")
    names = [f"device {d}" for d in range(devices)] if device_names is None else list(device_names)
    if len(names) != devices:
        raise ValueError(f"device_names has {len(names)} labels, expected one per device ({devices})")
    unknown = [title for title in outputs if title not in arrays]
    if unknown:
        raise ValueError(f"outputs names {unknown}, not panels of stages ({list(arrays)})")

    palette = np.array([to_rgba(plt.get_cmap("tab10" if devices <= 10 else "tab20")(d % 20), 0.75)
                        for d in range(devices)] + [to_rgba("white"), to_rgba("0.88")])
    fig, axes = plt.subplots(len(arrays), 1, figsize=(0.8 * experts + 2.6, (0.3 * devices + 0.9) * len(arrays) + 0.5),
                             squeeze=False)
    for ax, (title, slots) in zip(axes[:, 0], arrays.items()):
        index = np.where(slots >= 0, slots, devices - 1 - slots)  # EMPTY -> devices, ABSENT -> devices + 1
        picture = palette[index.reshape(devices, -1)] if slots.shape[2] else np.ones((devices, 0, 4))
        ax.imshow(picture, aspect="auto", interpolation="nearest", extent=(0, experts, devices, 0))
        for d in range(devices):
            for e in range(experts):
                cell = slots[d, e]
                held = int((cell != ABSENT).sum())
                if title in outputs and (cell >= 0).any():
                    ax.add_patch(Rectangle((e, d), 1, 1, fill=False, hatch="////", ec="0.25", lw=0))
                if home is not None and home[d, e]:
                    ax.add_patch(Rectangle((e + 0.03, d + 0.06), 0.94, 0.88, fill=False, ec="black", lw=1.4))
                if counts and held:
                    ax.text(e + 0.5, d + 0.5, f"{int((cell >= 0).sum())}/{held}", ha="center", va="center",
                            fontsize=6, bbox=dict(fc="white", ec="none", alpha=0.7, pad=0.5))
        ax.set_xticks(np.arange(experts + 1), minor=True)
        ax.set_yticks(np.arange(devices + 1), minor=True)
        ax.grid(which="minor", color="0.5", lw=0.6)
        ax.tick_params(which="both", length=0)
        ax.set_xticks(np.arange(experts) + 0.5, [f"expert {e}" for e in range(experts)], fontsize=7)
        ax.set_yticks(np.arange(devices) + 0.5, names, fontsize=7)
        ax.set_title(title, fontsize=9, loc="left")
    handles = [Patch(color=palette[d], label=f"token from device {d}") for d in range(devices)]
    handles += [Patch(fc="white", ec="0.5", label="empty slot (sent anyway)"),
                Patch(color=palette[-1], label="no slot")]
    if home is not None:
        handles.append(Patch(fill=False, ec="black", lw=1.4, label="the expert lives here"))
    if outputs:
        handles.append(Patch(fill=False, hatch="////", ec="0.25", label="expert output"))
    fig.legend(handles=handles, loc="center right", fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0, 0.78, 1))
    return fig
