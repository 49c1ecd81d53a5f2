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


def _vanilla_cases(rng):  # k distinct experts per token, as TOP-k chooses them
    return [(np.argsort(rng.normal(size=(3, 12, 4)), axis=-1)[..., :k], capacity, 4)
            for k, capacity in ((1, 2), (2, 3), (2, 1), (3, 5))]


def _vanilla(expert_index, capacity, num_experts):
    import jax.numpy as jnp

    from moe_course.routing import vanilla_allocation

    gates = jnp.ones(expert_index.shape, jnp.float32)  # the slots do not depend on the gates
    return np.asarray(vanilla_allocation(jnp.asarray(expert_index), gates, capacity, num_experts).slot)


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
    "vanilla_tests": Check(_vanilla_cases, _vanilla, exact=True),
    "importance_tests": Check(lambda rng: [(rng.normal(scale=s, size=(3, 10, 6)).astype(np.float32),)
                                           for s in (0.5, 2.0)], _importance, rtol=1e-4, atol=0.0, scalar=True),
    "load_tests": Check(_load_cases, _load, rtol=2e-3, atol=1e-6, scalar=True),
}
