"""Checks of assignment 08: the inputs each answer is called on, and the course library's reference.

Runs in two places: in the grading sandbox (``cases``, the inputs drawn from the grading seed, and ``call``,
which turns the router kernel an answer draws into numbers) and in the grader (``reference``, with the
library). See ``moe_course.course.inside.answers``. Apart from ``Check``, only the ``reference`` functions import
``moe_course`` (inside their bodies).

A random kernel cannot equal the library's draw, so ``router_tests`` compares laws: the answer draws a kernel
of 131,072 entries from a NumPy generator of the grading seed, the library's router
(``moe_course.layers.SparseMoE``, Flax's LeCun normal) draws one of the same shape from a JAX key of that seed,
and both are summed up by ``_law``, in units of ``sqrt(1 / width)``: the shape, seven quantiles, the largest
magnitude and the standard deviation (and whether the kernel comes from the generator given: the same seed
gives it again, another seed another). Two independent draws of one law differ there by at most 0.021 (the
largest difference of the library's draw and the solution's over 30 grading seeds, both cases), a plain
(untruncated) normal by about 2 in the largest magnitude, a kernel of the wrong fan-in by a factor in every
number: ``atol=0.06``.
"""

import numpy as np

from moe_course.course.inside.answers import Check

# The answer's router kernel comes from NumPy; the library's is Flax's initializer: the sandbox offers neither
# JAX nor Flax to call (moe_course.course.limits.inputs), so the initializer cannot answer its own check.
SANDBOX_WITHOUT = ("jax", "jaxlib", "flax")

QUANTILES = (0.02, 0.1, 0.25, 0.5, 0.75, 0.9, 0.98)


def _dense_arrays(rng, width, hidden):
    """A dense MLP's (fc1_kernel, fc1_bias, fc2_kernel, fc2_bias) in the course's (in, out) layout."""
    return (rng.normal(size=(width, hidden)).astype(np.float32), rng.normal(size=hidden).astype(np.float32),
            rng.normal(size=(hidden, width)).astype(np.float32), rng.normal(size=width).astype(np.float32))


def _copies_cases(rng):
    shapes = ((6, 10, 4), (8, 8, 1), (5, 3, 7))  # (width, hidden, experts); one expert; hidden < width
    return [(*_dense_arrays(rng, width, hidden), experts) for width, hidden, experts in shapes]


def _copies(fc1_kernel, fc1_bias, fc2_kernel, fc2_bias, num_experts):
    from moe_course.models.upcycling import expand_tile

    return tuple(np.asarray(expand_tile(a, num_experts)) for a in (fc1_kernel, fc1_bias, fc2_kernel, fc2_bias))


def _law(kernel, width):
    """(shape, QUANTILES, largest magnitude, standard deviation) of ``kernel * sqrt(width)``."""
    kernel = np.asarray(kernel, dtype=np.float64)
    scaled = kernel * np.sqrt(width)
    return (np.array(kernel.shape), np.quantile(scaled, QUANTILES), np.abs(scaled).max(), scaled.std())


def _router_call(function, width, num_experts, seed):
    """``_law`` of the answer's kernel for ``seed``, and 1 when the kernel is drawn from the generator given
    (the same seed gives it again, the next seed another), else 0."""
    kernel = np.asarray(function(width, num_experts, np.random.default_rng(seed)))
    again = np.asarray(function(width, num_experts, np.random.default_rng(seed)))
    other = np.asarray(function(width, num_experts, np.random.default_rng(seed + 1)))
    drawn = np.array_equal(kernel, again) and not np.array_equal(kernel, other)
    return (*_law(kernel, width), float(drawn))


def _router(width, num_experts, seed):
    from flax import nnx

    from moe_course.layers import SparseMoE

    layer = SparseMoE(width, 1, num_experts, rngs=nnx.Rngs(seed))  # the router is what counts
    return (*_law(layer.router.kernel[...], width), 1.0)  # a JAX key's draw: the same key, the same kernel


def _k():
    """The smallest k at which every token's gates sum to one under the library's router (4 experts, TOP_k after
    the softmax), for random logits: with identical experts and nothing dropped, the upcycled layer's output is
    that sum times the dense MLP's (``moe_course.models.upcycling``'s docstring; tests/test_upcycle.py checks it
    on a whole upcycled model)."""
    from moe_course.routing import top_k_routing

    logits = np.random.default_rng(0).normal(size=(1, 64, 4)).astype(np.float32)
    for k in range(1, 5):
        if np.allclose(np.asarray(top_k_routing(logits, k).gates).sum(axis=-1), 1.0, rtol=0.0, atol=1e-5):
            return k
    raise AssertionError("no k makes every token's gates sum to one")


def _torch_mlp_cases(rng):
    cases = []
    for hidden, width in ((12, 5), (8, 8), (3, 9)):
        cases.append((rng.normal(size=(hidden, width)).astype(np.float32), rng.normal(size=hidden).astype(np.float32),
                      rng.normal(size=(width, hidden)).astype(np.float32), rng.normal(size=width).astype(np.float32)))
    return cases


def _from_torch(fc1_weight, fc1_bias, fc2_weight, fc2_bias):
    from moe_course.torch.convert import to_nnx_layout

    return (to_nnx_layout(fc1_weight, "linear"), to_nnx_layout(fc1_bias, "plain"),
            to_nnx_layout(fc2_weight, "linear"), to_nnx_layout(fc2_bias, "plain"))


CHECKS = {
    "copies_tests": Check(_copies_cases, _copies, exact=True),
    "k_tests": Check(lambda rng: [()], _k, exact=True, scalar=True),  # a prediction: no inputs
    "router_tests": Check(lambda rng: [(w, e, int(rng.integers(2**31))) for w, e in ((1024, 128), (256, 512))],
                          _router, rtol=0.0, atol=0.06, call=_router_call),
    "torch_tests": Check(_torch_mlp_cases, _from_torch, exact=True),
}
