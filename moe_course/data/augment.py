"""The training augmentation of big_vision's ImageNet recipe: the Inception crop and the flip.

big_vision's ``vit_s16_i1k`` config (and V-MoE's ImageNet configs) train on ``decode_jpeg_and_inception_crop(224)``
then ``flip_lr``: a random box of the image (Szegedy et al. 2015, "Going deeper with convolutions", Sec. 6) drawn
by TensorFlow's ``sample_distorted_bounding_box`` with an area of 5-100% of the image and an aspect ratio (width /
height) in [0.75, 1.33], resized to the training side (bilinear, no antialias: ``data.resize.resize_bilinear``),
and a horizontal flip with probability 1/2. The numbers are big_vision's defaults, ``pp/ops_image.py``
``get_decode_jpeg_and_inception_crop(size=None, area_min=5, area_max=100, ratio_min=0.75, ratio_max=1.33,
method="bilinear", antialias=False)`` (line 199), which the config does not change. The box is drawn here by
TensorFlow's rule (``inception_crop_box``) in numpy, from one generator per example; torchvision's
``RandomResizedCrop`` draws another distribution (area uniform in 8-100%, ratio log-uniform in [3/4, 4/3]).
"""

from __future__ import annotations

import numpy as np

CROP_AREA = (0.05, 1.0)  # fraction of the image's area: big_vision's area_min=5, area_max=100 (percent)
CROP_RATIO = (0.75, 1.33)  # width / height: big_vision's ratio_min, ratio_max
CROP_ATTEMPTS = 100  # tf.image.sample_distorted_bounding_box's max_attempts (big_vision keeps the default)


def example_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The generator of one training example's augmentation: a function of (seed, epoch, index) only."""
    return np.random.default_rng([seed, epoch, index, 0xA06])


def _round(x) -> int:
    """C's ``lrintf``: to the nearest integer, halves to even."""
    return int(np.rint(x))


def _try_box(rng: np.random.Generator, width: int, height: int, area: tuple[float, float],
             aspect: np.float32) -> tuple[int, int, int, int] | None:
    """One attempt of TensorFlow's ``GenerateRandomCrop`` at aspect ratio ``aspect``: the box's height uniform
    among the whole heights whose area fits, its width round(height x aspect), its corner uniform; None when
    rounding leaves the area range or the image."""
    f32 = np.float32
    min_area, max_area = f32(area[0]) * f32(width) * f32(height), f32(area[1]) * f32(width) * f32(height)
    h = _round(np.sqrt(min_area / aspect))
    max_h = _round(np.sqrt(max_area / aspect))
    if _round(f32(max_h) * aspect) > width:  # the tallest box whose rounded width still fits
        max_h = int((width + 0.5 - float(f32(1e-7))) / float(aspect))
        if _round(f32(max_h) * aspect) > width:
            max_h -= 1
    max_h = min(max_h, height)
    h = min(h, max_h)
    if h < max_h:
        h += int(rng.integers(0, max_h - h + 1))
    w = _round(f32(h) * aspect)
    if w * h < min_area:
        h += 1
        w = _round(f32(h) * aspect)
    if w * h > max_area:
        h -= 1
        w = _round(f32(h) * aspect)
    if not (min_area <= w * h <= max_area and 0 < w <= width and 0 < h <= height):
        return None
    top = int(rng.integers(0, height - h)) if h < height else 0
    left = int(rng.integers(0, width - w)) if w < width else 0
    return left, top, w, h


def inception_crop_box(rng: np.random.Generator, width: int, height: int, *, area: tuple[float, float] = CROP_AREA,
                       ratio: tuple[float, float] = CROP_RATIO) -> tuple[int, int, int, int]:
    """A random crop box (left, top, crop width, crop height) in pixels of a ``width`` x ``height`` image, drawn
    as big_vision's Inception crop draws it.

    Up to 100 attempts: an aspect ratio (width / height) uniform in ``ratio`` (float32), then the box's height
    uniform among the whole heights whose area lies in ``area`` (fractions of the image's area) at that ratio and
    fits the image, its width round(height x ratio), its top-left corner uniform (TensorFlow's offsets stop one
    pixel short of the far edge); an attempt whose rounding leaves the range is drawn again. After 100 failed
    attempts: the whole image. Raises ValueError for an empty image or ranges outside 0 < lo <= hi (area <= 1).

    Source: big_vision ``pp/ops_image.py`` ``get_decode_jpeg_and_inception_crop`` (its
    ``tf.image.sample_distorted_bounding_box`` call: ``area_range=(area_min / 100, area_max / 100)``,
    ``aspect_ratio_range=(ratio_min, ratio_max)``, ``min_object_covered=0``); TensorFlow
    ``sample_distorted_bounding_box_op.cc`` ``GenerateRandomCrop``. The draws come from ``rng``, not Philox: the
    same distribution, other boxes.
    """
    if width < 1 or height < 1:
        raise ValueError(f"image size {width}x{height} is not allowed; use at least 1x1 pixels")
    if not (0 < area[0] <= area[1] <= 1 and 0 < ratio[0] <= ratio[1]):
        raise ValueError(f"area={area}, ratio={ratio} are not allowed; use 0 < lo <= hi, area hi <= 1")
    low, high = np.float32(ratio[0]), np.float32(ratio[1])
    for _ in range(CROP_ATTEMPTS):
        aspect = rng.random(dtype=np.float32) * (high - low) + low
        box = _try_box(rng, width, height, area, aspect)
        if box is not None:
            return box
    return 0, 0, width, height


def flip_left_right(rng: np.random.Generator) -> bool:
    """Whether to mirror the example horizontally (probability 1/2; big_vision's ``flip_lr``)."""
    return bool(rng.integers(0, 2))
