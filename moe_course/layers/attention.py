"""Multi-head self-attention that can hand back its attention maps (A-MoD routes on them)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx


def attention_weights(q: jax.Array, k: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """softmax(q k^T / sqrt(d)) per head. q, k: (batch, tokens, heads, head_dim) -> (batch, heads, q_tokens, k_tokens)
    float32 whatever the dtype of q and k: the scores accumulate and the softmax runs in float32, as
    ``jax.nn.dot_product_attention`` does for bfloat16 inputs (A-MoD routes on these maps).
    mask: (batch, q_tokens, k_tokens) bool or None; a query gives weight 0 to the keys it masks (False)."""
    scores = (jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32)
              / jnp.sqrt(q.shape[-1]).astype(jnp.float32))
    if mask is not None:
        scores = jnp.where(mask[:, None], scores, jnp.finfo(scores.dtype).min)
    return jax.nn.softmax(scores, axis=-1)


class MultiHeadAttention(nnx.Module):
    """Multi-head self-attention (Vaswani et al. 2017, Sec. 3.2), query/key/value/out projections with bias.

    Call: x (batch, tokens, width) -> (batch, tokens, width); with ``return_attention=True`` also the
    attention maps (batch, heads, tokens, tokens), rows = queries, softmax over keys (each row sums to 1).
    mask: (batch, tokens, tokens) bool or None -- which keys each query may attend to (LIMoE's one-tower
    encoder keeps modalities apart and skips text padding with it). Every query row must allow at least
    one key.
    dtype / param_dtype: the projections' computation and parameter dtypes (Flax's fields); the attention
    softmax runs in float32 either way and the maps come back float32.
    """

    def __init__(self, width: int, heads: int, *, dtype=jnp.float32, param_dtype=jnp.float32, rngs: nnx.Rngs):
        if width % heads:
            raise ValueError(f"heads={heads} does not divide width={width}")
        self.heads = heads
        linear = lambda: nnx.Linear(width, width, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.query, self.key, self.value, self.out = linear(), linear(), linear(), linear()

    def __call__(self, x: jax.Array, *, return_attention: bool = False, mask: jax.Array | None = None):
        b, t, w = x.shape
        split = lambda y: y.reshape(b, t, self.heads, w // self.heads)
        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        if not return_attention:  # XLA's fused attention: the maps are never materialised for the caller
            heads_mask = None if mask is None else mask[:, None]
            return self.out(jax.nn.dot_product_attention(q, k, v, mask=heads_mask).reshape(b, t, w))
        weights = attention_weights(q, k, mask)
        y = self.out(jnp.einsum("bhqk,bkhd->bqhd", weights.astype(v.dtype), v).reshape(b, t, w))
        return y, weights
