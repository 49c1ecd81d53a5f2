"""Expert pruning for single-modality inference (LIMoE App. E.4), as pure functions on router logits.

During training LIMoE tracks the share of each modality's tokens that each expert receives; for a text-only
(or image-only) forward pass the experts that modality hardly uses can be removed. ``pruning_order`` ranks
the experts of a layer by that share, least used first; ``coverage_after_pruning`` is Fig. 13's curve: the
fraction of the modality's TOP-1 router predictions still serviceable as experts are removed in that order.

The model is not retrained after pruning, so how the router treats the removed experts matters (App. E.4):
- "router_drop": the removed experts leave the router; the softmax runs over the kept experts only, so the
  kept experts' weights grow (their scale differs from training);
- "router_pred": the router still predicts probabilities for all experts, but TOP_k only picks among the
  kept ones, and the gates are the unchanged probabilities (the scale the model was trained with).
Both pick the same experts; they differ in the gates. The paper finds router_pred better when many experts
are removed.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from moe_course.routing.checks import check_choice, check_floating, check_int
from moe_course.routing.router import RouterOutput, add_router_noise

PRUNING_MODES = ("router_drop", "router_pred")
_REMOVED = -1e9  # a finite stand-in for -inf: exp underflows to exactly 0, and the token stays "finite"


def pruning_order(shares) -> np.ndarray:
    """(experts,) shares of a modality's tokens per expert -> (experts,) int64 expert indices, least used first
    (ties: lower index first). App. E.4 ranks by the share seen over the end of training."""
    return np.argsort(np.asarray(shares, np.float64), kind="stable")


def coverage_after_pruning(shares) -> np.ndarray:
    """(experts,) shares -> (experts + 1,) float64: entry n is the fraction of the modality's TOP-1 predictions
    that still land on a kept expert after removing the n least-used experts (1 at n = 0, 0 at n = E; Fig. 13)."""
    shares = np.asarray(shares, np.float64)
    removed = np.concatenate([[0.0], np.cumsum(shares[pruning_order(shares)])])
    return np.clip(shares.sum() - removed, 0.0, None) / max(shares.sum(), 1e-12)


def pruned_top_k_routing(logits: jax.Array, k: int, keep, *, mode: str, key: jax.Array | None = None,
                         noise_std: float | None = None) -> RouterOutput:
    """TOP_k routing with only the experts where ``keep`` is True available (App. E.4, "router_drop" or
    "router_pred"; see the module docstring).

    logits: (..., experts) clean router logits. keep: (experts,) bool, at least k True. key, noise_std: the
    router noise, as ``top_k_routing``. Returns a RouterOutput whose expert_index only names kept experts; probs
    are the distribution the gates come from (over kept experts for router_drop, over all for router_pred).
    Raises ValueError for an unknown mode, a keep mask of the wrong length or with fewer than k experts.
    """
    check_floating("logits", logits)
    check_choice("mode", mode, PRUNING_MODES)
    keep = np.asarray(keep, bool)
    num_experts = jnp.shape(logits)[-1]
    if keep.shape != (num_experts,):
        raise ValueError(f"keep has shape {keep.shape}; it must be (experts,) = ({num_experts},)")
    k = check_int("k", k, maximum=int(keep.sum()))
    noisy = add_router_noise(logits, key, noise_std=noise_std)
    if mode == "router_drop":
        noisy = jnp.where(keep, noisy, _REMOVED)
    probs = jax.nn.softmax(noisy, axis=-1)
    _, expert_index = jax.lax.top_k(jnp.where(keep, probs, -1.0), k)
    gates = jnp.take_along_axis(probs, expert_index, axis=-1)
    return RouterOutput(expert_index.astype(jnp.int32), gates, probs, noisy)
