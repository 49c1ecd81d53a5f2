"""Checks of assignment 02: the inputs each answer is called on, and the course library's reference.

Runs in two places: in the grading sandbox (only ``cases``: the inputs, drawn from the grading seed) and
in the grader (``reference``, with the library). See ``moe_course.course.answers``.
"""

import numpy as np

from moe_course.course.answers import Check


def _top_k(logits, k):
    from moe_course.routing import top_k_routing

    routed = top_k_routing(logits, k)
    return np.asarray(routed.expert_index), np.asarray(routed.gates)


def _sparse_gates(logits, k):  # sparse_gates (the debug task): the library's TOP-k gates, zero elsewhere
    from moe_course.routing import top_k_routing

    routed = top_k_routing(logits, k)
    gates = np.zeros(logits.shape, np.float32)
    np.put_along_axis(gates, np.asarray(routed.expert_index), np.asarray(routed.gates), axis=-1)
    return gates


def _topk_cases(rng):
    cases = [(rng.normal(size=(2, 9, 5)).astype(np.float32), k) for k in (1, 2, 3)]
    return cases + [(np.round(rng.normal(size=(1, 6, 4)), 0).astype(np.float32), 2)]  # ties


def _capacity(k, tokens, capacity_ratio, num_experts):
    import warnings

    from moe_course.routing import expert_capacity

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return expert_capacity(k, tokens, capacity_ratio, num_experts)


def _capacity_cases(rng):
    tokens = [int(t) for t in rng.integers(5, 60, size=3)]
    return [(k, t, c, e) for k in (1, 2) for t in tokens for c in (0.25, 0.5, 1.05, 1.5) for e in (2, 4, 8) if k <= e]


# Router probabilities on a coarse grid: many tokens have exactly equal ones (ties: the lower token index first).
_GRID = np.array([[0.5, 0.25, 0.25], [0.25, 0.5, 0.25], [0.25, 0.25, 0.5], [0.375, 0.375, 0.25]], np.float32)


def _experts_choice_cases(rng):
    # router probabilities drawn as such (Dirichlet(1): a uniform point of the simplex per token; no softmax is
    # computed here, which would hand a submission a piece of importance_loss) with capacities from 1 to all
    # tokens; and rows of _GRID
    cases = [(rng.dirichlet(np.ones(4), size=(2, 10)).astype(np.float32), capacity) for capacity in (1, 3, 10)]
    return cases + [(_GRID[rng.integers(0, len(_GRID), size=(3, 8))], 4)]


def _experts_choice(probs, capacity):
    """The slot of every (token, expert): ``experts_choice_as_allocation`` of the library's choice."""
    from moe_course.routing import experts_choice_allocation, experts_choice_as_allocation

    choice = experts_choice_allocation(probs, capacity)
    return np.asarray(experts_choice_as_allocation(choice, probs.shape[1]).slot)


def _unserved():
    """Tokens of 16 that no expert takes when all probabilities are equal (4 experts, capacity 4)."""
    from moe_course.routing import experts_choice_allocation

    taken = np.asarray(experts_choice_allocation(np.full((1, 16, 4), 0.25, np.float32), 4).token_index)
    return 16 - len(np.unique(taken))


def _importance(logits):
    from moe_course.routing import importance_loss

    return float(importance_loss(logits))


def _load_cases(rng):
    cases = []
    for k in (1, 2):
        clean = rng.normal(size=(2, 12, 5)).astype(np.float32)
        cases.append((clean, clean + 0.2 * rng.normal(size=clean.shape).astype(np.float32), k, 0.2))
    return cases


def _load(logits, noisy_logits, k, sigma):
    from moe_course.routing import load_loss

    return float(load_loss(logits, noisy_logits, k, noise_std=sigma))


CHECKS = {
    "topk_tests": Check(_topk_cases, _top_k, rtol=1e-5, atol=1e-6),
    "capacity_tests": Check(_capacity_cases, _capacity, exact=True, scalar=True),
    "experts_choice_tests": Check(_experts_choice_cases, _experts_choice, exact=True),
    "importance_tests": Check(lambda rng: [(rng.normal(scale=s, size=(3, 10, 6)).astype(np.float32),)
                                           for s in (0.5, 2.0)], _importance, rtol=1e-4, atol=0.0, scalar=True),
    "load_tests": Check(_load_cases, _load, rtol=2e-3, atol=1e-6, scalar=True),
    "unserved_tests": Check(lambda rng: [()], _unserved, exact=True, scalar=True),  # a prediction: no inputs
    "gates_tests": Check(_topk_cases, _sparse_gates, rtol=1e-5, atol=1e-6),  # TOP-1's inputs among them
}
