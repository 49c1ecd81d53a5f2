"""Checks of assignment 03 (Batch Prioritized Routing): the inputs each answer is called on, and the course
library's reference (``moe_course.routing.batch_prioritized_allocation``; ``moe_course.data.base.eval_batches``
for the evaluation's routing groups; ``dropped_tests`` checks a predicted number, with no inputs).

Runs in two places: in the grading sandbox (only ``cases``: the inputs, drawn from the grading seed, with
NumPy alone) and in the grader (``reference``, with the library). See ``moe_course.course.answers``.

The routings the answers are called on are drawn here, not computed (no code of a graded function, such as
02's ``top_k_routing``, is in the sandbox's copy of this file; ``build.check_no_cross_answers``): gates as the
k largest of a random point of the simplex (Dirichlet(1)), largest first, and random experts; plus gates that
are multiples of 1/8, where many tokens of a group have the same priority score (exactly, also for
``score="sum"``): equal scores must keep the group order.
"""

import numpy as np

from moe_course.course.answers import Check


def _drawn_gates(rng, shape, num_experts):
    """Gates of ``shape`` = (groups, tokens, k), float32: the k largest coordinates of a Dirichlet(1) draw over
    ``num_experts`` (router probabilities drawn as such, not computed from logits), largest first."""
    points = rng.dirichlet(np.ones(num_experts), size=shape[:2])
    return -np.sort(-points, axis=-1)[..., :shape[2]].astype(np.float32)


def _tied_routing(rng, shape, num_experts):
    """k distinct experts per token and gates from {1/8, ..., 8/8}, largest first: many equal scores."""
    groups, tokens, k = shape
    expert_index = np.argsort(rng.normal(size=(groups, tokens, num_experts)), axis=-1)[..., :k].astype(np.int32)
    gates = -np.sort(-rng.integers(1, 9, size=shape), axis=-1) / 8
    return expert_index, gates.astype(np.float32)


def _priority_cases(rng):
    gates = _drawn_gates(rng, (3, 10, 2), 4)
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
    # TOP-1 routings (each token's expert and gate, (groups, tokens)), with tight and loose capacities; and
    # gates on a grid of eighths, where equal gates decide who is dropped
    cases = []
    for capacity in (1, 3, 6):
        expert_index = rng.integers(0, 5, size=(2, 14)).astype(np.int32)
        cases.append((expert_index, _drawn_gates(rng, (2, 14, 1), 5)[..., 0], capacity))
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


# evaluation_groups (the debug task): class-sorted labels (as the digits' test split is stored) of random class
# sizes, several group sizes and evaluation seeds; the reference reads the order from the library's
# ``eval_batches`` (the order ``evaluate`` walks a split in), run on a stand-in dataset whose examples are
# their own indices.
def _evaluation_cases(rng):
    cases = []
    for classes, group_size in ((4, 8), (10, 6), (3, 5)):
        labels = np.repeat(np.arange(classes), rng.integers(group_size, 3 * group_size, size=classes))
        cases.append((labels, group_size, int(rng.integers(0, 1000))))
    return cases


def _evaluation_groups(labels, group_size, seed):
    from moe_course.data.base import eval_batches

    class Indices:  # a split of len(labels) examples, each its own index
        name = "indices"

        def split_size(self, split):
            return len(labels)

        def get(self, split, indices):
            return {"index": np.asarray(indices)}

    order = np.concatenate([batch["index"] for batch in eval_batches(Indices(), "test", group_size, order_seed=seed)])
    usable = len(labels) - len(labels) % group_size
    return order[:usable].reshape(-1, group_size)


CHECKS = {
    "priority_tests": Check(_priority_cases, _priority, exact=True),
    "evaluation_tests": Check(_evaluation_cases, _evaluation_groups, exact=True),
    "served_tests": Check(_served_cases, _served, exact=True),
    "dropped_tests": Check(lambda rng: [()], _dropped, exact=True, scalar=True),  # a prediction: no inputs
}
