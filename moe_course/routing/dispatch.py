"""Dispatch tokens into expert buffers and combine the expert outputs back, two ways with equal results.

Given an ``Allocation`` (which choice sits in which slot of which expert's buffer):
- dispatch: x (groups, tokens, dim) -> expert inputs (groups, experts, capacity, dim); empty slots hold 0.
- combine: expert outputs (groups, experts, capacity, dim_out) -> (groups, tokens, dim_out); token t gets
  ``sum_j gate_j * expert_output[expert_j, slot_j]`` over its served choices; dropped choices add 0
  (in a V-MoE block the residual connection carries a fully dropped token on; V-MoE Sec. 2.4).

"einsum": the teaching reference, as in GShard and google-research/vmoe: a one-hot dispatch tensor
(groups, tokens, experts, capacity) and einsums. Its size is tokens * E * B ~ k * C * tokens^2 per group:
quadratic in the group size.
"gather" (default): the same numbers from index arithmetic. Each buffer slot records which token fills it
(an empty slot points at an appended zero token), the buffers are gathered, and each choice gathers its
slot's output. Memory is linear in the group size. The two agree in outputs and in gradients with respect
to x, the gates and the expert outputs.

Non-finite values (one documented behaviour for both): a NaN or inf entry goes exactly where its token or
slot goes and nowhere else, and arrives there as NaN. An einsum would spread it, since 0 * NaN = NaN puts
it into every slot (dispatch) or every token (combine) of the group; so the einsums run on the finite
entries and a second einsum of the non-finite indicator marks the entries that received one. A token with
non-finite gates (see ``allocation``) comes out NaN from both combines.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from moe_course.routing.allocation import Allocation
from moe_course.routing.checks import check_choice, check_ndim

IMPLEMENTATIONS = ("gather", "einsum")

ExpertFn = Callable[[jax.Array], jax.Array]


def check_tokens(x, allocation) -> None:
    """Raise ValueError unless x is (groups, tokens, dim) with the allocation's groups and tokens (JAX or torch)."""
    check_ndim("x", x, 3, "(groups, tokens, dim)")
    if tuple(jnp.shape(x)[:2]) != tuple(allocation.slot.shape[:2]):
        raise ValueError(f"x has shape {tuple(jnp.shape(x))}; its (groups, tokens) must match the allocation's "
                         f"{tuple(allocation.slot.shape[:2])}")


def check_buffers(expert_outputs, allocation) -> None:
    """Raise ValueError unless expert_outputs is (groups, experts, capacity, dim) as the allocation's buffers."""
    check_ndim("expert_outputs", expert_outputs, 4, "(groups, experts, capacity, dim)")
    expected = (allocation.slot.shape[0], allocation.num_experts, allocation.capacity)
    if tuple(jnp.shape(expert_outputs)[:3]) != expected:
        raise ValueError(f"expert_outputs has shape {tuple(jnp.shape(expert_outputs))}; its (groups, experts, "
                         f"capacity) must be {expected}")


# ----------------------------------------------------------------------------------------------------------
# One-hot einsum reference
# ----------------------------------------------------------------------------------------------------------


def dispatch_tensor(allocation: Allocation, dtype=jnp.float32) -> jax.Array:
    """(groups, tokens, experts, capacity) one-hot: 1 where token t sits in slot b of expert e, else 0.

    Dropped choices (slot -1) have no 1 anywhere. At most one 1 per (token, expert), since a token's k
    experts are distinct.
    """
    experts = jax.nn.one_hot(allocation.expert_index, allocation.num_experts, dtype=dtype)  # (G, T, k, E)
    slots = jax.nn.one_hot(allocation.slot, allocation.capacity, dtype=dtype)  # (G, T, k, B); -1 -> all 0
    return jnp.einsum("gtke,gtkb->gteb", experts, slots)


def combine_tensor(allocation: Allocation, dtype=jnp.float32) -> jax.Array:
    """(groups, tokens, experts, capacity): the dispatch tensor times each choice's gate (0 where dropped)."""
    experts = jax.nn.one_hot(allocation.expert_index, allocation.num_experts, dtype=dtype)
    slots = jax.nn.one_hot(allocation.slot, allocation.capacity, dtype=dtype)
    return jnp.einsum("gtk,gtke,gtkb->gteb", allocation.gates.astype(dtype), experts, slots)


def _confined_einsum(spec: str, weights: jax.Array, indicator: jax.Array, values: jax.Array) -> jax.Array:
    """``einsum(spec, weights, values)`` without spreading non-finite entries of ``values`` through zeros of
    ``weights``: an output entry is NaN where ``indicator`` (same layout as ``weights``, 1 where an entry of
    ``values`` really flows into the output) carries a non-finite entry there, else the einsum of the finite
    entries."""
    finite = jnp.isfinite(values)
    out = jnp.einsum(spec, weights, jnp.where(finite, values, jnp.zeros_like(values)))
    hit = jnp.einsum(spec, indicator, (~finite).astype(indicator.dtype))
    return jnp.where(hit > 0, jnp.nan, out)


def _nan_if_nonfinite(values: jax.Array) -> jax.Array:
    return jnp.where(jnp.isfinite(values), values, jnp.nan)


def einsum_dispatch(x: jax.Array, allocation: Allocation) -> jax.Array:
    """x (groups, tokens, dim) -> expert inputs (groups, experts, capacity, dim) via the dispatch tensor."""
    check_tokens(x, allocation)
    dispatch = dispatch_tensor(allocation, x.dtype)
    return _confined_einsum("gteb,gtd->gebd", dispatch, dispatch, x)


def einsum_combine(expert_outputs: jax.Array, allocation: Allocation) -> jax.Array:
    """expert outputs (groups, experts, capacity, dim) -> (groups, tokens, dim) via the combine tensor."""
    check_buffers(expert_outputs, allocation)
    dtype = expert_outputs.dtype
    return _confined_einsum("gteb,gebd->gtd", combine_tensor(allocation, dtype), dispatch_tensor(allocation, dtype),
                            expert_outputs)


# ----------------------------------------------------------------------------------------------------------
# Index / gather implementation (default)
# ----------------------------------------------------------------------------------------------------------


def _flat_slot(allocation: Allocation) -> jax.Array:
    """(groups, tokens, k) int32: expert * capacity + slot for served choices, experts * capacity if dropped."""
    size = allocation.num_experts * allocation.capacity
    return jnp.where(allocation.served, allocation.expert_index * allocation.capacity + allocation.slot, size)


def buffer_token_index(allocation: Allocation) -> jax.Array:
    """(groups, experts, capacity) int32: the token in each buffer slot; ``tokens`` (one past the last) if empty."""
    groups, tokens, k = allocation.slot.shape
    size = allocation.num_experts * allocation.capacity
    token = jnp.broadcast_to(jnp.arange(tokens, dtype=jnp.int32)[None, :, None], (groups, tokens, k))
    buffers = jnp.full((groups, size), tokens, jnp.int32)
    # Dropped choices point at index ``size``, out of bounds: mode="drop" ignores them.
    buffers = buffers.at[jnp.arange(groups)[:, None], _flat_slot(allocation).reshape(groups, tokens * k)].set(
        token.reshape(groups, tokens * k), mode="drop"
    )
    return buffers.reshape(groups, allocation.num_experts, allocation.capacity)


def gather_dispatch(x: jax.Array, allocation: Allocation) -> jax.Array:
    """x (groups, tokens, dim) -> expert inputs (groups, experts, capacity, dim) by gathering tokens into slots."""
    check_tokens(x, allocation)
    groups, _, dim = x.shape
    padded = jnp.concatenate([x, jnp.zeros((groups, 1, dim), x.dtype)], axis=1)  # token ``tokens`` is zero
    index = buffer_token_index(allocation).reshape(groups, -1)
    gathered = _nan_if_nonfinite(jnp.take_along_axis(padded, index[..., None], axis=1))
    return gathered.reshape(groups, allocation.num_experts, allocation.capacity, dim)


def gather_combine(expert_outputs: jax.Array, allocation: Allocation) -> jax.Array:
    """expert outputs (groups, experts, capacity, dim) -> (groups, tokens, dim): gate-weighted sum of slot outputs."""
    check_buffers(expert_outputs, allocation)
    groups, num_experts, capacity, dim = expert_outputs.shape
    _, tokens, k = allocation.slot.shape
    flat = expert_outputs.reshape(groups, num_experts * capacity, dim)
    flat = jnp.concatenate([flat, jnp.zeros((groups, 1, dim), flat.dtype)], axis=1)  # dropped -> zero row
    picked = jnp.take_along_axis(flat, _flat_slot(allocation).reshape(groups, tokens * k)[..., None], axis=1)
    weights = allocation.combine_weights.astype(expert_outputs.dtype)
    return _nan_if_nonfinite(jnp.einsum("gtk,gtkd->gtd", weights, picked.reshape(groups, tokens, k, dim)))


# ----------------------------------------------------------------------------------------------------------
# One interface for both
# ----------------------------------------------------------------------------------------------------------

_DISPATCH = {"gather": gather_dispatch, "einsum": einsum_dispatch}
_COMBINE = {"gather": gather_combine, "einsum": einsum_combine}


def dispatch(x: jax.Array, allocation: Allocation, *, implementation: str = "gather") -> jax.Array:
    """x (groups, tokens, dim) -> expert inputs (groups, experts, capacity, dim); empty slots are 0.

    implementation: "gather" (default, memory linear in tokens) or "einsum" (one-hot reference, quadratic).
    Raises ValueError for an unknown implementation or shapes that do not match the allocation.
    """
    return _DISPATCH[check_choice("implementation", implementation, IMPLEMENTATIONS)](x, allocation)


def combine(expert_outputs: jax.Array, allocation: Allocation, *, implementation: str = "gather") -> jax.Array:
    """expert outputs (groups, experts, capacity, dim) -> (groups, tokens, dim), weighted by the served gates.

    Outputs of empty slots are ignored, dropped choices contribute 0. ``implementation`` as in ``dispatch``.
    """
    return _COMBINE[check_choice("implementation", implementation, IMPLEMENTATIONS)](expert_outputs, allocation)


def apply_experts(
    x: jax.Array, allocation: Allocation, expert_fn: ExpertFn, *, implementation: str = "gather"
) -> jax.Array:
    """The sparse MoE computation ``sum_i g(x)_i e_i(x)`` (V-MoE Sec. 2.1) with capacity-limited buffers.

    x: (groups, tokens, dim). expert_fn: (groups, experts, capacity, dim) -> (groups, experts, capacity,
    dim_out), expert e applied to buffer e. Returns (groups, tokens, dim_out); a token whose choices were all
    dropped gets 0 (the caller's residual connection carries it on).
    """
    check_choice("implementation", implementation, IMPLEMENTATIONS)
    return combine(expert_fn(dispatch(x, allocation, implementation=implementation)), allocation,
                   implementation=implementation)
