"""Checks of assignment 05 (Soft MoE): the inputs each answer is called on, and the course library's
reference (``moe_course.routing.soft``).

Runs in two places: in the grading sandbox (``cases`` and ``call``: the inputs, drawn from the grading seed,
and how the answers are called, with NumPy alone) and in the grader (``reference``, with the library). See
``moe_course.course.inside.answers``.
"""

import numpy as np

from moe_course.course.inside.answers import Check


# 1. effective_tokens: logits of scale 3 (far from uniform: a softmax over the slots cannot pass) and of
# scale 0.3 (close to uniform), with as many tokens as slots and more.
def _effective_cases(rng):
    return [((3 * rng.normal(size=(2, 9, 6))).astype(np.float32),),
            ((0.3 * rng.normal(size=(3, 5, 5))).astype(np.float32),)]


def _effective(logits):
    """1 / sum_t D**2 of the library's dispatch weights D."""
    from moe_course.routing import soft_dispatch_weights

    return 1.0 / np.sum(np.asarray(soft_dispatch_weights(logits), np.float64) ** 2, axis=1)


# 2. limit_tokens: random tokens of different norms and phi; the reference is the argmax over the tokens of
# the library's logits (the limit of the dispatch softmax as the scale grows).
def _limit_cases(rng):
    cases = []
    for groups, tokens, width, slots in ((2, 7, 5, 4), (3, 4, 3, 6)):
        norms = rng.uniform(0.2, 5, size=(groups, tokens, 1))
        x = (rng.normal(size=(groups, tokens, width)) * norms).astype(np.float32)
        cases.append((x, rng.normal(size=(width, slots)).astype(np.float32)))
    return cases


def _limit(x, phi):
    from moe_course.routing import soft_logits

    return np.argmax(np.asarray(soft_logits(x, phi, 1.0)), axis=1)


# 4. soft_moe_layer, the port fixed: tokens of different norms (a normalised slot would lose them), one linear
# expert per slot, scales 1 and 4; the reference is the library's logits, weights, slots and combine.
def _layer_cases(rng):
    cases = []
    for groups, tokens, width, slots, width_out, scale in ((2, 7, 5, 3, 4, 1.0), (3, 4, 3, 6, 2, 4.0)):
        norms = rng.uniform(0.2, 5, size=(groups, tokens, 1))
        x = (rng.normal(size=(groups, tokens, width)) * norms).astype(np.float32)
        phi = rng.normal(size=(width, slots)).astype(np.float32)
        cases.append((x, phi, scale, rng.normal(size=(slots, width, width_out)).astype(np.float32)))
    return cases


def _layer(x, phi, scale, experts):
    import jax.numpy as jnp

    from moe_course.routing.soft import soft_combine, soft_routing, soft_slots

    routing = soft_routing(jnp.asarray(x), jnp.asarray(phi), scale)
    slots = soft_slots(jnp.asarray(x), routing.dispatch_weights)
    return np.asarray(soft_combine(jnp.einsum("gsd,sdo->gso", slots, jnp.asarray(experts)), routing.combine_weights))


# 3. the predicted factor by which the output changes when every token is doubled (checked after task 4): no
# inputs (the question is fixed); the reference measures it with the library's logits, weights, slots and
# combine on random tokens.
def _factor():
    import jax.numpy as jnp

    from moe_course.routing.soft import soft_combine, soft_routing, soft_slots

    rng = np.random.default_rng(0)
    x, phi = jnp.asarray(rng.normal(size=(2, 6, 4))), jnp.asarray(rng.normal(size=(4, 3)))
    experts = jnp.asarray(rng.normal(size=(3, 4, 2)))

    def layer(tokens):
        routing = soft_routing(tokens, phi)
        slots = soft_slots(tokens, routing.dispatch_weights)
        return soft_combine(jnp.einsum("gsd,sdo->gso", slots, experts), routing.combine_weights)

    return float(jnp.linalg.norm(layer(2 * x)) / jnp.linalg.norm(layer(x)))


CHECKS = {
    "effective_tests": Check(_effective_cases, _effective, rtol=1e-4, atol=1e-6),
    "limit_tests": Check(_limit_cases, _limit, exact=True),
    "layer_tests": Check(_layer_cases, _layer, rtol=1e-4, atol=1e-5),
    "factor_tests": Check(lambda rng: [()], _factor, rtol=0.0, atol=1e-3, scalar=True),  # a prediction: no inputs
}
