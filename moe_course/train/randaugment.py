"""RandAugment (N, M) on the accelerator: a whole batch at once, inside the compiled training step.

The same operations, magnitudes and draws as the image folders' RandAugment in the input workers
(``moe_course.data.randaugment``, kornia on one CPU core per worker, about 3 ms an image at 224 px): kornia's 15
default operations at TensorFlow's magnitudes (``operation_magnitudes``: M = 10 is the end of every range), N
*distinct* operations per image applied in the order drawn, each with probability 1, a random sign per image for
the symmetric ones (rotate, shear, translate), black where a geometric operation uncovers the image, float pixels
in [0, 1] throughout. Each operation is written after kornia's 0.9 functional code (named in ``apply_operation``);
tests/test_randaugment_device.py compares every one with kornia's on the same images and parameters, and the whole
of RandAugment with the workers' on the statistics of many images. Two differences, both kept small on purpose: the
images are not rounded back to uint8 at the end (the step trains on the floats), and the draws come from the
step's key rather than from each example's (seed, epoch, index), so the workers' and the accelerator's runs see
different (equally distributed) augmentations.

Why on the accelerator: a GPU training ViT-S/16 at 8,000 images/s would need some 25 CPU cores for kornia alone;
here the CPU only decodes, crops and flips. Each image computes all 15 operations' outputs and keeps the one drawn
(``jax.vmap`` of a choice turns into a select), with the five geometric ones folded into one bilinear warp; its
cost against the ViT-S/16 step is measured by benchmarks/input_pipeline.py (``--tables 3``; benchmarks/README.md).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from moe_course.data.randaugment import (DEFAULT_POLICY, WITHOUT_MAGNITUDE, check_randaugment,
                                         operation_magnitudes)

OPERATIONS = tuple(name for name, _, _ in DEFAULT_POLICY)
SYMMETRIC = np.array([low == -high and name not in WITHOUT_MAGNITUDE for name, low, high in DEFAULT_POLICY])


def auto_contrast(image: jax.Array) -> jax.Array:
    """Each channel stretched to [0, 1]: (x - min) / (max - min + 1e-6) (kornia ``normalize_min_max``)."""
    low, high = image.min(axis=(0, 1)), image.max(axis=(0, 1))
    return jnp.clip((image - low) / (high - low + 1e-6), 0.0, 1.0)


def _equalize_channel(plane: jax.Array) -> jax.Array:
    """PIL's ``ImageOps.equalize`` of one (H, W) plane in [0, 1], as kornia's ``_scale_channel_batched``: the
    histogram of the 8-bit levels floor(255 x), a look-up table (level i -> (pixels below level i + step // 2)
    // step) with step = (pixels - count of the top level) // 255; a plane whose step is 0 (one level, or nearly)
    is returned unchanged. The table is integer arithmetic throughout, as PIL's: a float quotient that XLA
    computes as a product with the reciprocal (11421 / 47 -> 242.99998) would floor one level low exactly where
    the running count is a multiple of the step."""
    scaled = plane * 255.0
    level = jnp.clip(scaled.astype(jnp.int32), 0, 255)
    histogram = jnp.zeros(256, jnp.int32).at[level.reshape(-1)].add(1)
    top = jnp.max(jnp.where(histogram > 0, jnp.arange(256), 0))
    step = (level.size - histogram[top]) // 255
    below = jnp.cumsum(histogram) - histogram  # pixels below each level
    lut = jnp.clip((below + step // 2) // jnp.maximum(step, 1), 0, 255).astype(plane.dtype)
    return jnp.where(step == 0, scaled, lut[level]) / 255.0


def equalize(image: jax.Array) -> jax.Array:
    """Histogram equalisation of each channel (kornia ``equalize``, PIL's algorithm)."""
    return jax.vmap(_equalize_channel, in_axes=2, out_axes=2)(image)


def posterize(image: jax.Array, bits: jax.Array) -> jax.Array:
    """The top ``bits`` bits of each 8-bit level floor(255 x) kept (kornia ``posterize``; 8: unchanged)."""
    shift = 2.0 ** (8 - bits)
    out = jnp.floor(jnp.floor(image * 255.0) / shift) * shift / 255.0
    return jnp.where(bits >= 8, image, out)


def solarize(image: jax.Array, threshold: jax.Array, addition: jax.Array | float = 0.0) -> jax.Array:
    """x + ``addition`` clipped to [0, 1], then every value at or above ``threshold`` inverted (kornia
    ``solarize``)."""
    image = jnp.clip(image + addition, 0.0, 1.0)
    return jnp.where(image < threshold, image, 1.0 - image)


def saturate(image: jax.Array, factor: jax.Array) -> jax.Array:
    """HSV saturation multiplied by ``factor`` (clipped to 1), hue and value kept (kornia ``adjust_saturation``,
    its float32 path without the HSV round trip)."""
    high, low = image.max(axis=-1, keepdims=True), image.min(axis=-1, keepdims=True)
    delta = high - low
    saturation = delta / jnp.where(high == 0, 1.0, high + 1e-8)
    new_delta = high * jnp.clip(saturation * factor, 0.0, 1.0)
    out = (image - low) * (new_delta / jnp.where(delta == 0, 1.0, delta)) + (high - new_delta)
    return jnp.clip(out, 0.0, 1.0)


def sharpness(image: jax.Array, factor: jax.Array) -> jax.Array:
    """Blend of the image with its 3 x 3 smoothing ([[1, 1, 1], [1, 5, 1], [1, 1, 1]] / 13) by ``factor``: 1 =
    unchanged, > 1 sharper; the one-pixel border is left as it is (kornia ``sharpness``, TensorFlow's)."""
    height, width = image.shape[:2]
    rows = image[:-2] + image[1:-1] + image[2:]  # the 3 x 3 box sum, separably
    box = rows[:, :-2] + rows[:, 1:-1] + rows[:, 2:]
    smooth = jnp.clip((box + 4.0 * image[1:-1, 1:-1]) / 13.0, 0.0, 1.0)
    inner = jnp.zeros((height, width, 1), bool).at[1:-1, 1:-1].set(True)
    degenerate = jnp.where(inner, jnp.pad(smooth, ((1, 1), (1, 1), (0, 0))), image)
    return jnp.clip(degenerate + (image - degenerate) * factor, 0.0, 1.0)


def operation_matrix(index: jax.Array, value: jax.Array, height: int, width: int) -> jax.Array:
    """The (3, 3) forward map, in pixel coordinates (x right, y down, pixel centres at integers), of geometric
    operation ``OPERATIONS[index]`` at signed magnitude ``value``; the identity for the other operations.

    rotate: ``value`` degrees about the centre ((W - 1) / 2, (H - 1) / 2), kornia's ``get_rotation_matrix2d``;
    shear_x / shear_y: kornia's ``get_shear_matrix2d`` about the centre at angle ``value`` x 180 degrees (shear
    factor tan(angle)); translate_x / translate_y: ``value`` x the side, in pixels (``get_translation_matrix2d``).
    """
    cx, cy = (width - 1) / 2, (height - 1) / 2
    angle = jnp.deg2rad(value)
    cos, sin = jnp.cos(angle), jnp.sin(angle)
    rotate = jnp.array([[cos, sin, (1 - cos) * cx - sin * cy], [-sin, cos, sin * cx + (1 - cos) * cy],
                        [0.0, 0.0, 1.0]])
    shear = jnp.tan(value * math.pi)  # kornia: value x 180 degrees
    one, zero = jnp.ones(()), jnp.zeros(())
    shear_x = jnp.array([[one, -shear, shear * cy], [zero, one, zero], [zero, zero, one]])
    shear_y = jnp.array([[one, zero, zero], [-shear, one, shear * cx], [zero, zero, one]])
    translate_x = jnp.array([[one, zero, value * width], [zero, one, zero], [zero, zero, one]])
    translate_y = jnp.array([[one, zero, zero], [zero, one, value * height], [zero, zero, one]])
    matrices = {"rotate": rotate, "shear_x": shear_x, "shear_y": shear_y, "translate_x": translate_x,
                "translate_y": translate_y}
    choices = jnp.stack([matrices.get(name, jnp.eye(3)) for name in OPERATIONS])
    return choices[index]


def warp(image: jax.Array, matrix: jax.Array) -> jax.Array:
    """The image moved by the forward map ``matrix`` (3, 3): output pixel p reads the input at matrix^-1 p,
    bilinearly, with zeros outside (kornia ``warp_affine`` with align_corners=True, padding "zeros")."""
    height, width = image.shape[:2]
    inverse = jnp.linalg.inv(matrix)
    ys, xs = jnp.meshgrid(jnp.arange(height, dtype=jnp.float32), jnp.arange(width, dtype=jnp.float32),
                          indexing="ij")
    sx = inverse[0, 0] * xs + inverse[0, 1] * ys + inverse[0, 2]
    sy = inverse[1, 0] * xs + inverse[1, 1] * ys + inverse[1, 2]
    x0, y0 = jnp.floor(sx), jnp.floor(sy)
    out = jnp.zeros_like(image)
    for dx in (0, 1):
        for dy in (0, 1):
            x, y = x0 + dx, y0 + dy
            weight = (1 - jnp.abs(sx - x)) * (1 - jnp.abs(sy - y))
            inside = (x >= 0) & (x <= width - 1) & (y >= 0) & (y <= height - 1)
            xi, yi = jnp.clip(x, 0, width - 1).astype(jnp.int32), jnp.clip(y, 0, height - 1).astype(jnp.int32)
            out = out + jnp.where(inside, weight, 0.0)[..., None] * image[yi, xi]
    return out


def apply_operation(image: jax.Array, index: jax.Array, value: jax.Array, threshold: jax.Array) -> jax.Array:
    """Operation ``OPERATIONS[index]`` of one (H, W, 3) float image in [0, 1] at magnitude ``value`` (signed for
    the symmetric ones; posterize: bits kept); ``threshold`` is solarize_add's, uniform in (0, 1) per image as
    kornia draws it. The photometric operations clip to [0, 1] first, as kornia's do."""
    height, width = image.shape[:2]
    geometric = warp(image, operation_matrix(index, value, height, width))
    image = jnp.clip(image, 0.0, 1.0)
    outputs = {
        "auto_contrast": auto_contrast(image),
        "equalize": equalize(image),
        "invert": 1.0 - image,
        "posterize": posterize(image, value),
        "solarize": solarize(image, value),
        "solarize_add": solarize(image, threshold, value),
        "color": saturate(image, value),
        "contrast": jnp.clip(image * value, 0.0, 1.0),
        "brightness": jnp.clip(image + (value - 1.0), 0.0, 1.0),
        "sharpness": sharpness(image, value),
    }
    out = geometric
    for i, name in enumerate(OPERATIONS):  # a chain of selects, which XLA fuses into one pass
        if name in outputs:
            out = jnp.where(index == i, outputs[name], out)
    return out


def magnitude_table(magnitude: float) -> jax.Array:
    """(15,) float32: each operation's magnitude at M = ``magnitude`` (``operation_magnitudes``), 0 for those
    without one."""
    values = operation_magnitudes(magnitude)
    return jnp.array([values.get(name, 0.0) for name in OPERATIONS], jnp.float32)


def randaugment(key: jax.Array, images: jax.Array, *, n: int, magnitude: float) -> jax.Array:
    """RandAugment (N, M) = (``n``, ``magnitude``) of a batch, each image its own draws.

    images: (batch, H, W, 3) float in [0, 1] (H, W >= 3). Returns the same shape, float32 in [0, 1]. Per image,
    from ``key``: ``n`` distinct operations of ``OPERATIONS`` applied in the order drawn, a sign per operation for
    the symmetric ones (probability 1/2 each), solarize_add's threshold uniform in (0, 1). Raises ValueError for a
    bad (N, M) (``data.randaugment.check_randaugment``) or an image shape that is not (batch, H, W, 3).
    Source: Cubuk et al. 2020, Sec. 3; the operations and magnitudes as ``moe_course.data.randaugment``.
    """
    n, magnitude = check_randaugment((n, magnitude))
    if images.ndim != 4 or images.shape[-1] != 3 or min(images.shape[1:3]) < 3:
        raise ValueError(f"images of shape {images.shape} are not allowed; use (batch, H, W, 3) with H, W >= 3")
    table = magnitude_table(magnitude)
    order, signs, thresholds = draw_operations(key, images.shape[0], n)
    values = table[order] * jnp.where(jnp.asarray(SYMMETRIC)[order], signs, 1.0)

    def one(image, order, values, thresholds):
        image = image.astype(jnp.float32)
        for layer in range(n):
            image = apply_operation(image, order[layer], values[layer], thresholds[layer])
        return image

    return jax.vmap(one)(images, order, values, thresholds)


def draw_operations(key: jax.Array, batch: int, n: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The random draws of RandAugment for ``batch`` images: (order (batch, n) int32, the indices into
    ``OPERATIONS`` of n distinct operations per image in the order applied; signs (batch, n) float32, +-1 with
    probability 1/2, used by the symmetric operations; thresholds (batch, n) float32 uniform in [0, 1),
    solarize_add's)."""
    order_key, sign_key, threshold_key = jax.random.split(key, 3)
    keys = jax.random.split(order_key, batch)
    order = jax.vmap(lambda k: jax.random.permutation(k, len(OPERATIONS))[:n])(keys).astype(jnp.int32)
    signs = jnp.where(jax.random.bernoulli(sign_key, 0.5, (batch, n)), -1.0, 1.0)
    return order, signs, jax.random.uniform(threshold_key, (batch, n))
