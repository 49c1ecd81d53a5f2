"""PyTorch twin of ``moe_course.layers.attention``: multi-head self-attention that can return its maps."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from moe_course.torch.layers.init import linear


def attention_weights(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) per head. q, k: (batch, tokens, heads, head_dim) -> (batch, heads, q, k) float32,
    scores and softmax in float32 also under ``torch.autocast`` (as the JAX twin; A-MoD routes on the maps)."""
    with torch.autocast(q.device.type, enabled=False):
        scores = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float()) / math.sqrt(q.shape[-1])
        return torch.softmax(scores, dim=-1)


class MultiHeadAttention(torch.nn.Module):
    """Multi-head self-attention (Vaswani et al. 2017, Sec. 3.2) with query/key/value/out projections.

    forward: x (batch, tokens, width) -> (batch, tokens, width); with ``return_attention=True`` also the maps
    (batch, heads, tokens, tokens), softmax over keys. Raises ValueError when heads does not divide width.
    """

    def __init__(self, width: int, heads: int):
        super().__init__()
        if width % heads:
            raise ValueError(f"heads={heads} does not divide width={width}")
        self.heads = heads
        self.query, self.key, self.value, self.out = (linear(width, width) for _ in range(4))

    def forward(self, x: torch.Tensor, *, return_attention: bool = False):
        """x: (batch, tokens, width) -> (batch, tokens, width); with ``return_attention`` also the attention
        weights (batch, heads, tokens, tokens), softmax over the last axis (ViT Eq. 2-3)."""
        b, t, w = x.shape
        split = lambda y: y.reshape(b, t, self.heads, w // self.heads)  # noqa: E731
        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        if not return_attention:  # fused attention: the maps are never materialised
            y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
            return self.out(y.transpose(1, 2).reshape(b, t, w))
        weights = attention_weights(q, k)
        return self.out(torch.einsum("bhqk,bkhd->bqhd", weights.to(v.dtype), v).reshape(b, t, w)), weights
