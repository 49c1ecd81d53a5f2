"""A model's trained parameters as one ``.npz`` file, by dotted parameter path (e.g. ``blocks.0.attn.query.kernel``).

For small recorded models shipped with the course (chapter 6's pretrained backbone): no optimizer state, no step,
nothing but the float32 parameters; the model's config is the caller's to know. Full training state, resumable,
lives in the training loop's orbax checkpoints (``moe_course.train.checkpoint``).
"""

from __future__ import annotations

import os

import numpy as np
from flax import nnx


def parameter_arrays(model: nnx.Module) -> dict[str, np.ndarray]:
    """{dotted path: float32 array} of every ``nnx.Param`` of ``model``."""
    return {".".join(map(str, path)): np.asarray(value, dtype=np.float32)
            for path, value in nnx.to_flat_state(nnx.state(model, nnx.Param))}


def save_weights(model: nnx.Module, path: str | os.PathLike) -> None:
    """Write ``model``'s parameters to ``path`` (a compressed ``.npz``; written whole, then renamed into place)."""
    path = os.fspath(path)
    partial = path + ".partial"
    with open(partial, "wb") as handle:
        np.savez_compressed(handle, **parameter_arrays(model))
    os.replace(partial, path)


def load_weights(model: nnx.Module, path: str | os.PathLike) -> nnx.Module:
    """Fill ``model`` (built with the config the file was saved from) with the parameters in ``path``; returns it.

    Raises FileNotFoundError for a missing file and ValueError naming the first parameter that is missing from the
    file, has another shape, or has no place in ``model`` (``moe_course.reference.names.fill``).
    """
    from moe_course.reference.names import fill, keep  # the checkpoint readers' filling, checked name by name

    with np.load(path) as stored:
        arrays = {name: stored[name] for name in stored.files}
    plan = [(name, name, keep) for name in parameter_arrays(model)]
    return fill(model, arrays, plan, source=os.fspath(path))
