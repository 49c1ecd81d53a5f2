"""PyTorch twin of ``moe_course.layers.block``: pre-LayerNorm encoder block, x + Attn(LN(x)), x + MLP(LN(x))."""

from __future__ import annotations

import torch

from moe_course.layers.block import LAYER_NORM_EPS
from moe_course.torch.layers.attention import MultiHeadAttention
from moe_course.torch.layers.mlp import MLP


class EncoderBlock(torch.nn.Module):
    """One ViT encoder block (Dosovitskiy et al. 2021, Eq. 2-3). x: (batch, tokens, width) -> same shape.

    ``mlp``: None for the dense MLP of size ``mlp_dim``, or an MoE module returning an ``MoEOutput``.
    forward returns (y, attention maps or None, MoEOutput or None); ``generator`` draws the MoE layer's router
    noise in training mode.
    """

    def __init__(self, width: int, heads: int, mlp_dim: int, *, dropout: float = 0.0,
                 mlp: torch.nn.Module | None = None, gelu: str = "exact"):
        super().__init__()
        self.norm1 = torch.nn.LayerNorm(width, eps=LAYER_NORM_EPS)
        self.attn = MultiHeadAttention(width, heads)
        self.norm2 = torch.nn.LayerNorm(width, eps=LAYER_NORM_EPS)
        self.mlp = mlp if mlp is not None else MLP(width, mlp_dim, gelu=gelu)
        self.drop = torch.nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, *, generator: torch.Generator | None = None, return_attention: bool = False):
        """x: (batch, tokens, width) -> (y, attention weights or None, MoEOutput of the MLP or None for a dense
        one); y has x's shape. ``generator`` draws router noise and dropout in ``.train()`` mode."""
        h = self.attn(self.norm1(x), return_attention=return_attention)
        h, weights = h if return_attention else (h, None)
        x = x + self.drop(h)
        if isinstance(self.mlp, MLP):
            h, moe = self.mlp(self.norm2(x)), None
        else:
            moe = self.mlp(self.norm2(x), generator=generator)
            h = moe.output
        return x + self.drop(h), weights, moe
