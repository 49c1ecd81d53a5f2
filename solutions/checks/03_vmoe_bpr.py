"""Checks of assignment 03 (Batch Prioritized Routing): the inputs each answer is called on, and the course
library's reference (``moe_course.routing.batch_prioritized_allocation``; ``dropped_tests`` checks a predicted
number, with no inputs).

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


def _served_cases(rng):
    # TOP-1 routings (each token's expert and gate, (groups, tokens)) as top_k_routing makes them, with tight
    # and loose capacities; and gates on a grid of eighths, where equal gates decide who is dropped
    cases = []
    for capacity in (1, 3, 6):
        expert_index, gates = _routing(rng, (2, 14, 1), 5)
        cases.append((expert_index[..., 0], gates[..., 0], capacity))
    expert_index, gates = _tied_routing(rng, (3, 12, 1), 3)
    return cases + [(expert_index[..., 0], gates[..., 0], 2)]


def _served(expert_index, gates, capacity):
    """BPR's served mask of the TOP-1 choices (``batch_prioritized_allocation`` with k = 1)."""
    import jax.numpy as jnp

    from moe_course.routing import batch_prioritized_allocation

    allocation = batch_prioritized_allocation(jnp.asarray(expert_index)[..., None], jnp.asarray(gates)[..., None],
                                              capacity, int(expert_index.max()) + 1)
    return np.asarray(allocation.served[..., 0])


def _dropped():
    """The choices BPR drops when 7, 3 and 2 of 12 tokens choose experts 0, 1 and 2 (capacity 4)."""
    expert_index = np.array([[0] * 7 + [1] * 3 + [2] * 2], np.int32)
    gates = np.linspace(0.9, 0.35, 12, dtype=np.float32)[None]
    return int((~_served(expert_index, gates, 4)).sum())


CHECKS = {
    "priority_tests": Check(_priority_cases, _priority, exact=True),
    "served_tests": Check(_served_cases, _served, exact=True),
    "dropped_tests": Check(lambda rng: [()], _dropped, exact=True, scalar=True),  # a prediction: no inputs
}
