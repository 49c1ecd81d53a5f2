"""Per-image views of a V-MoE layer's RoutingRecord, for the analyses of V-MoE Sec. 4 and App. E (numpy)."""

from __future__ import annotations

from functools import lru_cache

import jax
import numpy as np
from flax import nnx


def _per_image(array: np.ndarray, batch: int) -> np.ndarray:
    """(groups, group_size * tokens, ...) -> (batch, tokens, ...): a group's tokens are its images' tokens in order."""
    array = np.asarray(array)
    groups, group_tokens = array.shape[:2]
    return array.reshape(batch, groups * group_tokens // batch, *array.shape[2:])


def token_served(record, batch: int, *, choice: int | None = None) -> np.ndarray:
    """(batch, tokens) bool: True where the token reached at least one expert (``choice=None``) or where its
    TOP-(choice+1) choice was served. A token with no served choice is a dropped token: only the residual
    connection carries it through the layer (V-MoE Sec. 2.4, Fig. 5).
    """
    served = _per_image(record.served, batch)
    return served.any(-1) if choice is None else served[..., choice]


def expert_class_weights(record, labels: np.ndarray, num_classes: int) -> np.ndarray:
    """(num_classes, experts) float: for each class c and expert e, the router weight that e receives, averaged
    over all tokens of all images of class c (V-MoE Fig. 8 and Sec. E.2). Only the chosen (top-k) experts
    carry weight; dropped choices count with their gate, as the paper's routing weights do.
    labels: (batch,) int class per image.
    """
    batch = len(labels)
    index = _per_image(record.expert_index, batch)  # (batch, tokens, k)
    gates = _per_image(record.gates, batch)
    num_experts = np.asarray(record.expert_fill).shape[-1]
    per_image = np.zeros((batch, num_experts))
    for choice in range(index.shape[-1]):
        np.add.at(per_image, (np.arange(batch)[:, None], index[..., choice]), gates[..., choice])
    per_image /= index.shape[1]
    table = np.zeros((num_classes, num_experts))
    for c in range(num_classes):
        if (labels == c).any():
            table[c] = per_image[labels == c].mean(0)
    return table


@lru_cache(maxsize=8)
def _compiled_forward(graphdef: nnx.GraphDef):
    @jax.jit
    def forward(params, rest, images):
        out = nnx.merge(graphdef, params, rest)(images, deterministic=True)
        return out.logits, out.routing

    return forward


def collect_routing(model, images: np.ndarray, *, batch_size: int = 512) -> tuple[np.ndarray, list]:
    """Run a V-MoE on ``images`` (n, S, S, C) at evaluation (no noise, no dropout), compiled, in batches.

    Returns (logits (n, classes) float32, one RoutingRecord per MoE layer whose arrays are numpy and cover all
    n images, groups in image order). Compiles once per routing setting: change the routing with
    ``with_routing`` before calling. Raises ValueError when n or batch_size is not a positive multiple of the
    model's group_size (images per routing group); the last batch is padded with whole blank groups, which are
    routed on their own and then discarded.
    """
    images = np.asarray(images)
    group = model.config.group_size
    for name, value in (("number of images", len(images)), ("batch_size", batch_size)):
        if value <= 0 or value % group:
            raise ValueError(f"{name}={value} is not a positive multiple of the model's group_size={group}")
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    forward = _compiled_forward(graphdef)
    logits, records = [], []
    for start in range(0, len(images), batch_size):
        chunk = images[start:start + batch_size]
        padded = np.pad(chunk, [(0, batch_size - len(chunk))] + [(0, 0)] * (chunk.ndim - 1))
        out_logits, routing = jax.device_get(forward(params, rest, padded))
        groups = len(chunk) // group
        logits.append(out_logits[:len(chunk)])
        records.append(jax.tree.map(lambda a: a[:groups] if a.ndim else a, routing))  # capacity is 0-d
    merged = jax.tree.map(lambda *a: np.concatenate(a) if a[0].ndim else a[0], *records)
    return np.concatenate(logits), [r._replace(capacity=int(r.capacity)) for r in merged]
