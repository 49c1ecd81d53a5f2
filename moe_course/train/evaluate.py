"""Accuracy and loss of a model on a whole dataset split."""

from __future__ import annotations

import numpy as np
from flax import nnx
from jax.sharding import Mesh

from moe_course.data.base import ImageDataset, eval_batches
from moe_course.parallel.process_share import assemble_batch, process_rows
from moe_course.train.steps import checks_enabled, make_eval_step


def pad_batch(batch: dict[str, np.ndarray], size: int) -> dict[str, np.ndarray]:
    """Pad image/label to ``size`` rows and add ``mask`` (1 = real row), so every eval batch compiles once."""
    n = len(batch["label"])
    pad = size - n
    out = {k: np.concatenate([batch[k], np.zeros((pad, *batch[k].shape[1:]), batch[k].dtype)]) for k in ("image", "label")}
    out["mask"] = np.concatenate([np.ones(n, np.float32), np.zeros(pad, np.float32)])
    return out


# Splits are often sorted by class (the digits, image folders). A V-MoE routes groups of images together, so
# class-sorted groups would overload the experts that class prefers and drop far more tokens than the mixed
# groups of training. Evaluation therefore walks the split in one fixed shuffled order.
EVAL_ORDER_SEED = 0


def evaluate(model: nnx.Module, dataset: ImageDataset, split: str = "test", *, batch_size: int = 512,
             eval_step=None, mesh: Mesh | None = None) -> dict[str, float]:
    """{"accuracy": fraction correct, "loss": mean cross-entropy (nats), "examples": count} on ``split``.

    Every example counts once; batches follow the fixed shuffled order of ``EVAL_ORDER_SEED`` and the last one
    is padded (padding rows are masked out of the metrics, but share a routing group with the last images).
    ``mesh``: ``model`` lives on it (as ``train`` leaves it); each process reads and decodes only its rows of
    every padded batch (``parallel.process_rows``) and the global batch is assembled on the mesh
    (``parallel.assemble_batch``), so P processes give the one-process result. ``batch_size`` must then split
    over the mesh's devices (``train`` checks ``eval_batch_size``).
    """
    if eval_step is None:
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)
        eval_step = make_eval_step(graphdef, checked=checks_enabled(getattr(model, "config", None)))
    else:
        _, params, rest = nnx.split(model, nnx.Param, ...)
    rows = None if mesh is None else process_rows(mesh, batch_size)
    size = batch_size if rows is None else rows[1] - rows[0]
    loss_sum = correct = count = 0.0
    for batch in eval_batches(dataset, split, batch_size, order_seed=EVAL_ORDER_SEED, rows=rows):
        batch = pad_batch(batch, size)
        if mesh is not None:
            batch = assemble_batch(batch, mesh, batch_size)
        loss, right, n = eval_step(params, rest, batch)
        loss_sum, correct, count = loss_sum + float(loss), correct + float(right), count + float(n)
    return {"accuracy": correct / count, "loss": loss_sum / count, "examples": int(count)}
