"""Soft MoE routing (Puigcerver et al., "From Sparse to Soft Mixtures of Experts"): every slot is a weighted
average of all tokens, every token a weighted average of all slot outputs.

With tokens ``X`` (m, d) of one group (one image), per-slot parameters ``Phi`` (d, n*p) for n experts of p
slots each, and logits ``L = X Phi`` (m, n*p):
- dispatch weights ``D = softmax(L)`` over the TOKENS, separately for every slot (the columns of L), Eq. 1;
- slots ``X~ = D^T X`` (n*p, d): slot j is a convex combination of all m tokens, Eq. 1;
- expert i processes its p slots ``X~[i*p : (i+1)*p]``, giving ``Y~`` (n*p, d), Eq. 2;
- combine weights ``C = softmax(L)`` over ALL n*p SLOTS, separately for every token (the rows of L), Eq. 3;
- output ``Y = C Y~`` (m, d), Eq. 3.
Nothing is discrete: no top-k, no capacity, no dropped token, and the whole layer is differentiable.

Normalisation (as google-research/vmoe, ``vmoe/projects/soft_moe/router.py``): for the LOGITS ONLY, each
token and each column of Phi is L2-normalised over d and the product is multiplied by one learned scalar
``scale`` (initialised to 1), so ``L = scale * cos(x_t, phi_j)``. The slots are combinations of the RAW
tokens ``X``, not of the normalised ones: the experts see the token magnitudes the rest of the network
produced (the block's LayerNorm before the MLP has already set their scale). Some public ports normalise
the tokens fed to the experts too, or put an RMSNorm in front; both change what the experts receive and
are not what the paper describes. At initialisation |L| <= scale = 1, so D and C start close to uniform.

Shapes: ``x (groups, tokens, dim)``, ``phi (dim, slots)`` with ``slots = num_experts * slots_per_expert``,
slot j belongs to expert ``j // slots_per_expert``. A group is one image (the paper routes every image on
its own, so an image's output never depends on the rest of the batch).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from moe_course.routing.checks import check_floating, check_int, check_ndim

NORM_EPS = 1e-6  # added to the squared norm before the reciprocal square root, as vmoe's ``normalize``

ExpertFn = Callable[[jax.Array], jax.Array]


def l2_normalize(x: jax.Array, axis: int = -1, eps: float = NORM_EPS) -> jax.Array:
    """x / sqrt(sum(x^2 over ``axis``) + eps): unit L2 norm along ``axis`` (a zero vector stays zero)."""
    return x * jax.lax.rsqrt(jnp.sum(jnp.square(x), axis=axis, keepdims=True) + eps)


def check_soft_inputs(x: jax.Array, phi: jax.Array) -> None:
    """Raise ValueError unless x is (groups, tokens, width) floating and phi is (width, slots) with the same width."""
    check_ndim("x", x, 3, "(groups, tokens, width)")
    check_ndim("phi", phi, 2, "(width, slots)")
    check_floating("x", x)
    check_floating("phi", phi)
    if jnp.shape(x)[-1] != jnp.shape(phi)[0]:
        raise ValueError(f"width={jnp.shape(x)[-1]} of the tokens x does not match phi's {jnp.shape(phi)[0]} rows; "
                         f"phi must have shape (width, slots)")


def soft_logits(x: jax.Array, phi: jax.Array, scale: jax.Array | float = 1.0) -> jax.Array:
    """Router logits ``scale * normalize(X) normalize(Phi)``: (groups, tokens, slots) float32.

    x: (groups, tokens, width) floating tokens; phi: (width, slots) per-slot parameters; scale: scalar (the
    learned scale, a jax array inside a layer). Tokens are normalised over width, Phi's columns over width
    (vmoe ``SoftRouter``). Raises ValueError naming x, phi or width on a bad shape or dtype.
    """
    check_soft_inputs(x, phi)
    x_unit = l2_normalize(jnp.asarray(x, jnp.float32), axis=-1)
    phi_unit = l2_normalize(jnp.asarray(phi, jnp.float32), axis=0)
    return jnp.einsum("gtd,ds->gts", x_unit, phi_unit * jnp.asarray(scale, jnp.float32))


def soft_dispatch_weights(logits: jax.Array) -> jax.Array:
    """D = softmax over the tokens (axis 1), per group and slot (Eq. 1).

    logits: (groups, tokens, slots) -> (groups, tokens, slots) float; D[g, :, j] sums to 1."""
    check_ndim("logits", logits, 3, "(groups, tokens, slots)")
    return jax.nn.softmax(logits, axis=1)


def soft_combine_weights(logits: jax.Array) -> jax.Array:
    """C = softmax over all slots (axis 2), per group and token (Eq. 3).

    logits: (groups, tokens, slots) -> (groups, tokens, slots) float; C[g, t, :] sums to 1."""
    check_ndim("logits", logits, 3, "(groups, tokens, slots)")
    return jax.nn.softmax(logits, axis=2)


class SoftRouting(NamedTuple):
    """The soft router's decision for a batch of groups (all float32, (groups, tokens, slots)).

    logits: ``scale * cos(x_t, phi_j)``. dispatch_weights: D, columns (over tokens) sum to 1.
    combine_weights: C, rows (over slots) sum to 1.
    """

    logits: jax.Array
    dispatch_weights: jax.Array
    combine_weights: jax.Array


def soft_routing(x: jax.Array, phi: jax.Array, scale: jax.Array | float = 1.0) -> SoftRouting:
    """Logits, dispatch weights D and combine weights C for tokens x (groups, tokens, width) and phi (width, slots)."""
    logits = soft_logits(x, phi, scale)
    return SoftRouting(logits, soft_dispatch_weights(logits), soft_combine_weights(logits))


def soft_slots(x: jax.Array, dispatch_weights: jax.Array) -> jax.Array:
    """Input slots X~ = D^T X per group (Eq. 1): x (groups, tokens, width), D (groups, tokens, slots) ->
    (groups, slots, width), in x's dtype. The RAW tokens are combined (no normalisation)."""
    return jnp.einsum("gts,gtd->gsd", dispatch_weights.astype(x.dtype), x)


def soft_combine(slot_outputs: jax.Array, combine_weights: jax.Array) -> jax.Array:
    """Output tokens Y = C Y~ per group (Eq. 3): Y~ (groups, slots, width), C (groups, tokens, slots) ->
    (groups, tokens, width)."""
    return jnp.einsum("gts,gsd->gtd", combine_weights.astype(slot_outputs.dtype), slot_outputs)


def check_slot_count(num_experts: int, slots: int) -> int:
    """Return num_experts if it is a positive integer dividing ``slots``, else raise ValueError naming it."""
    num_experts = check_int("num_experts", num_experts)
    if slots % num_experts:
        raise ValueError(f"num_experts={num_experts} does not divide the {slots} slots; "
                         f"use slots = num_experts * slots_per_expert")
    return num_experts


def apply_soft_experts(x: jax.Array, routing: SoftRouting, expert_fn: ExpertFn, num_experts: int) -> jax.Array:
    """The Soft MoE computation Y = C f(D^T X) (Eq. 1-3).

    x: (groups, tokens, width). routing: from ``soft_routing``; its slots axis must be a multiple of
    num_experts. expert_fn: (groups, experts, slots_per_expert, width) -> same shape with dim_out, expert i
    applied to slots i*p .. i*p+p-1 (the layout ``moe_course.layers.Experts`` takes). Returns (groups,
    tokens, dim_out). Raises ValueError naming num_experts when it does not divide the number of slots.
    """
    slots = jnp.shape(routing.dispatch_weights)[-1]
    num_experts = check_slot_count(num_experts, slots)
    x_slots = soft_slots(x, routing.dispatch_weights)  # (G, n*p, d)
    groups, _, width = x_slots.shape
    y_slots = expert_fn(x_slots.reshape(groups, num_experts, slots // num_experts, width))
    return soft_combine(y_slots.reshape(groups, slots, -1), routing.combine_weights)
