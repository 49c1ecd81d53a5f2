"""Checks of assignment 01: the inputs each answer is called on, and the course library's reference.

Runs in two places: in the grading sandbox (only ``cases`` and ``call``: the inputs, drawn from the grading
seed, with NumPy alone) and in the grader (``reference``, with the library: ``moe_course.models.vit`` for the
patches, the patch embedding, the way back to images and the predicted shape; ``moe_course.layers.attention``
for the attention maps of the debug task). The sandbox gets this file
without the references (``moe_course.course.inputs``). See ``moe_course.course.answers``.
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


# 3. unpatchify: square and non-square images, p = 1, 2 and 3 (the answer works p out from the shapes). The
# reference inverts the library's patchify: it patchifies an image of pixel numbers, which says where every
# patch value comes from. Only values move, so the images must equal the reference exactly.
def _unpatchify_cases(rng):
    cases = []
    for batch, height, width, channels, p in ((2, 6, 9, 2, 3), (1, 8, 4, 3, 2), (3, 5, 7, 1, 1), (2, 12, 12, 3, 4)):
        cases.append((_normal(rng, batch, (height // p) * (width // p), p * p * channels), height, width, channels))
    return cases


def _unpatchify(patches, height, width, channels):
    import jax.numpy as jnp

    from moe_course.models.vit import patchify

    batch, count, size = patches.shape
    p = {q for q in range(1, min(height, width) + 1) if q * q * channels == size}.pop()
    pixel = jnp.arange(height * width * channels).reshape(1, height, width, channels)
    source = np.asarray(patchify(pixel, p)).reshape(-1)  # the pixel each patch value comes from
    images = np.empty((batch, height * width * channels), patches.dtype)
    images[:, source] = patches.reshape(batch, -1)
    return images.reshape(batch, height, width, channels)


# 2. the predicted token shape of 8 images of 224 x 160 pixels, 3 channels, cut into 16 x 16 patches and
# embedded to width 384: no inputs (the question is fixed); the reference is the shape of the library's
# PatchEmbed output (its shape only, computed abstractly by jax.eval_shape).
def _shape(*_):
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from moe_course.models.vit import PatchEmbed

    layer = PatchEmbed(16, 3, 384, rngs=nnx.Rngs(0))
    return tuple(jax.eval_shape(lambda images: layer(images), jax.ShapeDtypeStruct((8, 224, 160, 3), jnp.float32)).shape)


# 5. attention_weights (the debug task): queries and keys of several batch sizes, token counts, heads and head
# widths, scaled up so that a missing 1/sqrt(d) changes every map; the reference is the library's
# attention_weights (moe_course.layers.attention), the maps MultiHeadAttention returns.
def _attention_cases(rng):
    return [(3 * _normal(rng, b, t, h, d), 3 * _normal(rng, b, t, h, d)) for b, t, h, d in ((2, 5, 2, 4), (1, 7, 3, 8),
                                                                                          (3, 3, 1, 16))]


def _attention(q, k):
    import jax.numpy as jnp

    from moe_course.layers.attention import attention_weights

    return np.asarray(attention_weights(jnp.asarray(q), jnp.asarray(k)))


CHECKS = {
    "patchify_tests": Check(_patchify_cases, _patchify, exact=True),
    "embed_tests": Check(_embed_cases, _embed, rtol=1e-4, atol=1e-5),
    "unpatchify_tests": Check(_unpatchify_cases, _unpatchify, exact=True),
    "shape_tests": Check(lambda rng: [()], _shape, exact=True),
    "attention_tests": Check(_attention_cases, _attention, rtol=1e-4, atol=1e-6),
}
