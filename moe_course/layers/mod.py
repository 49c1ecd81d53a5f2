"""A Mixture-of-Depths block: a whole encoder block run on the top ``round(C * P)`` tokens of each image only."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from moe_course.layers.block import EncoderBlock
from moe_course.routing.checks import check_choice
from moe_course.routing.mod import (
    MOD_ROUTERS,
    attention_router_scores,
    gather_tokens,
    mod_capacity,
    mod_gate,
    mod_select,
    scatter_attention,
    scatter_update,
    standard_router_scores,
)


class MoDRecord(NamedTuple):
    """What one MoD block did: index (batch, selected) int32 processed token positions (ascending);
    processed (batch, tokens) bool; scores (batch, tokens) float32 routing scores; gate (batch, selected)
    float32 multiplier of each processed token's update (1 under attention routing)."""

    index: jax.Array
    processed: jax.Array
    scores: jax.Array
    gate: jax.Array


class MoDBlock(nnx.Module):
    """A-MoD (Gadhikar et al. 2024) Eq. 2 (router="standard") or Eq. 5 (router="attention").

    Call: x (batch, tokens, width) -> (y, attention maps or None, MoDRecord). The selected tokens are
    gathered, run through the whole pre-LN block -- attention among themselves, then the MLP -- and their
    update is scattered back; every other token comes out bit-identical. The compute therefore falls with C:
    attention costs O((C P)^2), the MLP O(C P).
    ``previous_attention``: (batch, heads, tokens, tokens), the previous block's maps; required for attention
    routing. Returned maps (with ``return_attention``) are full (tokens x tokens) maps with zeros for skipped
    tokens (``scatter_attention``), so a following MoD block can route on them.
    block: the wrapped ``EncoderBlock`` (its parameters are named exactly as in a dense ViT's block, so a
    pretrained dense block can be adopted unchanged). dtype / param_dtype: the wrapped block's computation and
    parameter dtypes; the routing scores and the gate are float32 whatever they are. Raises ValueError for a
    bad router name or capacity.
    """

    def __init__(self, width: int, heads: int, mlp_dim: int, *, capacity: float, router: str, keep_first: bool,
                 num_tokens: int, dropout: float = 0.0, gelu: str = "exact", dtype=jnp.float32,
                 param_dtype=jnp.float32, rngs: nnx.Rngs):
        check_choice("router", router, MOD_ROUTERS)
        mod_capacity(num_tokens, capacity)
        self.capacity, self.router_kind, self.keep_first = capacity, router, keep_first
        self.block = EncoderBlock(width, heads, mlp_dim, dropout=dropout, gelu=gelu, dtype=dtype,
                                  param_dtype=param_dtype, rngs=rngs)
        # A fresh router, initialised like the ViT's weights: near-random choices and gates near sigmoid(0) = 1/2
        # when a pretrained block is adopted -- the starting point A-MoD's Table 3 compares attention routing with.
        self.router = (nnx.Linear(width, 1, use_bias=False, kernel_init=nnx.initializers.normal(0.02),
                                  param_dtype=param_dtype, rngs=rngs)
                       if router == "standard" else None)

    def __call__(self, x: jax.Array, *, previous_attention: jax.Array | None = None, deterministic: bool = True,
                 rngs: nnx.Rngs | None = None, return_attention: bool = False):
        if self.router_kind == "standard":
            scores = standard_router_scores(x, self.router.kernel[...])
        else:
            if previous_attention is None:
                raise ValueError("attention routing needs the previous block's attention maps (previous_attention); "
                                 "an MoD block cannot be the first block")
            scores = attention_router_scores(previous_attention)
        selection = mod_select(scores, self.capacity, keep_first=self.keep_first)
        picked = gather_tokens(x, selection.index)
        out, weights, _ = self.block(picked, deterministic=deterministic, rngs=rngs,
                                     return_attention=return_attention)
        update = out - picked
        gate = jnp.ones(selection.index.shape, jax.numpy.float32)
        if self.router_kind == "standard":
            gate = mod_gate(gather_tokens(scores[..., None], selection.index)[..., 0])
            update = update * gate[..., None].astype(update.dtype)
        y = scatter_update(x, selection.index, update)
        if return_attention:
            weights = scatter_attention(weights, selection.index, x.shape[1])
        return y, weights, MoDRecord(selection.index, selection.processed, selection.scores, gate)
