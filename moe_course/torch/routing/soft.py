"""PyTorch twin of ``moe_course.routing.soft``: Soft MoE dispatch and combine weights (Puigcerver et al.,
Eq. 1-3), with vmoe's L2 normalisation for the logits only; same arguments, results and errors."""

from __future__ import annotations

from typing import Callable, NamedTuple

import torch

from moe_course.routing.checks import check_ndim
from moe_course.routing.soft import NORM_EPS, check_soft_inputs, check_slot_count

__all__ = ["NORM_EPS", "SoftRouting", "apply_soft_experts", "l2_normalize", "soft_combine", "soft_combine_weights",
           "soft_dispatch_weights", "soft_logits", "soft_routing", "soft_slots"]

ExpertFn = Callable[[torch.Tensor], torch.Tensor]


def l2_normalize(x: torch.Tensor, axis: int = -1, eps: float = NORM_EPS) -> torch.Tensor:
    """x / sqrt(sum(x^2 over ``axis``) + eps): unit L2 norm along ``axis`` (a zero vector stays zero)."""
    return x * torch.rsqrt(x.square().sum(dim=axis, keepdim=True) + eps)


def soft_logits(x: torch.Tensor, phi: torch.Tensor, scale: torch.Tensor | float = 1.0) -> torch.Tensor:
    """Router logits ``scale * normalize(X) normalize(Phi)``: x (groups, tokens, width), phi (width, slots) ->
    (groups, tokens, slots) float32."""
    check_soft_inputs(x, phi)
    x_unit = l2_normalize(x.float(), axis=-1)
    phi_unit = l2_normalize(phi.float(), axis=0)
    return torch.einsum("gtd,ds->gts", x_unit, phi_unit * torch.as_tensor(scale, dtype=torch.float32))


def soft_dispatch_weights(logits: torch.Tensor) -> torch.Tensor:
    """D = softmax over the tokens (axis 1), per group and slot (Eq. 1): (groups, tokens, slots)."""
    check_ndim("logits", logits, 3, "(groups, tokens, slots)")
    return torch.softmax(logits, dim=1)


def soft_combine_weights(logits: torch.Tensor) -> torch.Tensor:
    """C = softmax over all slots (axis 2), per group and token (Eq. 3): (groups, tokens, slots)."""
    check_ndim("logits", logits, 3, "(groups, tokens, slots)")
    return torch.softmax(logits, dim=2)


class SoftRouting(NamedTuple):
    """logits, dispatch_weights (D), combine_weights (C): float32 (groups, tokens, slots)."""

    logits: torch.Tensor
    dispatch_weights: torch.Tensor
    combine_weights: torch.Tensor


def soft_routing(x: torch.Tensor, phi: torch.Tensor, scale: torch.Tensor | float = 1.0) -> SoftRouting:
    """Logits, D and C for tokens x (groups, tokens, width) and phi (width, slots)."""
    logits = soft_logits(x, phi, scale)
    return SoftRouting(logits, soft_dispatch_weights(logits), soft_combine_weights(logits))


def soft_slots(x: torch.Tensor, dispatch_weights: torch.Tensor) -> torch.Tensor:
    """Input slots X~ = D^T X (Eq. 1): x (groups, tokens, width), D (groups, tokens, slots) -> (groups, slots,
    width), combining the RAW tokens."""
    return torch.einsum("gts,gtd->gsd", dispatch_weights.to(x.dtype), x)


def soft_combine(slot_outputs: torch.Tensor, combine_weights: torch.Tensor) -> torch.Tensor:
    """Output tokens Y = C Y~ (Eq. 3): Y~ (groups, slots, width), C (groups, tokens, slots) -> (groups, tokens,
    width)."""
    return torch.einsum("gts,gsd->gtd", combine_weights.to(slot_outputs.dtype), slot_outputs)


def apply_soft_experts(x: torch.Tensor, routing: SoftRouting, expert_fn: ExpertFn, num_experts: int) -> torch.Tensor:
    """Y = C f(D^T X) (Eq. 1-3); expert_fn maps (groups, experts, slots_per_expert, width) to outputs.
    Raises ValueError naming num_experts when it does not divide the number of slots."""
    slots = routing.dispatch_weights.shape[-1]
    num_experts = check_slot_count(num_experts, slots)
    x_slots = soft_slots(x, routing.dispatch_weights)
    groups, _, width = x_slots.shape
    y_slots = expert_fn(x_slots.reshape(groups, num_experts, slots // num_experts, width))
    return soft_combine(y_slots.reshape(groups, slots, -1), routing.combine_weights)
