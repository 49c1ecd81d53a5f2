"""Accuracy and loss of a PyTorch twin on a whole dataset split, batch for batch as the JAX ``evaluate``.

The same batches in the same fixed shuffled order (``EVAL_ORDER_SEED``), the last one padded to full size
(padding rows share a routing group with the last images and are masked out of the metrics), so a V-MoE's
routing groups -- and so its dropped tokens -- are the same in both frameworks and a converted model gives
the same accuracy.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from moe_course.data.base import ImageDataset, eval_batches
from moe_course.train.evaluate import EVAL_ORDER_SEED, pad_batch


@torch.no_grad()
def evaluate(model: torch.nn.Module, dataset: ImageDataset, split: str = "test", *,
             batch_size: int = 512) -> dict[str, float]:
    """{"accuracy": fraction correct, "loss": mean cross-entropy (nats), "examples": count} of a PyTorch model
    (``moe_course.torch.models``, e.g. from ``moe_course.torch.convert.to_torch``) on ``split``, in eval mode.
    Images go in channels first (the dataset's NHWC batches are permuted). Raises ValueError for an unknown
    split (from the dataset)."""
    model.eval()
    loss_sum = correct = count = 0.0
    for batch in eval_batches(dataset, split, batch_size, order_seed=EVAL_ORDER_SEED):
        batch = pad_batch(batch, batch_size)
        images = torch.from_numpy(batch["image"]).float().permute(0, 3, 1, 2)
        labels, mask = torch.from_numpy(batch["label"]).long(), torch.from_numpy(batch["mask"])
        logits = model(images).logits.float()
        loss_sum += float((F.cross_entropy(logits, labels, reduction="none") * mask).sum())
        correct += float(((logits.argmax(-1) == labels) * mask).sum())
        count += float(mask.sum())
    return {"accuracy": correct / count, "loss": loss_sum / count, "examples": int(count)}
