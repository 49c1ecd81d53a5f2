"""Mixture-of-Depths routing (Raposo et al. 2024; for vision, A-MoD: Gadhikar et al. 2024, Sec. 3).

A Mixture-of-Depths (MoD) block processes only the ``round(C * P)`` highest-scoring of an image's ``P`` tokens
(capacity C in (0, 1]); the others skip the whole block on the residual path. Two scores:

- standard routing (A-MoD Eq. 1-2): a linear router, ``r_i = x_i W_r``; the processed tokens' update is
  multiplied by a function of ``r_i`` so that the router receives gradients (``mod_gate``);
- attention routing (A-MoD Eq. 3-5): ``r_i = 1/(H N) sum_h sum_j A_{h, j i}``, the attention token i receives
  in the PREVIOUS layer, averaged over heads and query rows; no parameters, no multiplication.

Selection is per image (one routing group per image: a ViT is not causal, so no auxiliary router is needed
to make the choice at inference time, unlike the language-model paper). The class token, when there is one,
is always processed: it carries the classification, and it counts towards the ``round(C * P)`` tokens.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from moe_course.routing.checks import check_floating, check_int, check_ndim

MOD_ROUTERS = ("standard", "attention")


def mod_capacity(num_tokens: int, capacity: float) -> int:
    """Tokens an MoD block processes per image: ``round(capacity * num_tokens)``, at least 1 (A-MoD Sec. 3).

    num_tokens: P, tokens per image (class token included). capacity: C in (0, 1], e.g. 0.5 or 0.125.
    Python's round (half to even). Raises ValueError naming the argument for C outside (0, 1] or P < 1.
    """
    num_tokens = check_int("num_tokens", num_tokens)
    ok = isinstance(capacity, (int, float)) and not isinstance(capacity, bool) and 0.0 < capacity <= 1.0
    if not ok:
        raise ValueError(f"capacity={capacity!r} is not allowed; use a number in (0, 1] (the fraction of tokens "
                         f"each MoD block processes, e.g. 0.5 or 0.125)")
    return max(1, round(capacity * num_tokens))


def check_router_inputs(x, router_kernel) -> None:
    """Raise ValueError unless x is floating (batch, tokens, width) and router_kernel has width inputs."""
    check_ndim("x", x, 3, "(batch, tokens, width)")
    check_floating("x", x)
    inputs = router_kernel.reshape(-1).shape[0]
    if inputs != x.shape[-1]:
        raise ValueError(f"router_kernel has {inputs} inputs; x has width {x.shape[-1]}")


def standard_router_scores(x: jax.Array, router_kernel: jax.Array) -> jax.Array:
    """A-MoD Eq. 1: ``r_i = x_i W_r``. x: (batch, tokens, width) float; router_kernel: (width,) or (width, 1).

    Returns (batch, tokens) float32 scores (unbounded; see ``mod_gate`` for the bounded multiplier), computed in
    float32 whatever the dtype of x (bfloat16 activations are cast up, as a router's logits are).
    """
    check_router_inputs(x, router_kernel)
    w = router_kernel.reshape(-1).astype(jnp.float32)
    return jnp.einsum("btd,d->bt", x.astype(jnp.float32), w)


def attention_router_scores(attention: jax.Array) -> jax.Array:
    """A-MoD Eq. 4: the attention each token receives, averaged over heads and query rows.

    attention: (batch, heads, queries, keys), rows sum to 1 (the previous layer's maps). Returns (batch, keys)
    float32: ``r_i = 1/(H N) sum_h sum_j A[b, h, j, i]``. The scores of an image sum to 1.
    """
    check_ndim("attention", attention, 4, "(batch, heads, queries, keys)")
    check_floating("attention", attention)
    return attention.astype(jnp.float32).mean(axis=(1, 2))


class MoDSelection(NamedTuple):
    """Which tokens an MoD block processes. index: (batch, selected) int32, ascending token positions.
    processed: (batch, tokens) bool, True where the token goes through the block. scores: (batch, tokens)
    float32, the routing scores the choice was made on (the class token's as computed, not forced)."""

    index: jax.Array
    processed: jax.Array
    scores: jax.Array


def mod_select(scores: jax.Array, capacity: float, *, keep_first: bool = False) -> MoDSelection:
    """The top ``mod_capacity(tokens, capacity)`` tokens of each image by score (A-MoD Eq. 2 and 5: a token is
    processed when its score is at least the capacity percentile of its image's scores).

    scores: (batch, tokens) float. keep_first: always process token 0 (the class token), within the budget.
    Ties go to the earlier token. The index is returned in ascending token order, so the processed tokens keep
    their relative order. Raises ValueError for a bad capacity or shape.
    """
    check_ndim("scores", scores, 2, "(batch, tokens)")
    check_floating("scores", scores)
    batch, tokens = scores.shape
    selected = mod_capacity(tokens, capacity)
    scores = jnp.asarray(scores, jnp.float32)  # a NumPy array has no .at
    ranked = scores
    if keep_first:
        ranked = ranked.at[:, 0].set(jnp.inf)
    _, index = jax.lax.top_k(ranked, selected)  # ties: lower index first
    index = jnp.sort(index, axis=-1).astype(jnp.int32)
    processed = jnp.zeros((batch, tokens), bool).at[jnp.arange(batch)[:, None], index].set(True)
    return MoDSelection(index=index, processed=processed, scores=scores)


def mod_gate(router_scores: jax.Array) -> jax.Array:
    """The multiplier of a processed token's update under standard routing: ``sigmoid(r_i)``, in (0, 1).

    A-MoD Eq. 2 multiplies the block's output by ``r_i`` itself so that W_r receives a gradient. An unbounded
    ``r_i`` can grow without limit and blow up the residual stream (a failure seen in public MoD code), so we
    bound it with a sigmoid: the gradient path is the same, the ranking (and so the choice) is unchanged
    because the sigmoid is monotonic. router_scores: any shape, float -> same shape.
    """
    return jax.nn.sigmoid(router_scores)


def gather_tokens(x: jax.Array, index: jax.Array) -> jax.Array:
    """x: (batch, tokens, width), index: (batch, selected) -> (batch, selected, width)."""
    return jnp.take_along_axis(x, index[..., None], axis=1)


def scatter_update(x: jax.Array, index: jax.Array, update: jax.Array) -> jax.Array:
    """x with ``update`` (batch, selected, width) added at the selected tokens; every other token is returned
    bit-identical (a token that skips the block is not touched by any arithmetic)."""
    rows = jnp.arange(x.shape[0])[:, None]
    return x.at[rows, index].add(update.astype(x.dtype))


def scatter_attention(attention: jax.Array, index: jax.Array, num_tokens: int) -> jax.Array:
    """The attention maps of an MoD block over its selected tokens, placed in a full (tokens x tokens) map.

    attention: (batch, heads, selected, selected); index: (batch, selected). Returns (batch, heads, tokens,
    tokens) with zeros where a token did not take part: a skipped token neither attends nor is attended to,
    so it receives zero attention -- what attention routing of the NEXT MoD block sees for it.
    """
    batch, heads = attention.shape[:2]
    full = jnp.zeros((batch, heads, num_tokens, num_tokens), attention.dtype)
    b = jnp.arange(batch)[:, None, None, None]
    h = jnp.arange(heads)[None, :, None, None]
    return full.at[b, h, index[:, None, :, None], index[:, None, None, :]].set(attention)
