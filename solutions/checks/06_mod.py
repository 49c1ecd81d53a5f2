"""Checks of assignment 06 (Mixture-of-Depths routing): the inputs each answer is called on, and the course
library's reference (``moe_course.routing.mod``).

Runs in two places: in the grading sandbox (``cases`` and ``call``: the inputs, drawn from the grading seed,
and how the answers are called, with NumPy alone) and in the grader (``reference``, with the library). See
``moe_course.course.answers``.
"""

import numpy as np

from moe_course.course.answers import Check


def _scores_cases(rng):
    maps = rng.random(size=(3, 4, 7, 7)).astype(np.float32)
    maps = maps / maps.sum(axis=-1, keepdims=True)  # attention rows sum to 1
    x, w = rng.normal(size=(3, 7, 6)).astype(np.float32), rng.normal(size=(6,)).astype(np.float32)
    return [(x, w, maps)]


def _both_scores(functions, x, w, maps):
    """One grade cell, two answers: (standard_scores(x, w), attention_scores(maps))."""
    standard_scores, attention_scores = functions
    return standard_scores(x, w), attention_scores(maps)


def _scores(x, w, maps):
    import jax.numpy as jnp

    from moe_course.routing import attention_router_scores, standard_router_scores

    return (np.asarray(standard_router_scores(jnp.asarray(x), jnp.asarray(w))),
            np.asarray(attention_router_scores(jnp.asarray(maps))))


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


CHECKS = {
    # one tolerance for both scores: the standard scores' atol (x . w of unit normals in float32), the
    # attention scores' rtol (means of positive values near 1/7)
    "scores_tests": Check(_scores_cases, _scores, rtol=1e-5, atol=1e-5, call=_both_scores),
    "capacity_tests": Check(_capacity_cases, _capacity, exact=True, scalar=True),
    "select_tests": Check(_select_cases, _select, exact=True),
}
