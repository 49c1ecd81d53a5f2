"""PyTorch twin of ``moe_course.routing.mod``: Mixture-of-Depths scores and token selection (A-MoD, Gadhikar
et al. 2024, Sec. 3; standard routing Eq. 1-2, attention routing Eq. 3-5); same arguments, results, errors."""

from __future__ import annotations

from typing import NamedTuple

import torch

from moe_course.routing.checks import check_floating, check_ndim
from moe_course.routing.mod import MOD_ROUTERS, check_router_inputs, mod_capacity
from moe_course.torch.routing.router import top_k

__all__ = ["MOD_ROUTERS", "MoDSelection", "attention_router_scores", "gather_tokens", "mod_capacity", "mod_gate",
           "mod_select", "scatter_attention", "scatter_update", "standard_router_scores"]


def standard_router_scores(x: torch.Tensor, router_kernel: torch.Tensor) -> torch.Tensor:
    """A-MoD Eq. 1: ``r_i = x_i W_r``. x: (batch, tokens, width); router_kernel: (width,) or (width, 1) (for
    ``torch.nn.Linear(width, 1).weight``, (1, width), also accepted). Returns (batch, tokens) float32, computed
    in float32 also under ``torch.autocast``."""
    check_router_inputs(x, router_kernel)
    with torch.autocast(x.device.type, enabled=False):
        return torch.einsum("btd,d->bt", x.float(), router_kernel.reshape(-1).float())


def attention_router_scores(attention: torch.Tensor) -> torch.Tensor:
    """A-MoD Eq. 4: attention (batch, heads, queries, keys) -> (batch, keys) float32, the attention each token
    receives averaged over heads and query rows."""
    check_ndim("attention", attention, 4, "(batch, heads, queries, keys)")
    check_floating("attention", attention)
    return attention.float().mean(dim=(1, 2))


class MoDSelection(NamedTuple):
    """index (batch, selected) int32 ascending; processed (batch, tokens) bool; scores (batch, tokens) float32."""

    index: torch.Tensor
    processed: torch.Tensor
    scores: torch.Tensor


def mod_select(scores: torch.Tensor, capacity: float, *, keep_first: bool = False) -> MoDSelection:
    """The top ``mod_capacity(tokens, capacity)`` tokens of each image by score (A-MoD Eq. 2 and 5); ties go to
    the earlier token; keep_first always processes token 0 (the class token) within the budget."""
    check_ndim("scores", scores, 2, "(batch, tokens)")
    check_floating("scores", scores)
    batch, tokens = scores.shape
    selected = mod_capacity(tokens, capacity)
    ranked = scores.float()
    if keep_first:
        ranked = torch.cat([torch.full_like(ranked[:, :1], torch.inf), ranked[:, 1:]], dim=1)
    index = torch.sort(top_k(ranked, selected)[1], dim=-1).values.int()
    processed = torch.zeros(batch, tokens, dtype=torch.bool, device=scores.device).scatter(1, index.long(), True)
    return MoDSelection(index=index, processed=processed, scores=scores.float())


def mod_gate(router_scores: torch.Tensor) -> torch.Tensor:
    """The bounded multiplier ``sigmoid(r_i)`` of a processed token's update under standard routing (see the JAX
    ``mod_gate`` for why the sigmoid)."""
    return torch.sigmoid(router_scores)


def gather_tokens(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """x: (batch, tokens, width), index: (batch, selected) -> (batch, selected, width)."""
    return torch.gather(x, 1, index.long()[..., None].expand(-1, -1, x.shape[-1]))


def scatter_update(x: torch.Tensor, index: torch.Tensor, update: torch.Tensor) -> torch.Tensor:
    """x with ``update`` (batch, selected, width) added at the selected tokens; other tokens bit-identical."""
    return x.scatter_add(1, index.long()[..., None].expand(-1, -1, x.shape[-1]), update.to(x.dtype))


def scatter_attention(attention: torch.Tensor, index: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """attention (batch, heads, selected, selected) placed into a (batch, heads, tokens, tokens) map with zeros
    where a token did not take part."""
    batch, heads = attention.shape[:2]
    index = index.long()
    where = (torch.arange(batch, device=index.device)[:, None, None, None],
             torch.arange(heads, device=index.device)[None, :, None, None],
             index[:, None, :, None], index[:, None, None, :])
    return attention.new_zeros(batch, heads, num_tokens, num_tokens).index_put(where, attention)
