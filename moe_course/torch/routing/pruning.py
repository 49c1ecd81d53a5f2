"""PyTorch twin of ``moe_course.routing.pruning``: expert pruning for single-modality inference (LIMoE
App. E.4). ``pruning_order`` and ``coverage_after_pruning`` work on NumPy shares only and are the JAX
module's own (imported, not copied); ``pruned_top_k_routing`` is the torch twin, with a ``torch.Generator``
or the standard-normal ``noise`` itself in place of the JAX ``key`` (as ``top_k_routing``).
"""

from __future__ import annotations

import numpy as np
import torch

from moe_course.routing.checks import check_choice, check_floating, check_int
from moe_course.routing.pruning import _REMOVED, PRUNING_MODES, coverage_after_pruning, pruning_order
from moe_course.torch.routing.router import RouterOutput, add_router_noise, top_k

__all__ = ["PRUNING_MODES", "coverage_after_pruning", "pruned_top_k_routing", "pruning_order"]


def pruned_top_k_routing(logits: torch.Tensor, k: int, keep, *, mode: str,
                         generator: torch.Generator | None = None, noise_std: float | None = None,
                         noise: torch.Tensor | None = None) -> RouterOutput:
    """Twin of the JAX ``pruned_top_k_routing`` (LIMoE App. E.4): TOP_k among the experts where ``keep`` is
    True. mode "router_drop": softmax over the kept experts only; "router_pred": softmax over all, gates the
    unchanged probabilities of the kept top k. logits (..., experts) float; keep (experts,) bool (sequence,
    NumPy array or tensor) with at least k True; generator / noise / noise_std as ``add_router_noise``.
    Returns a RouterOutput (expert_index (..., k) int32 naming kept experts only, gates, probs, noisy_logits
    float32). Raises the JAX function's ValueErrors (unknown mode, keep of the wrong length, k > kept)."""
    check_floating("logits", logits)
    check_choice("mode", mode, PRUNING_MODES)
    keep = np.asarray(keep.detach().cpu() if isinstance(keep, torch.Tensor) else keep, bool)
    num_experts = logits.shape[-1]
    if keep.shape != (num_experts,):
        raise ValueError(f"keep has shape {keep.shape}; it must be (experts,) = ({num_experts},)")
    k = check_int("k", k, maximum=int(keep.sum()))
    kept = torch.from_numpy(keep).to(logits.device)
    noisy = add_router_noise(logits, generator, noise_std=noise_std, noise=noise)
    if mode == "router_drop":
        noisy = torch.where(kept, noisy, _REMOVED)
    probs = torch.softmax(noisy, dim=-1)
    expert_index = top_k(torch.where(kept, probs, -1.0), k)[1]
    gates = torch.gather(probs, -1, expert_index)
    return RouterOutput(expert_index.int(), gates, probs, noisy)
