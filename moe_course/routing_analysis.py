"""Per-image views of a V-MoE layer's RoutingRecord, for the analyses of V-MoE Sec. 4 and App. E (numpy)."""

from __future__ import annotations

import numpy as np


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
