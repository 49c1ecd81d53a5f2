"""ImageNet-style class-folder trees, in the course's batch format.

Layout (``root`` is what ``--data-dir`` points at)::

    root/train/<class>/<image files>     required
    root/val/<class>/<image files>       required
    root/test/<class>/<image files>      optional (without it the test split is empty)

Class names are the sorted folder names under ``train/``; label = index in that list. ``val/`` and ``test/``
may lack some classes but must not add any. Image files are those directly inside a class folder whose
suffix (any case) is in ``IMAGE_SUFFIXES``; other files and hidden entries are ignored. Files are listed
sorted, so example ``i`` of a split is the same file on every run. The layout is checked in the constructor;
the pixels are read in ``get``, so a corrupt image fails there, naming the file.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from PIL import Image

from moe_course.data.augment import example_rng, flip_left_right, inception_crop_box
from moe_course.data.base import SPLITS, DataError, check_indices
from moe_course.data.randaugment import apply_randaugment, check_randaugment, randaugment_module
from moe_course.data.resize import resize_area, resize_bilinear, resize_small_size

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".ppm", ".tif", ".tiff", ".webp")

# What PIL raises on a missing, unreadable, truncated or oversized image file.
_IMAGE_ERRORS = (OSError, SyntaxError, ValueError, Image.DecompressionBombError)


def _entries(folder: Path) -> list[os.DirEntry]:
    """The visible entries of ``folder``, sorted by name."""
    try:
        with os.scandir(folder) as it:
            return sorted((e for e in it if not e.name.startswith(".")), key=lambda e: e.name)
    except OSError as exc:
        raise DataError(f"{folder}: cannot be listed ({type(exc).__name__}: {exc}); expected a folder") from exc


def _is_image(entry: os.DirEntry) -> bool:
    return entry.is_file() and entry.name.lower().endswith(IMAGE_SUFFIXES)


def _class_folders(split_dir: Path) -> list[os.DirEntry]:
    """The class folders of ``split_dir``; DataError when there are none."""
    entries = _entries(split_dir)
    folders = [e for e in entries if e.is_dir()]
    if not folders:
        loose = sum(_is_image(e) for e in entries)
        hint = f" (found {loose} loose images: sort them into class folders first)" if loose else ""
        raise DataError(f"{split_dir}: has no class folders{hint}; expected {split_dir}/<class>/<image files>")
    return folders


def _scan_split(split_dir: Path, class_index: dict[str, int]) -> tuple[list[str], np.ndarray]:
    """(sorted image paths, (n,) int32 labels) of one split; DataError on an unknown or empty class folder."""
    paths: list[str] = []
    labels: list[int] = []
    for folder in _class_folders(split_dir):
        if folder.name not in class_index:
            raise DataError(
                f"{folder.path}: class {folder.name!r} is not in train/; expected only the "
                f"{len(class_index)} class folders of {split_dir.parent / 'train'}"
            )
        images = [e.path for e in _entries(Path(folder.path)) if _is_image(e)]
        if not images:
            raise DataError(f"{folder.path}: has no image files; expected files ending in {', '.join(IMAGE_SUFFIXES)}")
        paths += images
        labels += [class_index[folder.name]] * len(images)
    return paths, np.asarray(labels, np.int32)


def read_image(path: str, image_size: int, *, rng: np.random.Generator | None = None, flip: bool = True,
               resize_small: int | None = None) -> np.ndarray:
    """The image file at ``path`` as RGB pixels, (image_size, image_size, 3) uint8, as big_vision's ImageNet input
    makes them (``data.resize``: TensorFlow's resizes, clipped and truncated to uint8).

    Without ``rng`` (evaluation): big_vision's ``resize_small(resize_small)|central_crop(image_size)`` -- the
    shorter side resized by area to ``resize_small`` (None: ``image_size``), then the central ``image_size``
    crop. With ``rng`` (training): big_vision's ``decode_jpeg_and_inception_crop(image_size)|flip_lr`` -- the
    Inception box (``augment.inception_crop_box``: 5-100% of the area, aspect 0.75-1.33) resized to
    ``image_size`` bilinearly without antialias, then (with ``flip``) a horizontal flip with probability 1/2,
    every draw from ``rng``. Both decode the whole image (PIL), as TensorFlow does. Raises DataError naming the
    file when it cannot be read as an image.
    """
    try:
        with Image.open(path) as image:
            pixels = np.asarray(image.convert("RGB"))
    except _IMAGE_ERRORS as exc:
        raise DataError(
            f"{path}: not a readable image ({type(exc).__name__}: {' '.join(str(exc).split())}); "
            f"expected an image file PIL can open"
        ) from exc
    height, width = pixels.shape[:2]
    if rng is None:
        new_h, new_w = resize_small_size(height, width, max(image_size, resize_small or image_size))
        pixels = resize_area(pixels, new_h, new_w)
        top, left = (new_h - image_size) // 2, (new_w - image_size) // 2
        return pixels[top:top + image_size, left:left + image_size]
    left, top, w, h = inception_crop_box(rng, width, height)
    flip = flip and flip_left_right(rng)
    pixels = resize_bilinear(pixels[top:top + h, left:left + w], image_size, image_size)
    return np.ascontiguousarray(pixels[:, ::-1]) if flip else pixels


def read_images(paths: list[str], image_size: int, *, augment_seeds: list[tuple[int, int, int]] | None = None,
                flip: bool = True, resize_small: int | None = None) -> np.ndarray:
    """``read_image`` of every path: (n, image_size, image_size, 3) uint8. ``augment_seeds``: one (seed, epoch,
    index) per path for the training augmentation (``augment.example_rng``); None for evaluation crops, whose
    shorter side is resized to ``resize_small`` (None: image_size) first."""
    images = np.empty((len(paths), image_size, image_size, 3), np.uint8)
    for row, path in enumerate(paths):
        rng = None if augment_seeds is None else example_rng(*augment_seeds[row])
        images[row] = read_image(path, image_size, rng=rng, flip=flip, resize_small=resize_small)
    return images


class ImageFolder:
    """A class-folder tree (see module docstring).

    Batches: ``image`` (n, S, S, 3) float32 in [0, 1] with S = ``image_size`` (shorter side resized to S,
    then center crop), ``label`` (n,) int32 in [0, num_classes). Training batches of the input pipeline
    (``get_uint8(..., augment=True)``) are Inception crops with flips instead, drawn from ``seed``, followed by
    RandAugment (N, M) = ``randaugment`` where given (``data.randaugment``; None: none).

    Raises:
      DataError: in the constructor for a missing ``root``, ``train/`` or ``val/``, a split without class
        folders, a class folder without images, or a val/test class that train lacks; in ``get`` for an
        image file that cannot be read. The one-line message names the path and what was expected.
      ValueError: a bad ``image_size`` or ``randaugment``; ``randaugment.RandAugmentUnavailable`` (a ValueError)
        for ``randaugment`` without PyTorch or kornia installed. Both before the files are listed. A bad
        ``eval_crop_fraction`` or ``minival_fraction``, or a minival that leaves train or val empty.

    Recipe options (``moe_course.recipes.data_recipe_for``): ``eval_crop_fraction`` f in (0, 1]: evaluation
    images are resized so that their shorter side is round(image_size / f), then centrally cropped
    (big_vision's ``resize_small(256)|central_crop(224)`` is f = 224/256); None: f = 1. ``minival_fraction``:
    hold out that share of the training images (round(share x n), a fixed random choice independent of
    ``seed``) as the "val" split, as big_vision's ``train[99%:]`` minival; the folder's val/ then becomes the
    "test" split (unless a test/ folder exists, which stays the test split). 0: val/ is the val split.
    """

    def __init__(self, root: str | os.PathLike, *, image_size: int = 224, name: str = "imagefolder", seed: int = 0,
                 randaugment: tuple[int, float] | None = None, eval_crop_fraction: float | None = None,
                 minival_fraction: float = 0.0):
        if image_size < 1:
            raise ValueError(f"image_size={image_size} is not allowed; use a side of at least 1 pixel")
        if eval_crop_fraction is not None and not 0 < eval_crop_fraction <= 1:
            raise ValueError(f"eval_crop_fraction={eval_crop_fraction!r} is not allowed; use 0 < f <= 1 or None")
        if not 0 <= minival_fraction < 1:
            raise ValueError(f"minival_fraction={minival_fraction!r} is not allowed; use 0 <= share < 1")
        self.resize_small = None if eval_crop_fraction is None else round(image_size / eval_crop_fraction)
        self.minival_fraction = minival_fraction
        self.randaugment = None if randaugment is None else check_randaugment(randaugment)
        if self.randaugment is not None:
            randaugment_module(*self.randaugment)  # kornia here, now; a worker process builds its own copy
        root = Path(root)
        expected = f"expected {root}/train/<class>/<image files> and {root}/val/<class>/<image files>"
        if not root.is_dir():
            raise DataError(f"{root}: {'is not a folder' if root.exists() else 'does not exist'}; {expected}")
        for required in ("train", "val"):
            if not (root / required).is_dir():
                problem = "is not a folder" if (root / required).exists() else "does not exist"
                raise DataError(f"{root / required}: {problem}; {expected}")
        self.root = root
        self.name = name
        self.seed = seed
        self.image_shape = (image_size, image_size, 3)
        self.class_names = tuple(e.name for e in _class_folders(root / "train"))
        self.num_classes = len(self.class_names)
        class_index = {c: i for i, c in enumerate(self.class_names)}
        self._files: dict[str, list[str]] = {}
        self._labels: dict[str, np.ndarray] = {}
        for split in SPLITS:
            if split == "test" and not (root / "test").is_dir():
                self._files[split], self._labels[split] = [], np.zeros((0,), np.int32)
            else:
                self._files[split], self._labels[split] = _scan_split(root / split, class_index)
        if minival_fraction:
            self._hold_out_minival(minival_fraction)

    def _hold_out_minival(self, share: float) -> None:
        """Move round(share x n) training images, a fixed random choice, to "val"; val/ becomes "test" unless
        test/ exists."""
        n = len(self._files["train"])
        held = round(share * n)
        if not 0 < held < n:
            raise ValueError(f"minival_fraction={share} of the {n} training images of {self.root} holds out {held}; "
                             f"use a share that leaves at least one image on each side")
        order = np.random.default_rng(0x111A1).permutation(n)
        keep, out = np.sort(order[:n - held]), np.sort(order[n - held:])
        files, labels = self._files["train"], self._labels["train"]
        if not self._files["test"]:
            self._files["test"], self._labels["test"] = self._files["val"], self._labels["val"]
        self._files["val"], self._labels["val"] = [files[i] for i in out], labels[out]
        self._files["train"], self._labels["train"] = [files[i] for i in keep], labels[keep]

    def split_size(self, split: str) -> int:
        """Image files in ``split`` ("train", "val" or "test"); ValueError for another split."""
        if split not in SPLITS:
            raise ValueError(f"split={split!r} is not allowed; use one of {', '.join(SPLITS)}")
        return len(self._files[split])

    def files(self, split: str) -> list[str]:
        """The image paths of ``split``, in example order."""
        return list(self._files[split])

    def get(self, split: str, indices: np.ndarray, *, epoch: int = 0) -> dict[str, np.ndarray]:
        """Examples ``indices`` of ``split``: image (n, S, S, 3) float32 in [0, 1], label (n,) int32.

        ``epoch`` is unused (evaluation crops, no augmentation). DataError naming the file for an unreadable
        image; ValueError for an unknown/empty split or an out-of-range index.
        """
        batch = self.get_uint8(split, indices)
        return {**batch, "image": batch["image"].astype(np.float32) / 255.0}

    def get_uint8(self, split: str, indices: np.ndarray, *, epoch: int = 0, augment: bool = False
                  ) -> dict[str, np.ndarray]:
        """``get``'s batch with "image" (n, S, S, 3) uint8 in [0, 255]. ``augment``: the training augmentation
        instead of the evaluation crop -- Inception crop and flip (``read_image``), then RandAugment where the
        dataset has it (``randaugment.apply_randaugment``), drawn for each example from (the dataset's ``seed``,
        ``epoch``, its index). Raises as ``get``."""
        indices = check_indices(self, split, indices)
        paths = [self._files[split][i] for i in indices]
        seeds = [(self.seed, epoch, int(i)) for i in indices] if augment else None
        images = read_images(paths, self.image_shape[0], augment_seeds=seeds,
                             resize_small=self.resize_small)
        if augment and self.randaugment is not None:
            for row, index in enumerate(indices):
                images[row] = apply_randaugment(images[row], self.randaugment, seed=self.seed, epoch=epoch,
                                                index=int(index))
        return {"image": images, "label": self._labels[split][indices]}
