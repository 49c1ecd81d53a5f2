"""Pre-LayerNorm transformer encoder block: x + Attn(LN(x)), then x + MLP(LN(x))."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from moe_course.layers.attention import MultiHeadAttention
from moe_course.layers.mlp import MLP
from moe_course.layers.moe import MoEOutput

LAYER_NORM_EPS = 1e-6
# The residual stream's dtype whatever the computation dtype: the patch embedding, the embedded tokens and every
# block's x + f(x) are float32 and only the branches f compute in ``dtype`` -- as vmoe's VisionTransformerMoe
# under ``encoder.dtype="bfloat16"`` (nn/vit_moe.py: its ``embedding`` Conv has no dtype, and ``EncoderBlock``'s
# ``x + inputs`` promotes). big_vision's ViT under ``dtype_mm`` (models/vit.py) runs the patch Conv in bfloat16 and
# casts its position embeddings to it (``get_posemb(..., x.dtype)``): its stream is float32 only where
# ``pos_embedding`` is a float32 array (a float32 checkpoint), bfloat16 with its own init or sincos2d.
# tests/test_reference_models.py compares our bfloat16 logits with both codes' own.
RESIDUAL_DTYPE = jnp.float32


class EncoderBlock(nnx.Module):
    """One ViT encoder block (Dosovitskiy et al. 2021, Eq. 2-3). x: (batch, tokens, width) -> same shape.

    ``mlp``: None for the dense MLP of size ``mlp_dim``, or a module that returns an ``MoEOutput`` (V-MoE
    replaces the MLP of some blocks with a sparse MoE layer, Sec. 2.1). gelu: the dense MLP's GELU
    (``MLP``). dtype / param_dtype: computation and parameter dtypes of the LayerNorms (their statistics are
    float32 always, as Flax computes them), the attention and the dense MLP; an ``mlp`` module brings its own.
    The branches return ``dtype``; the sums x + f(x) are in the promoted dtype of x and the branch, so a
    float32 x (the models' residual stream, ``RESIDUAL_DTYPE``) stays float32 under dtype=bfloat16.
    attention_mask: (batch, tokens, tokens) bool or None, which keys each query sees. token_mask, modality:
    (batch, tokens) bool / int or None, handed to an MoE ``mlp`` (padding takes no expert slot; LIMoE's
    per-modality aux losses); a dense MLP treats every token alike.
    Returns (y, attention maps or None, MoEOutput or None).
    """

    def __init__(self, width: int, heads: int, mlp_dim: int, *, dropout: float = 0.0, rngs: nnx.Rngs,
                 mlp: nnx.Module | None = None, gelu: str = "exact", dtype=jnp.float32, param_dtype=jnp.float32):
        precision = dict(dtype=dtype, param_dtype=param_dtype)
        self.norm1 = nnx.LayerNorm(width, epsilon=LAYER_NORM_EPS, **precision, rngs=rngs)
        self.attn = MultiHeadAttention(width, heads, **precision, rngs=rngs)
        self.norm2 = nnx.LayerNorm(width, epsilon=LAYER_NORM_EPS, **precision, rngs=rngs)
        self.mlp = mlp if mlp is not None else MLP(width, mlp_dim, gelu=gelu, **precision, rngs=rngs)
        self.drop = nnx.Dropout(dropout)

    def __call__(self, x: jax.Array, *, deterministic: bool = True, rngs: nnx.Rngs | None = None,
                 return_attention: bool = False, attention_mask: jax.Array | None = None,
                 token_mask: jax.Array | None = None, modality: jax.Array | None = None):
        h = self.attn(self.norm1(x), return_attention=return_attention, mask=attention_mask)
        h, weights = h if return_attention else (h, None)
        x = x + self.drop(h, deterministic=deterministic, rngs=rngs)
        if isinstance(self.mlp, MLP):
            h, moe = self.mlp(self.norm2(x)), None
        else:
            routing_args = {} if token_mask is None else {"token_mask": token_mask, "modality": modality}
            moe = self.mlp(self.norm2(x), deterministic=deterministic, rngs=rngs, **routing_args)
            assert isinstance(moe, MoEOutput), type(moe)
            h = moe.output
        x = x + self.drop(h, deterministic=deterministic, rngs=rngs)
        return x, weights, moe
