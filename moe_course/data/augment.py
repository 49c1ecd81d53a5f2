"""The training augmentation of the papers' ImageNet recipes: Inception-style random-resized crop and flip.

big_vision's ImageNet configs (and V-MoE's) train on ``inception_crop`` then ``flip_lr``: a random box covering
8-100% of the image's area with aspect ratio (width / height) in [3/4, 4/3] (Szegedy et al. 2015, "Going deeper
with convolutions", Sec. 6; big_vision ``pp/ops_image.py`` ``inception_crop``, which asks TensorFlow's
``sample_distorted_bounding_box``), resized to the training side, and a horizontal flip with probability 1/2.
The box is drawn as torchvision's ``RandomResizedCrop.get_params`` draws it (area uniform, ratio log-uniform,
10 tries, then the whole image clipped to the ratio range), in numpy, from one generator per example.
"""

from __future__ import annotations

import math

import numpy as np

CROP_AREA = (0.08, 1.0)  # fraction of the image's area
CROP_RATIO = (3 / 4, 4 / 3)  # width / height
_TRIES = 10


def example_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The generator of one training example's augmentation: a function of (seed, epoch, index) only."""
    return np.random.default_rng([seed, epoch, index, 0xA06])


def inception_crop_box(rng: np.random.Generator, width: int, height: int, *, area: tuple[float, float] = CROP_AREA,
                       ratio: tuple[float, float] = CROP_RATIO) -> tuple[int, int, int, int]:
    """A random crop box (left, top, crop width, crop height) in pixels of a ``width`` x ``height`` image.

    The box covers a fraction of the image's area drawn uniformly from ``area`` and has an aspect ratio (width /
    height) drawn log-uniformly from ``ratio``; after 10 draws that do not fit, the largest centred box whose
    ratio lies in ``ratio``. Raises ValueError for an empty image or ranges outside 0 < lo <= hi (area <= 1).
    """
    if width < 1 or height < 1:
        raise ValueError(f"image size {width}x{height} is not allowed; use at least 1x1 pixels")
    if not (0 < area[0] <= area[1] <= 1 and 0 < ratio[0] <= ratio[1]):
        raise ValueError(f"area={area}, ratio={ratio} are not allowed; use 0 < lo <= hi, area hi <= 1")
    total = width * height
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(_TRIES):
        target = total * rng.uniform(*area)
        aspect = math.exp(rng.uniform(*log_ratio))
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            return int(rng.integers(0, width - w + 1)), int(rng.integers(0, height - h + 1)), w, h
    aspect = width / height
    if aspect < ratio[0]:
        w, h = width, round(width / ratio[0])
    elif aspect > ratio[1]:
        w, h = round(height * ratio[1]), height
    else:
        w, h = width, height
    return (width - w) // 2, (height - h) // 2, w, h


def flip_left_right(rng: np.random.Generator) -> bool:
    """Whether to mirror the example horizontally (probability 1/2; big_vision's ``flip_lr``)."""
    return bool(rng.integers(0, 2))
