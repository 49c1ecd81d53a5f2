"""The router of a sparse MoE layer: noisy logits, softmax over experts, TOP_k -- which experts each token picks.

V-MoE (Riquelme et al. 2021, Sec. 2.3) routes with ``g(x) = TOP_k(softmax(W x + eps))``: the softmax comes
first, then all but the k largest probabilities are zeroed, and the k survivors are used unchanged as the
combine weights (gates). They are not renormalised, so they sum to less than 1 whenever k < E. Because the
gate of even a single chosen expert (k = 1) depends smoothly on every logit, the router gets a gradient.
Shazeer et al. (2017) apply the two steps the other way round, ``softmax(TOP_k(W x + eps))``; with k = 1
that gate is always exactly 1 and the router gets no gradient through it (V-MoE App. A.1, Table 2). Both
orders are available here for that ablation.

The logits ``W x`` are computed by the caller (the layer owns ``W``); these functions see only arrays.

Non-finite logits. A token with any NaN or infinite logit (a NaN or inf in its features makes them so) has
no meaningful ranking of experts: the softmax of a row holding +inf is NaN everywhere, and TOP_k would then
silently pick experts 0, 1, ... by index. Such a token's probabilities and gates are therefore all NaN
(``nonfinite_tokens`` finds them); the allocation gives it no buffer slot and ``combine`` returns NaN for
it, so the NaN shows in that token's output and nowhere else (see ``allocation`` and ``dispatch``).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from moe_course.routing.checks import check_choice, check_floating, check_int, check_positive

ORDERS = ("softmax_then_topk", "topk_then_softmax")


def default_noise_std(num_experts: int) -> float:
    """The router noise standard deviation V-MoE uses, 1 / E (Sec. 2.3)."""
    return 1.0 / check_int("num_experts", num_experts)


def router_noise_std(noise_std: float | None, num_experts: int) -> float:
    """The router noise std to use: ``noise_std``, or 1 / E for None. ValueError for a negative or non-finite one."""
    if noise_std is None:
        return default_noise_std(num_experts)
    return check_positive("noise_std", noise_std, allow_zero=True)


def add_router_noise(logits: jax.Array, key: jax.Array | None = None, *, noise_std: float | None = None) -> jax.Array:
    """Noisy router logits ``W x + eps`` with ``eps ~ N(0, noise_std^2)`` drawn independently per entry.

    logits: (..., experts) floating, the clean router logits ``W x``; usually (groups, tokens, experts).
    key: a JAX PRNG key; None (evaluation) returns the logits unchanged -- noise is a training-time device.
    noise_std: standard deviation of eps; None means 1 / E, V-MoE's choice (Sec. 2.3); 0 adds nothing.
    Returns float32 logits of the same shape. Raises ValueError for a non-floating ``logits`` or a negative,
    non-finite ``noise_std``.
    """
    check_floating("logits", logits)
    logits = jnp.asarray(logits, jnp.float32)
    std = router_noise_std(noise_std, logits.shape[-1])
    if key is None or std == 0.0:
        return logits
    return logits + std * jax.random.normal(key, logits.shape, jnp.float32)


class RouterOutput(NamedTuple):
    """What the router decided for every token (V-MoE Sec. 2.3).

    expert_index: (groups, tokens, k) int32 -- the chosen experts, TOP-1 first; among equal scores the lower
        expert index comes first (``jax.lax.top_k``'s rule), so the choice is deterministic.
    gates: (groups, tokens, k) float32 -- the combine weight of each choice (see ``top_k_routing``).
    probs: (groups, tokens, experts) float32 -- softmax of the noisy logits over all experts (the router's
        full distribution, used for priority scores, experts-choice routing and diagnostics).
    noisy_logits: (groups, tokens, experts) float32 -- ``W x + eps`` (equal to the logits without a key);
        the load loss (App. A.2) needs them.
    """

    expert_index: jax.Array
    gates: jax.Array
    probs: jax.Array
    noisy_logits: jax.Array


def nonfinite_tokens(values: jax.Array) -> jax.Array:
    """(..., n) -> (...) bool: True for every row (token) holding a NaN or an infinity."""
    return ~jnp.all(jnp.isfinite(values), axis=-1)


def _nan_where_nonfinite(values: jax.Array, logits: jax.Array) -> jax.Array:
    return jnp.where(nonfinite_tokens(logits)[..., None], jnp.nan, values)


def router_probabilities(logits: jax.Array, key: jax.Array | None = None, *, noise_std: float | None = None) -> jax.Array:
    """softmax over experts of the (noisy) logits: (..., experts) -> (..., experts) float32, rows sum to 1.

    Noise as in ``add_router_noise``: only when ``key`` is given. A row with a non-finite logit is all NaN.
    """
    noisy = add_router_noise(logits, key, noise_std=noise_std)
    return _nan_where_nonfinite(jax.nn.softmax(noisy, axis=-1), noisy)


def check_routing_args(logits, k, order: str) -> int:
    """``top_k_routing``'s checks (JAX or torch logits): ValueError naming logits, k or order; returns k."""
    check_floating("logits", logits)
    if jnp.ndim(logits) < 1:
        raise ValueError(f"logits has shape {tuple(jnp.shape(logits))}; it needs a last axis of experts")
    k = check_int("k", k, minimum=1, maximum=jnp.shape(logits)[-1])
    check_choice("order", order, ORDERS)
    return k


def top_k_routing(
    logits: jax.Array,
    k: int,
    key: jax.Array | None = None,
    *,
    noise_std: float | None = None,
    order: str = "softmax_then_topk",
) -> RouterOutput:
    """Pick k experts per token and their gates (V-MoE Sec. 2.3; App. A.1 for ``order``).

    logits: (..., experts) floating, the clean router logits ``W x``, usually (groups, tokens, experts).
    k: experts per token, 1 <= k <= experts.
    key: PRNG key for the router noise (training); None for no noise (evaluation).
    noise_std: std of the noise; None means 1 / E.
    order: "softmax_then_topk" (V-MoE, default): gates are the k largest entries of softmax(W x + eps),
        NOT renormalised. "topk_then_softmax" (Shazeer et al. 2017): the same k experts, but the gates are a
        softmax over the k selected noisy logits only, so they sum to 1 (and are all 1 when k = 1).
    Returns a ``RouterOutput``; a token with a non-finite logit gets NaN probs and gates (its expert_index is
    then meaningless; see the module docstring). Raises ValueError naming ``k``, ``order``, ``noise_std`` or
    ``logits`` when one of them is not allowed.
    """
    k = check_routing_args(logits, k, order)
    noisy = add_router_noise(logits, key, noise_std=noise_std)
    probs = _nan_where_nonfinite(jax.nn.softmax(noisy, axis=-1), noisy)
    if order == "softmax_then_topk":
        gates, expert_index = jax.lax.top_k(probs, k)
    else:
        top_logits, expert_index = jax.lax.top_k(noisy, k)
        gates = jax.nn.softmax(top_logits, axis=-1)
    return RouterOutput(expert_index.astype(jnp.int32), _nan_where_nonfinite(gates, noisy), probs, noisy)
