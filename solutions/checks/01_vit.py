"""Checks of assignment 01: the inputs each answer is called on, and the course library's reference.

Runs in two places: in the grading sandbox (only ``cases`` and ``call``: the inputs, drawn from the grading
seed, with NumPy alone) and in the grader (``reference``, with the library: ``moe_course.models.vit`` for the
patches and the patch embedding, ``moe_course.layers.attention`` for the attention weights and the mixing of
the values). The sandbox gets this file without the references (``moe_course.course.inputs``). See
``moe_course.course.answers``.
"""

import numpy as np

from moe_course.course.answers import Check


def _normal(rng, *shape):
    return rng.normal(size=shape).astype(np.float32)


# 1. patchify: square and non-square images, one and several channels, p = 1 (every pixel a patch).
# Cutting and reordering changes no value, so the patches must equal the library's exactly.
def _patchify_cases(rng):
    return [(_normal(rng, 3, 12, 12, 2), 4), (_normal(rng, 1, 6, 9, 1), 3), (_normal(rng, 2, 4, 4, 3), 1)]


def _patchify(images, patch_size):
    from moe_course.models.vit import patchify

    return np.asarray(patchify(images, patch_size))


# 2. embed_patches: the library's PatchEmbed (a strided nnx.Conv) with a kernel and a nonzero bias drawn
# here, scaled as its default (LeCun normal) initialisation, on a non-square and a square image.
def _embed_cases(rng):
    cases = []
    for batch, height, width, channels, p, out in ((2, 9, 12, 2, 3, 6), (3, 8, 8, 3, 2, 5)):
        kernel = (rng.normal(size=(p, p, channels, out)) / np.sqrt(p * p * channels)).astype(np.float32)
        cases.append((_normal(rng, batch, height, width, channels), kernel, _normal(rng, out), p))
    return cases


def _embed(images, kernel, bias, patch_size):
    import jax.numpy as jnp
    from flax import nnx

    from moe_course.models.vit import PatchEmbed

    p, _, channels, width = kernel.shape
    layer = PatchEmbed(p, channels, width, rngs=nnx.Rngs(0))
    layer.proj.kernel[...] = jnp.asarray(kernel)
    layer.proj.bias[...] = jnp.asarray(bias)
    return np.asarray(layer(jnp.asarray(images)))


# 3. attention_weights: as many queries as keys, and fewer queries than keys. (That large scores do not
# overflow is the visible test's job: its assert stops the cell before the answers are recorded.)
def _weights_cases(rng):
    return [(_normal(rng, 3, 7, 2, 8), _normal(rng, 3, 7, 2, 8)), (_normal(rng, 2, 5, 3, 4), _normal(rng, 2, 6, 3, 4))]


def _weights(q, k):
    from moe_course.layers.attention import attention_weights

    return np.asarray(attention_weights(q, k))


# 4. attend: weights drawn as random rows that sum to 1 (Dirichlet draws: nothing here computes attention
# weights, which an answer could otherwise call) and values v, also with fewer queries than keys; the reference
# mixes them as the library's MultiHeadAttention does when it returns its maps (moe_course.layers.attention).
def _attend_cases(rng):
    cases = []
    for batch, queries, keys, heads, dim in ((2, 5, 5, 2, 4), (2, 4, 6, 3, 5)):
        weights = rng.dirichlet(np.ones(keys), size=(batch, heads, queries)).astype(np.float32)
        cases.append((weights, _normal(rng, batch, keys, heads, dim)))
    return cases


def _attend(weights, v):
    import jax.numpy as jnp

    return np.asarray(jnp.einsum("bhqk,bkhd->bqhd", weights, v))


CHECKS = {
    "patchify_tests": Check(_patchify_cases, _patchify, exact=True),
    "embed_tests": Check(_embed_cases, _embed, rtol=1e-4, atol=1e-5),
    "weights_tests": Check(_weights_cases, _weights, rtol=1e-4, atol=1e-6),
    "attend_tests": Check(_attend_cases, _attend, rtol=1e-4, atol=1e-5),
}
