"""Checks of assignment 03 (Batch Prioritized Routing): the inputs each answer is called on, and the course
library's reference (``moe_course.routing.batch_prioritized_allocation``).

Runs in two places: in the grading sandbox (only ``cases``: the inputs, drawn from the grading seed, with
NumPy alone) and in the grader (``reference``, with the library). See ``moe_course.course.answers``.

The routings the answers are called on are made here as ``top_k_routing`` makes them (softmax of random
logits, the k largest probabilities as gates, ties to the lower expert), plus gates that are multiples of
1/8, where many tokens of a group have the same priority score (exactly, also for ``score="sum"``): equal
scores must keep the group order.
"""

import numpy as np

from moe_course.course.answers import Check


def _routing(rng, shape, num_experts, decimals=None):
    """(expert_index, gates), each ``shape`` = (groups, tokens, k), as ``moe_course.routing.top_k_routing``
    gives them for random logits drawn here (rounded to ``decimals``: equal logits give equal gates). It takes
    the generator, not the logits, so that it answers no assignment's check (``build.check_no_cross_answers``)."""
    groups, tokens, k = shape
    logits = rng.normal(size=(groups, tokens, num_experts))
    logits = logits if decimals is None else np.round(logits, decimals)
    z = logits - logits.max(axis=-1, keepdims=True)
    probs = (np.exp(z) / np.exp(z).sum(axis=-1, keepdims=True)).astype(np.float32)
    expert_index = np.argsort(-probs, axis=-1, kind="stable")[..., :k].astype(np.int32)
    return expert_index, np.take_along_axis(probs, expert_index, axis=-1)


def _tied_routing(rng, shape, num_experts):
    """k distinct experts per token and gates from {1/8, ..., 8/8}, largest first: many equal scores."""
    groups, tokens, k = shape
    expert_index = np.argsort(rng.normal(size=(groups, tokens, num_experts)), axis=-1)[..., :k].astype(np.int32)
    gates = -np.sort(-rng.integers(1, 9, size=shape), axis=-1) / 8
    return expert_index, gates.astype(np.float32)


def _priority_cases(rng):
    # logits rounded to one decimal, as the old hidden test: tokens with equal logits get equal gates
    _, gates = _routing(rng, (3, 10, 2), 4, decimals=1)
    _, tied = _tied_routing(rng, (3, 10, 3), 4)
    return [(gates, score) for score in ("max", "sum")] + [(tied, score) for score in ("max", "sum")]


def _priority(gates, score):
    """The processing order of BPR: the inverse of its priority_rank (token -> place in the order)."""
    import jax.numpy as jnp

    from moe_course.routing import batch_prioritized_allocation

    groups, tokens, k = gates.shape
    expert_index = jnp.broadcast_to(jnp.arange(k, dtype=jnp.int32), gates.shape)  # the order ignores the experts
    rank = batch_prioritized_allocation(expert_index, jnp.asarray(gates), 1, k, score=score).priority_rank
    return np.argsort(np.asarray(rank), axis=1)


def _bpr_cases(rng):
    cases = []
    for k, capacity, score in ((1, 2, "max"), (2, 3, "max"), (2, 2, "sum"), (3, 4, "max")):
        expert_index, gates = _routing(rng, (2, 14, k), 5)
        cases.append((expert_index, gates, capacity, 5, score))
    for score in ("max", "sum"):  # equal scores decide who is dropped: group order
        expert_index, gates = _tied_routing(rng, (2, 12, 2), 4)
        cases.append((expert_index, gates, 2, 4, score))
    return cases


def _bpr(expert_index, gates, capacity, num_experts, score):
    import jax.numpy as jnp

    from moe_course.routing import batch_prioritized_allocation

    allocation = batch_prioritized_allocation(jnp.asarray(expert_index), jnp.asarray(gates), capacity, num_experts,
                                              score=score)
    return np.asarray(allocation.slot)


def _dropped_cases(rng):
    # Slots as an allocation leaves them, -1 (dropped) or a place in the buffer, drawn directly: nothing here
    # allocates, which an answer could otherwise call. k = 1 as the old hidden test; with k = 2 only the TOP-1
    # column counts.
    return [(rng.integers(-1, capacity, size=(groups, tokens, k)).astype(np.int32),)
            for groups, tokens, k, capacity in ((4, 16, 1, 2), (4, 16, 2, 3), (3, 10, 2, 1))]


def _dropped(slots):
    """1 - the served fraction of the TOP-1 choices, by ``Allocation.served`` (slot >= 0)."""
    import jax.numpy as jnp

    from moe_course.routing import Allocation

    allocation = Allocation(jnp.zeros(slots.shape, jnp.int32), jnp.ones(slots.shape, jnp.float32),
                            jnp.asarray(slots), None, 1, 1)
    return float(1.0 - np.asarray(allocation.served[..., 0], np.float64).mean())


CHECKS = {
    "priority_tests": Check(_priority_cases, _priority, exact=True),
    "bpr_tests": Check(_bpr_cases, _bpr, exact=True),
    "dropped_tests": Check(_dropped_cases, _dropped, rtol=0.0, atol=1e-9, scalar=True),
}
