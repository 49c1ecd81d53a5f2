"""PyTorch twin of ``moe_course.routing.dispatch``: tokens into expert buffers and expert outputs back.

"gather" (default, memory linear in the group size) and the one-hot "einsum" reference (GShard, vmoe),
with the JAX module's results, non-finite convention and errors (see its docstring).
"""

from __future__ import annotations

from typing import Callable

import torch

from moe_course.routing.checks import check_choice
from moe_course.routing.dispatch import IMPLEMENTATIONS, check_buffers, check_tokens
from moe_course.torch.routing.allocation import Allocation, one_hot

__all__ = ["IMPLEMENTATIONS", "apply_experts", "buffer_token_index", "combine", "combine_tensor", "dispatch",
           "dispatch_tensor", "einsum_combine", "einsum_dispatch", "gather_combine", "gather_dispatch"]

ExpertFn = Callable[[torch.Tensor], torch.Tensor]


def dispatch_tensor(allocation: Allocation, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(groups, tokens, experts, capacity) one-hot: 1 where token t sits in slot b of expert e, else 0."""
    experts = one_hot(allocation.expert_index.long(), allocation.num_experts, dtype)
    slots = one_hot(allocation.slot.long(), allocation.capacity, dtype)  # -1 -> all 0
    return torch.einsum("gtke,gtkb->gteb", experts, slots)


def combine_tensor(allocation: Allocation, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(groups, tokens, experts, capacity): the dispatch tensor times each choice's gate (0 where dropped)."""
    experts = one_hot(allocation.expert_index.long(), allocation.num_experts, dtype)
    slots = one_hot(allocation.slot.long(), allocation.capacity, dtype)
    return torch.einsum("gtk,gtke,gtkb->gteb", allocation.gates.to(dtype), experts, slots)


def _confined_einsum(spec: str, weights: torch.Tensor, indicator: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """``einsum(spec, weights, values)`` without spreading non-finite entries of values through zero weights."""
    finite = torch.isfinite(values)
    out = torch.einsum(spec, weights, torch.where(finite, values, torch.zeros_like(values)))
    hit = torch.einsum(spec, indicator, (~finite).to(indicator.dtype))
    return torch.where(hit > 0, torch.nan, out)


def _nan_if_nonfinite(values: torch.Tensor) -> torch.Tensor:
    return torch.where(torch.isfinite(values), values, torch.nan)


def einsum_dispatch(x: torch.Tensor, allocation: Allocation) -> torch.Tensor:
    """x (groups, tokens, dim) -> expert inputs (groups, experts, capacity, dim) via the dispatch tensor."""
    check_tokens(x, allocation)
    tensor = dispatch_tensor(allocation, x.dtype)
    return _confined_einsum("gteb,gtd->gebd", tensor, tensor, x)


def einsum_combine(expert_outputs: torch.Tensor, allocation: Allocation) -> torch.Tensor:
    """expert outputs (groups, experts, capacity, dim) -> (groups, tokens, dim) via the combine tensor."""
    check_buffers(expert_outputs, allocation)
    dtype = expert_outputs.dtype
    return _confined_einsum("gteb,gebd->gtd", combine_tensor(allocation, dtype), dispatch_tensor(allocation, dtype),
                            expert_outputs)


def _flat_slot(allocation: Allocation) -> torch.Tensor:
    """(groups, tokens, k) int64: expert * capacity + slot for served choices, experts * capacity if dropped."""
    size = allocation.num_experts * allocation.capacity
    flat = allocation.expert_index.long() * allocation.capacity + allocation.slot.long()
    return torch.where(allocation.served, flat, size)


def buffer_token_index(allocation: Allocation) -> torch.Tensor:
    """(groups, experts, capacity) int32: the token in each buffer slot; ``tokens`` (one past the last) if empty."""
    groups, tokens, k = allocation.slot.shape
    size = allocation.num_experts * allocation.capacity
    device = allocation.slot.device
    token = torch.arange(tokens, dtype=torch.int32, device=device)[None, :, None].expand(groups, tokens, k)
    # One spare column at index ``size`` takes the dropped choices, then is cut off (JAX: mode="drop").
    buffers = torch.full((groups, size + 1), tokens, dtype=torch.int32, device=device)
    buffers = buffers.scatter(1, _flat_slot(allocation).reshape(groups, tokens * k), token.reshape(groups, tokens * k))
    return buffers[:, :size].reshape(groups, allocation.num_experts, allocation.capacity)


def gather_dispatch(x: torch.Tensor, allocation: Allocation) -> torch.Tensor:
    """x (groups, tokens, dim) -> expert inputs (groups, experts, capacity, dim) by gathering tokens into slots."""
    check_tokens(x, allocation)
    groups, _, dim = x.shape
    padded = torch.cat([x, x.new_zeros(groups, 1, dim)], dim=1)  # token ``tokens`` is zero
    index = buffer_token_index(allocation).reshape(groups, -1, 1).long().expand(-1, -1, dim)
    gathered = _nan_if_nonfinite(torch.gather(padded, 1, index))
    return gathered.reshape(groups, allocation.num_experts, allocation.capacity, dim)


def gather_combine(expert_outputs: torch.Tensor, allocation: Allocation) -> torch.Tensor:
    """expert outputs (groups, experts, capacity, dim) -> (groups, tokens, dim): gate-weighted sum of slot outputs."""
    check_buffers(expert_outputs, allocation)
    groups, num_experts, capacity, dim = expert_outputs.shape
    _, tokens, k = allocation.slot.shape
    flat = expert_outputs.reshape(groups, num_experts * capacity, dim)
    flat = torch.cat([flat, flat.new_zeros(groups, 1, dim)], dim=1)  # dropped -> zero row
    index = _flat_slot(allocation).reshape(groups, tokens * k, 1).expand(-1, -1, dim)
    picked = torch.gather(flat, 1, index).reshape(groups, tokens, k, dim)
    weights = allocation.combine_weights.to(expert_outputs.dtype)
    return _nan_if_nonfinite(torch.einsum("gtk,gtkd->gtd", weights, picked))


_DISPATCH = {"gather": gather_dispatch, "einsum": einsum_dispatch}
_COMBINE = {"gather": gather_combine, "einsum": einsum_combine}


def dispatch(x: torch.Tensor, allocation: Allocation, *, implementation: str = "gather") -> torch.Tensor:
    """x (groups, tokens, dim) -> expert inputs (groups, experts, capacity, dim); empty slots are 0.
    implementation: "gather" or "einsum". Errors as the JAX ``dispatch``."""
    return _DISPATCH[check_choice("implementation", implementation, IMPLEMENTATIONS)](x, allocation)


def combine(expert_outputs: torch.Tensor, allocation: Allocation, *, implementation: str = "gather") -> torch.Tensor:
    """expert outputs (groups, experts, capacity, dim) -> (groups, tokens, dim), weighted by the served gates."""
    return _COMBINE[check_choice("implementation", implementation, IMPLEMENTATIONS)](expert_outputs, allocation)


def apply_experts(x: torch.Tensor, allocation: Allocation, expert_fn: ExpertFn, *,
                  implementation: str = "gather") -> torch.Tensor:
    """The sparse MoE computation ``sum_i g(x)_i e_i(x)`` (V-MoE Sec. 2.1) with capacity-limited buffers.
    x: (groups, tokens, dim); expert_fn maps (groups, experts, capacity, dim) buffers to outputs."""
    check_choice("implementation", implementation, IMPLEMENTATIONS)
    return combine(expert_fn(dispatch(x, allocation, implementation=implementation)), allocation,
                   implementation=implementation)
