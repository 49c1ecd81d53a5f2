"""PyTorch twin of ``moe_course.layers.mod``: a Mixture-of-Depths block, a whole encoder block run on the top
``round(C * P)`` tokens of each image only (A-MoD, Gadhikar et al. 2024, Eq. 2 and Eq. 5)."""

from __future__ import annotations

import torch

from moe_course.layers.mod import MoDRecord
from moe_course.routing.checks import check_choice
from moe_course.torch.layers.block import EncoderBlock
from moe_course.torch.layers.init import linear
from moe_course.torch.routing.mod import (
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

__all__ = ["MoDBlock", "MoDRecord"]


class MoDBlock(torch.nn.Module):
    """The twin of ``moe_course.layers.MoDBlock``: same arguments (without ``rngs``), same results.

    forward: x (batch, tokens, width) -> (y, full attention maps or None, MoDRecord). Only the selected tokens
    go through ``block`` (attention among themselves, then the MLP); the rest come out bit-identical.
    previous_attention (batch, heads, tokens, tokens) is required for router="attention". Parameters:
    block (an ``EncoderBlock``), router (``Linear(width, 1, bias=False)``, router="standard" only; its weight
    (1, width) is the JAX kernel (width, 1) transposed). Raises ValueError for a bad router name or capacity,
    and for attention routing without previous_attention.
    """

    def __init__(self, width: int, heads: int, mlp_dim: int, *, capacity: float, router: str, keep_first: bool,
                 num_tokens: int, dropout: float = 0.0, gelu: str = "exact"):
        super().__init__()
        check_choice("router", router, MOD_ROUTERS)
        mod_capacity(num_tokens, capacity)
        self.capacity, self.router_kind, self.keep_first = capacity, router, keep_first
        self.block = EncoderBlock(width, heads, mlp_dim, dropout=dropout, gelu=gelu)
        self.router = None
        if router == "standard":
            self.router = linear(width, 1, bias=False)
            torch.nn.init.normal_(self.router.weight, std=0.02)

    def forward(self, x: torch.Tensor, *, previous_attention: torch.Tensor | None = None,
                generator: torch.Generator | None = None, return_attention: bool = False):
        """x: (batch, tokens, width) -> (y, attention weights or None, MoDRecord). The block runs on the
        selected tokens only; the others pass through unchanged (A-MoD Eq. 1-2). Attention routing needs
        ``previous_attention`` (batch, heads, tokens, tokens), else ValueError."""
        if self.router_kind == "standard":
            scores = standard_router_scores(x, self.router.weight)
        else:
            if previous_attention is None:
                raise ValueError("attention routing needs the previous block's attention maps (previous_attention); "
                                 "an MoD block cannot be the first block")
            scores = attention_router_scores(previous_attention)
        selection = mod_select(scores, self.capacity, keep_first=self.keep_first)
        picked = gather_tokens(x, selection.index)
        out, weights, _ = self.block(picked, generator=generator, return_attention=return_attention)
        update = out - picked
        gate = torch.ones(selection.index.shape, dtype=torch.float32, device=x.device)
        if self.router_kind == "standard":
            gate = mod_gate(gather_tokens(scores[..., None], selection.index)[..., 0])
            update = update * gate[..., None].to(update.dtype)
        y = scatter_update(x, selection.index, update)
        if return_attention:
            weights = scatter_attention(weights, selection.index, x.shape[1])
        return y, weights, MoDRecord(selection.index, selection.processed, selection.scores, gate)
