"""Checks of assignment 06 (Mixture-of-Depths routing): the inputs each answer is called on, and the course
library's reference (``moe_course.routing.mod``).

Runs in two places: in the grading sandbox (``cases`` and ``call``: the inputs, drawn from the grading seed,
and how the answers are called, with NumPy alone) and in the grader (``reference``, with the library). See
``moe_course.course.inside.answers``.
"""

import numpy as np

from moe_course.course.inside.answers import Check


def _capacity_cases(rng):
    # Python's round goes half to even: capacity * tokens lands on a half for 0.5 and odd tokens (4m + 1
    # rounds down, 4m + 3 up), for 0.25 and tokens 4m + 2, for 0.125 and tokens 8m + 4; one token (at least 1)
    tokens = [1, int(4 * rng.integers(1, 16) + 1), int(4 * rng.integers(1, 16) + 3), int(4 * rng.integers(1, 16) + 2),
              int(8 * rng.integers(1, 8) + 4), int(rng.integers(2, 100))]
    return [(t, c) for t in tokens for c in (0.05, 0.125, 0.25, 0.5, 0.7, 1.0)]


def _capacity(tokens, capacity):
    from moe_course.routing import mod_capacity

    return mod_capacity(tokens, capacity)


def _select_cases(rng):
    # scores rounded to one decimal: equal scores at the cut, which go to the earlier token. + 0.0 turns the
    # -0.0 of rounding into 0.0: the reference (jax.lax.top_k) ranks -0.0 below 0.0, a NumPy sort as equal
    return [(np.round(rng.normal(size=(4, 17)), 1).astype(np.float32) + np.float32(0.0), capacity, first)
            for capacity in (0.125, 0.5, 0.75) for first in (False, True)]


def _select(scores, capacity, keep_first):
    import jax.numpy as jnp

    from moe_course.routing import mod_select

    selection = mod_select(jnp.asarray(scores), capacity, keep_first=keep_first)
    return np.asarray(selection.index), np.asarray(selection.processed)


# gradient_tests: router_gradient against jax.grad of sum(y * grad_out) through the library's scores, selection
# and gate (A-MoD Eq. 1-2 with the bounded gate ``mod_gate``), at two capacities.
def _gradient_cases(rng):
    cases = []
    for batch, tokens, width, capacity in ((2, 8, 4, 0.5), (3, 10, 5, 0.25)):
        x, update, grad_out = rng.normal(size=(3, batch, tokens, width)).astype(np.float32)
        cases.append((x, rng.normal(size=width).astype(np.float32), update, grad_out, capacity))
    return cases


def _gradient(x, w, update, grad_out, capacity):
    import jax
    import jax.numpy as jnp

    from moe_course.routing.mod import mod_gate, mod_select, standard_router_scores

    def loss(w):
        scores = standard_router_scores(jnp.asarray(x), w)
        kept = mod_select(scores, capacity).processed
        return jnp.sum((x + jnp.where(kept, mod_gate(scores), 0.0)[..., None] * update) * grad_out)

    return np.asarray(jax.grad(loss)(jnp.asarray(w)))


# block_tests: mod_block, the port fixed, against the library's scores, selection and bounded gate (mod_gate),
# with router weights of scale 1 and 50 (where an unbounded gate moves the tokens far).
def _block_cases(rng):
    cases = []
    for (batch, tokens, width, capacity), scale in zip(((2, 8, 4, 0.5), (3, 10, 5, 0.25)), (1.0, 50.0)):
        x, update = rng.normal(size=(2, batch, tokens, width)).astype(np.float32)
        cases.append((x, (scale * rng.normal(size=width)).astype(np.float32), update, capacity))
    return cases


def _block(x, w, update, capacity):
    import jax.numpy as jnp

    from moe_course.routing.mod import mod_gate, mod_select, standard_router_scores

    scores = standard_router_scores(jnp.asarray(x), jnp.asarray(w))
    kept = mod_select(scores, capacity).processed
    return np.asarray(x + jnp.where(kept, mod_gate(scores), 0.0)[..., None] * update)


# 2. the predicted number of patch tokens a block of capacity 0.125 processes out of 196 (+ the class token,
# kept), checked after task 3: no inputs (the question is fixed); the reference counts them with the library's
# mod_select.
def _patches():
    import jax.numpy as jnp

    from moe_course.routing.mod import mod_select

    scores = jnp.asarray(np.random.default_rng(0).random(size=(2, 197)), jnp.float32)
    return int(np.asarray(mod_select(scores, 0.125, keep_first=True).processed)[0, 1:].sum())


CHECKS = {
    "capacity_tests": Check(_capacity_cases, _capacity, exact=True, scalar=True),
    "select_tests": Check(_select_cases, _select, exact=True),
    "block_tests": Check(_block_cases, _block, rtol=1e-4, atol=1e-4),
    "gradient_tests": Check(_gradient_cases, _gradient, rtol=1e-4, atol=1e-5),
    "patches_tests": Check(lambda rng: [()], _patches, exact=True, scalar=True),  # a prediction: no inputs
}
