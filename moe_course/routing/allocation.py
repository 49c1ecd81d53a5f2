"""Capacity allocation: which token choices get a slot in their expert's buffer, and which are dropped.

V-MoE (Riquelme et al. 2021, Sec. 4.1, App. C.1) fills every expert buffer of B slots greedily, in two
nested loops: for i = 1..k, for each token in some order, put the token's TOP-i choice into the chosen
expert's buffer if it is not yet full, else drop that choice. So all TOP-1 choices are placed before any
TOP-2 choice ("K-major" order), and within one TOP-i round, the token order decides who is dropped:
- vanilla routing (Algorithm 1): tokens in their order in the group;
- Batch Prioritized Routing, BPR (Algorithm 2): tokens sorted by a priority score, highest first,
  across the whole group (so the images of a group compete for the buffers);
- skip-patch (Algorithm 3): only the top fraction S of tokens by score take part, then BPR.

The loops are vectorised the way google-research/vmoe does it: sort the tokens into processing order,
flatten the (k, tokens) choices K-major, and a cumulative sum of the one-hot expert choices gives each
choice its position in its expert's buffer; positions >= B are dropped; the inverse permutation puts the
result back into token order. Memory is (groups, k * tokens, experts) -- linear in the group size.

Experts-choice routing (Zhou et al. 2022) turns the question round: each expert takes its B best tokens.

Non-finite gates (a token whose router logits hold a NaN or inf; see ``router``): such a token takes part
in no allocation -- all its choices are dropped (slot -1), so it can neither take a finite token's slot nor
carry its NaN into an expert buffer -- and BPR ranks it last. Its gates stay NaN, and ``combine_weights``
keeps them, so the combine returns NaN for that token: the non-finite value is never turned into a 0.
Experts choice takes such a token only after every finite one.
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import NamedTuple

import jax
import jax.numpy as jnp

from moe_course.routing.capacity import round_count
from moe_course.routing.checks import (
    check_choice,
    check_floating,
    check_int,
    check_integer_array,
    check_ndim,
)

METHODS = ("vanilla", "bpr", "skip_patch")
COMBINE_WEIGHTS = ("probabilities", "token_normalized")  # Expert Choice combine weights
SCORES = ("max", "sum")


@dataclasses.dataclass(frozen=True)
class Allocation:
    """The outcome of capacity allocation for token-choice routing; a JAX pytree (capacity, num_experts static).

    expert_index: (groups, tokens, k) int32 -- the expert of each choice (TOP-1 first), as routed.
    gates: (groups, tokens, k) float -- the router's weight of each choice, unchanged, dropped or not.
    slot: (groups, tokens, k) int32 -- the choice's position in its expert's buffer, 0..capacity-1, or -1
        if the choice was dropped (expert full, or token skipped by skip-patch).
    priority_rank: (groups, tokens) int32 or None -- the token's place in the processing order, 0 = first
        (vanilla: its position in the group; BPR/skip-patch: its rank by priority score). None where the
        allocation has no token order (experts choice).
    num_experts: E. capacity: B, slots per expert and group.
    """

    expert_index: jax.Array
    gates: jax.Array
    slot: jax.Array
    priority_rank: jax.Array | None
    num_experts: int
    capacity: int

    @property
    def served(self) -> jax.Array:
        """(groups, tokens, k) bool: True where the choice got a buffer slot."""
        return self.slot >= 0

    @property
    def combine_weights(self) -> jax.Array:
        """(groups, tokens, k): the gates of served choices, 0 for dropped ones -- except a non-finite gate,
        which is kept, so that a token with non-finite gates comes out non-finite instead of 0."""
        keep = self.served | ~jnp.isfinite(self.gates)
        return jnp.where(keep, self.gates, jnp.zeros_like(self.gates))

    @property
    def expert_fill(self) -> jax.Array:
        """(groups, experts) int32: how many of each expert's ``capacity`` slots are used."""
        one_hot = jax.nn.one_hot(self.expert_index, self.num_experts, dtype=jnp.int32)
        return jnp.sum(one_hot * self.served[..., None], axis=(1, 2))


jax.tree_util.register_dataclass(
    Allocation,
    data_fields=["expert_index", "gates", "slot", "priority_rank"],
    meta_fields=["num_experts", "capacity"],
)


def priority_scores(gates: jax.Array, *, score: str = "max") -> jax.Array:
    """BPR priority score per token (V-MoE Sec. 4.1): (groups, tokens, k) -> (groups, tokens).

    score: "max" -- ``s(x) = max_e g(x)_e``, the largest gate (the paper's default); "sum" -- the sum of the
    token's k gates (Sec. 4.1 reports it works equally well; LIMoE uses it for K > 1).
    """
    check_choice("score", score, SCORES)
    return jnp.max(gates, axis=-1) if score == "max" else jnp.sum(gates, axis=-1)


def kept_tokens(tokens: int, keep_fraction: float) -> int:
    """Skip-patch: how many of ``tokens`` are processed, M = round(S * tokens) (halves up), at least 1.

    V-MoE App. C.1, Algorithm 3. Raises ValueError unless 0 < keep_fraction <= 1.
    """
    ok = isinstance(keep_fraction, numbers.Real) and not isinstance(keep_fraction, bool)
    if not (ok and 0 < keep_fraction <= 1):
        raise ValueError(f"keep_fraction={keep_fraction!r} is not allowed; use a number S with 0 < S <= 1")
    return max(1, round_count(keep_fraction * tokens, "round"))


def check_choice_arrays(expert_index, gates, num_experts, capacity) -> None:
    """Raise ValueError naming the argument unless expert_index (int) and gates (float) are (groups, tokens, k)
    arrays (JAX or torch) with 1 <= k <= num_experts, and capacity >= 1."""
    check_ndim("expert_index", expert_index, 3, "(groups, tokens, k)")
    check_integer_array("expert_index", expert_index)
    check_floating("gates", gates)
    if tuple(jnp.shape(gates)) != tuple(jnp.shape(expert_index)):
        raise ValueError(f"gates has shape {tuple(jnp.shape(gates))}; it must match expert_index's shape "
                         f"{tuple(jnp.shape(expert_index))}")
    num_experts = check_int("num_experts", num_experts)
    check_int("k (expert_index.shape[-1])", jnp.shape(expert_index)[-1], minimum=1, maximum=num_experts)
    check_int("capacity", capacity)


def allocate_in_order(
    expert_index: jax.Array, order: jax.Array, capacity: int, num_experts: int, *, num_kept: int | None = None,
    excluded: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Fill the expert buffers K-major, visiting tokens in ``order`` (the common core of Algorithms 1-3).

    expert_index: (groups, tokens, k) int. order: (groups, tokens) int, a permutation per group; order[g, r]
    is the token processed r-th. num_kept: only the first ``num_kept`` tokens of the order take part (the
    rest are skipped: skip-patch); None = all. excluded: (groups, tokens) bool or None; True tokens take no
    slot at all (non-finite gates). Returns (slot (groups, tokens, k) int32 with -1 for dropped choices,
    priority_rank (groups, tokens) int32 = the inverse permutation of ``order``).
    """
    groups, tokens, k = expert_index.shape
    in_order = jnp.take_along_axis(expert_index, order[..., None], axis=1)  # (G, T, k), processing order
    choices = jnp.swapaxes(in_order, 1, 2).reshape(groups, k * tokens)  # K-major: all TOP-1, then TOP-2 ...
    one_hot = jax.nn.one_hot(choices, num_experts, dtype=jnp.int32)  # (G, k*T, E)
    taking_part = jnp.ones((groups, tokens), bool)  # in processing order
    if num_kept is not None and num_kept < tokens:
        taking_part = taking_part & (jnp.arange(tokens) < num_kept)
    if excluded is not None:
        taking_part = taking_part & ~jnp.take_along_axis(excluded, order, axis=1)
    taking_part = jnp.tile(taking_part, (1, k))  # (G, k*T), K-major like ``choices``
    one_hot = one_hot * taking_part[..., None]
    # Position of each choice among the earlier choices of the same expert = its buffer slot if < capacity.
    position = jnp.take_along_axis(jnp.cumsum(one_hot, axis=1), choices[..., None], axis=2)[..., 0] - 1
    slot = jnp.where(taking_part & (position < capacity), position, -1).astype(jnp.int32)
    slot = jnp.swapaxes(slot.reshape(groups, k, tokens), 1, 2)  # (G, T, k), still in processing order
    rank = inverse_permutation(order)  # token -> place in the order
    return jnp.take_along_axis(slot, rank[..., None], axis=1), rank


def inverse_permutation(order: jax.Array) -> jax.Array:
    """(groups, tokens) int, a permutation per group -> its inverse, int32: rank[g, order[g, r]] = r.

    Equal to ``jnp.argsort(order, axis=1)`` (the token -> place-in-the-order map of BPR's "sort plus inverse
    permutation"), written as one scatter of 0..tokens-1 instead of a second sort.
    """
    groups, tokens = order.shape
    places = jnp.broadcast_to(jnp.arange(tokens, dtype=jnp.int32), (groups, tokens))
    return jnp.zeros((groups, tokens), jnp.int32).at[jnp.arange(groups)[:, None], order].set(places)


def vanilla_allocation(expert_index: jax.Array, gates: jax.Array, capacity: int, num_experts: int, *,
                       token_mask: jax.Array | None = None) -> Allocation:
    """Vanilla routing (V-MoE App. C, Algorithm 1): TOP-i rounds in turn, tokens in group order.

    expert_index, gates: (groups, tokens, k) int / float, from ``top_k_routing``. capacity: B >= 1 slots per
    expert and group (``expert_capacity``). num_experts: E. token_mask: (groups, tokens) bool or None; False
    tokens (padding) take part in no allocation: every choice dropped, no slot taken. Returns an
    ``Allocation``; priority_rank is the token position. Raises ValueError naming the argument on bad
    shapes, dtypes or values.
    """
    check_choice_arrays(expert_index, gates, num_experts, capacity)
    groups, tokens, _ = jnp.shape(expert_index)
    order = jnp.broadcast_to(jnp.arange(tokens, dtype=jnp.int32), (groups, tokens))
    slot, rank = allocate_in_order(jnp.asarray(expert_index), order, capacity, num_experts,
                                   excluded=_excluded(gates, token_mask))
    return Allocation(jnp.asarray(expert_index, jnp.int32), jnp.asarray(gates), slot, rank, num_experts, capacity)


def _nonfinite(gates: jax.Array) -> jax.Array:
    return ~jnp.all(jnp.isfinite(jnp.asarray(gates)), axis=-1)


def _excluded(gates: jax.Array, token_mask: jax.Array | None) -> jax.Array:
    """(groups, tokens) bool: tokens that take no slot -- non-finite gates, or False in ``token_mask``."""
    excluded = _nonfinite(gates)
    if token_mask is None:
        return excluded
    if jnp.shape(token_mask) != excluded.shape:
        raise ValueError(f"token_mask has shape {jnp.shape(token_mask)}; it must be (groups, tokens) = {excluded.shape}")
    return excluded | ~jnp.asarray(token_mask, bool)


def _priority_order(gates: jax.Array, score: str, excluded: jax.Array) -> jax.Array:
    # Highest score first; a stable sort keeps equal-score tokens in group order (lower token index first).
    # Excluded tokens come last (the NaN score of non-finite gates would otherwise sort by the backend's rule).
    scores = jnp.where(excluded, -jnp.inf, priority_scores(gates, score=score))
    return jnp.argsort(-scores, axis=1, stable=True).astype(jnp.int32)


def batch_prioritized_allocation(
    expert_index: jax.Array, gates: jax.Array, capacity: int, num_experts: int, *, score: str = "max",
    token_mask: jax.Array | None = None,
) -> Allocation:
    """Batch Prioritized Routing (V-MoE Sec. 4.1, App. C, Algorithm 2).

    Tokens of a group are sorted by ``priority_scores(gates, score=score)``, highest first (ties: lower token
    index first), then the buffers are filled K-major in that order. Arguments as ``vanilla_allocation``;
    score: "max" (default) or "sum". priority_rank is each token's place in the sorted order (masked-out
    tokens last).
    """
    check_choice_arrays(expert_index, gates, num_experts, capacity)
    excluded = _excluded(gates, token_mask)
    order = _priority_order(jnp.asarray(gates), score, excluded)
    slot, rank = allocate_in_order(jnp.asarray(expert_index), order, capacity, num_experts, excluded=excluded)
    return Allocation(jnp.asarray(expert_index, jnp.int32), jnp.asarray(gates), slot, rank, num_experts, capacity)


def skip_patch_allocation(
    expert_index: jax.Array,
    gates: jax.Array,
    capacity: int,
    num_experts: int,
    *,
    keep_fraction: float,
    score: str = "max",
    token_mask: jax.Array | None = None,
) -> Allocation:
    """Skip-patch routing (V-MoE App. C.1, Algorithm 3): keep the top ``keep_fraction`` S of tokens, then BPR.

    The tokens of a group are ranked as in BPR; only the first M = ``kept_tokens(tokens, S)`` take part, the
    others have all their choices dropped (slot -1). Arguments as ``batch_prioritized_allocation``, plus
    keep_fraction: 0 < S <= 1 (ValueError otherwise).
    """
    check_choice_arrays(expert_index, gates, num_experts, capacity)
    num_kept = kept_tokens(jnp.shape(expert_index)[1], keep_fraction)
    excluded = _excluded(gates, token_mask)
    order = _priority_order(jnp.asarray(gates), score, excluded)
    slot, rank = allocate_in_order(jnp.asarray(expert_index), order, capacity, num_experts, num_kept=num_kept,
                                   excluded=excluded)
    return Allocation(jnp.asarray(expert_index, jnp.int32), jnp.asarray(gates), slot, rank, num_experts, capacity)


def allocate(
    expert_index: jax.Array,
    gates: jax.Array,
    capacity: int,
    num_experts: int,
    *,
    method: str = "bpr",
    score: str = "max",
    keep_fraction: float | None = None,
    token_mask: jax.Array | None = None,
) -> Allocation:
    """One entry point for the three token-choice allocations, picked by name (for configs).

    method: "vanilla" (Algorithm 1), "bpr" (Algorithm 2) or "skip_patch" (Algorithm 3, needs
    keep_fraction). score: BPR priority score, "max" or "sum" (ignored by vanilla). token_mask: (groups,
    tokens) bool or None; False tokens (padding) take no buffer slot (see ``vanilla_allocation``). Raises
    ValueError for an unknown method, or a keep_fraction given to a method other than skip_patch.
    """
    check_choice("method", method, METHODS)
    if method == "skip_patch":
        if keep_fraction is None:
            raise ValueError("keep_fraction=None is not allowed for method='skip_patch'; use 0 < keep_fraction <= 1")
        return skip_patch_allocation(expert_index, gates, capacity, num_experts, keep_fraction=keep_fraction,
                                     score=score, token_mask=token_mask)
    if keep_fraction is not None:
        raise ValueError(f"keep_fraction={keep_fraction!r} is only allowed with method='skip_patch'; use None")
    if method == "vanilla":
        return vanilla_allocation(expert_index, gates, capacity, num_experts, token_mask=token_mask)
    return batch_prioritized_allocation(expert_index, gates, capacity, num_experts, score=score, token_mask=token_mask)


class ExpertsChoice(NamedTuple):
    """Experts-choice routing result (Zhou et al. 2022): every expert's B chosen tokens.

    token_index: (groups, experts, capacity) int32 -- the tokens expert e takes, best first (ties: lower
        token index first). weights: (groups, experts, capacity) float -- their combine weights (see
        ``experts_choice_allocation``). A token may be taken by several experts or by none.
    """

    token_index: jax.Array
    weights: jax.Array


def token_normalized_weights(token_index: jax.Array, weights: jax.Array, num_tokens: int) -> jax.Array:
    """Each token's Expert Choice weights divided by their sum over the experts that took it.

    token_index, weights: (groups, experts, capacity), as in ``ExpertsChoice``. Returns weights of that shape
    whose entries for one token sum to 1 (a token no expert took has none). Sparse upcycling for vision
    (Komatsuzaki et al., ICLR 2023, arXiv 2212.05055, Sec. 2.2 on the router) normalises so to soften the drop
    after the model surgery: with identical experts, each token then gets exactly the dense MLP's output.
    """
    groups = weights.shape[0]
    g = jnp.arange(groups)[:, None, None]
    total = jnp.zeros((groups, num_tokens), weights.dtype).at[g, token_index].add(weights)
    return weights / total[g, token_index]


def experts_choice_allocation(probs: jax.Array, capacity: int, *,
                              combine_weights: str = "probabilities") -> ExpertsChoice:
    """Each expert takes the ``capacity`` tokens of its group with the highest router probability.

    probs: (groups, tokens, experts) float, e.g. ``RouterOutput.probs``. capacity: 1 <= B <= tokens; Zhou et
    al. use B = tokens * c / E with capacity factor c (``expert_capacity(1, tokens, c, E)``).
    combine_weights: "probabilities" (Zhou et al.: the router probabilities themselves) or "token_normalized"
    (each token's weights divided by their sum over the experts that took it; ``token_normalized_weights``).
    Raises ValueError naming probs, capacity or combine_weights when they are not allowed.
    """
    check_ndim("probs", probs, 3, "(groups, tokens, experts)")
    check_floating("probs", probs)
    capacity = check_int("capacity", capacity, minimum=1, maximum=jnp.shape(probs)[1])
    check_choice("combine_weights", combine_weights, COMBINE_WEIGHTS)
    num_tokens = jnp.shape(probs)[1]
    probs = jnp.swapaxes(jnp.asarray(probs), 1, 2)  # (G, E, T)
    scores = jnp.where(_nonfinite(jnp.swapaxes(probs, 1, 2))[:, None, :], -jnp.inf, probs)  # non-finite last
    token_index = jax.lax.top_k(scores, capacity)[1]
    weights = jnp.take_along_axis(probs, token_index, axis=2)
    if combine_weights == "token_normalized":
        weights = token_normalized_weights(token_index, weights, num_tokens)
    return ExpertsChoice(token_index.astype(jnp.int32), weights)


def experts_choice_as_allocation(choice: ExpertsChoice, num_tokens: int) -> Allocation:
    """View an experts-choice result as an ``Allocation`` with k = E, so the same dispatchers serve both.

    Choice j of token t is expert j; its slot is where expert j put token t, or -1 if expert j did not take
    it; its gate is the router probability (0 where not taken). priority_rank is None.
    Returns arrays of shape (groups, num_tokens, experts).
    """
    groups, num_experts, capacity = choice.token_index.shape
    num_tokens = check_int("num_tokens", num_tokens)
    g = jnp.arange(groups)[:, None, None]
    e = jnp.arange(num_experts)[None, :, None]
    b = jnp.broadcast_to(jnp.arange(capacity, dtype=jnp.int32), choice.token_index.shape)
    slot = jnp.full((groups, num_tokens, num_experts), -1, jnp.int32).at[g, choice.token_index, e].set(b)
    gates = jnp.zeros((groups, num_tokens, num_experts), choice.weights.dtype).at[g, choice.token_index, e].set(
        choice.weights
    )
    expert_index = jnp.broadcast_to(jnp.arange(num_experts, dtype=jnp.int32), slot.shape)
    return Allocation(expert_index, gates, slot, None, num_experts, capacity)
