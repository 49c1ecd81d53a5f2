"""Checks of assignment 05 (Soft MoE): the inputs each answer is called on, and the course library's
reference (``moe_course.routing.soft``).

Runs in two places: in the grading sandbox (``cases`` and ``call``: the inputs, drawn from the grading seed,
and how the answers are called, with NumPy alone) and in the grader (``reference``, with the library). See
``moe_course.course.answers``.
"""

import numpy as np

from moe_course.course.answers import Check


def _logits_cases(rng):
    x = rng.normal(size=(3, 7, 5)).astype(np.float32)
    phi = rng.normal(size=(5, 4)).astype(np.float32)
    return [(x, phi, scale) for scale in (1.0, 3.5)]


def _logits(x, phi, scale):
    from moe_course.routing import soft_logits

    return np.asarray(soft_logits(x, phi, scale))


def _weights_cases(rng):
    # logits of scale 3: the softmaxes are far from uniform (a softmax over the wrong axis cannot pass)
    return [((3 * rng.normal(size=(2, 9, 6))).astype(np.float32),),
            ((3 * rng.normal(size=(1, 5, 8))).astype(np.float32),)]


def _both_weights(functions, logits):
    """One grade cell, two answers: (dispatch_weights, combine_weights), each on its own copy of the logits."""
    dispatch_weights, combine_weights = functions
    return dispatch_weights(logits.copy()), combine_weights(logits.copy())


def _weights(logits):
    from moe_course.routing import soft_combine_weights, soft_dispatch_weights

    return np.asarray(soft_dispatch_weights(logits)), np.asarray(soft_combine_weights(logits))


def _layer_cases(rng):
    x = rng.normal(size=(2, 8, 4)).astype(np.float32)
    phi = rng.normal(size=(4, 6)).astype(np.float32)
    w = rng.normal(size=(3, 4, 5)).astype(np.float32)  # 3 experts x 2 slots each, width 4 -> 5
    return [(x, phi, w, 2.0)]


def _layer(x, phi, expert_weights, scale):
    """Y = C f(D^T X) by ``apply_soft_experts``, expert i applying ``expert_weights[i]`` to its slots."""
    import jax.numpy as jnp

    from moe_course.routing import apply_soft_experts, soft_routing

    def expert_fn(buffers):  # (groups, experts, slots_per_expert, width) -> (..., width_out)
        return jnp.einsum("gesd,edo->geso", buffers, jnp.asarray(expert_weights))

    return np.asarray(apply_soft_experts(x, soft_routing(x, phi, scale), expert_fn, expert_weights.shape[0]))


CHECKS = {
    "logits_tests": Check(_logits_cases, _logits, rtol=1e-4, atol=1e-5),
    "weights_tests": Check(_weights_cases, _weights, rtol=1e-4, atol=1e-6, call=_both_weights),
    "layer_tests": Check(_layer_cases, _layer, rtol=1e-4, atol=1e-4),
}
