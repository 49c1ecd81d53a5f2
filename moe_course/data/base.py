"""The one batch format every dataset in the course yields, and the epoch iterator over it.

A batch is a dict of numpy arrays:
  ``image``: (batch, height, width, channels) float32 in [0, 1] -- or uint8 in [0, 255] from ``get_uint8``,
  the form the training input pipeline (``data.pipeline``) hands to the device, which scales it there;
  ``label``: (batch,) int32 class index in [0, num_classes).

Every dataset is random-access: ``dataset.get(split, indices, epoch=e)`` builds the examples with those
indices. Training order and any per-epoch randomness (fresh canvases, for the digits) are functions of
``(seed, epoch, index)`` only, so a run resumed at step ``s`` sees exactly the batches an uninterrupted run
would have seen from step ``s`` on.
"""

from __future__ import annotations

from typing import Iterator, Protocol, Sequence

import numpy as np

SPLITS = ("train", "val", "test")


class DataError(ValueError):
    """A dataset path, layout or file is missing or wrong. The message names the path and what was expected."""


class ImageDataset(Protocol):
    """What the training loop and the chapters need from a dataset."""

    name: str
    num_classes: int
    class_names: Sequence[str]
    image_shape: tuple[int, int, int]  # (height, width, channels)

    def split_size(self, split: str) -> int:
        """Number of examples in ``split`` ("train", "val" or "test"); ValueError for another split."""
        ...

    def get(self, split: str, indices: np.ndarray, *, epoch: int = 0) -> dict[str, np.ndarray]:
        """The examples ``indices`` of ``split`` as a batch dict: "image" (n, height, width, channels) float32
        in [0, 1], "label" (n,) int32, plus any extra fields of the dataset. ``epoch`` may change the training
        examples (fresh augmentation or canvases)."""
        ...

    # Optional, defined by the course's own datasets (``training_batch`` falls back to ``get`` without it):
    # get_uint8(split, indices, *, epoch=0, augment=False) -> the same batch with "image" uint8 in [0, 255]
    # (a quarter of the bytes); ``augment`` asks for the training augmentation of ``epoch`` where the dataset
    # has one (image folders: Inception crop and flip).


def check_split(dataset: ImageDataset, split: str) -> None:
    """Raises ValueError when ``split`` is not one the dataset has."""
    if split not in SPLITS:
        raise ValueError(f"split={split!r} is not allowed; use one of {', '.join(SPLITS)}")
    if dataset.split_size(split) == 0:
        raise ValueError(f"split={split!r} of dataset {dataset.name!r} is empty")


def check_indices(dataset, split: str, indices: np.ndarray) -> np.ndarray:
    """``indices`` as (n,) int64; ValueError when the split is unknown/empty or an index is out of range."""
    check_split(dataset, split)
    indices = np.asarray(indices, dtype=np.int64).reshape(-1)
    size = dataset.split_size(split)
    if indices.size and (indices.min() < 0 or indices.max() >= size):
        raise ValueError(f"indices must lie in [0, {size}) for split={split!r} of {dataset.name!r}")
    return indices


def epoch_order(num_examples: int, *, seed: int, epoch: int) -> np.ndarray:
    """The shuffled example order of one training epoch: (num_examples,) int64, a function of (seed, epoch)."""
    return np.random.default_rng([seed, epoch, 0x5EED]).permutation(num_examples)


def steps_per_epoch(dataset: ImageDataset, batch_size: int) -> int:
    """Full training batches in one epoch (the last partial batch is dropped during training)."""
    steps = dataset.split_size("train") // batch_size
    if steps == 0:
        raise ValueError(
            f"batch_size={batch_size} is larger than the {dataset.split_size('train')} training examples "
            f"of {dataset.name!r}; use at most {dataset.split_size('train')}"
        )
    return steps


def batch_indices(num_examples: int, batch_size: int, *, seed: int, step: int,
                  order: np.ndarray | None = None) -> tuple[int, np.ndarray]:
    """(epoch, (batch_size,) int64 example indices) of training batch ``step`` (0-based): the ``step``-th slice of
    the epoch orders of ``epoch_order``, the last partial batch of each epoch dropped. ``order``: that epoch's
    order when the caller already has it."""
    epoch, within = divmod(step, num_examples // batch_size)
    order = epoch_order(num_examples, seed=seed, epoch=epoch) if order is None else order
    return epoch, order[within * batch_size : (within + 1) * batch_size]


def training_batch(dataset: ImageDataset, indices: np.ndarray, *, epoch: int) -> dict[str, np.ndarray]:
    """Training examples ``indices`` of ``epoch`` as the input pipeline feeds them: ``get_uint8`` with the
    training augmentation where the dataset's class defines it (image uint8), else ``get`` (image as ``get``
    gives it, e.g. float32). Looked up on the class, so a wrapper that overrides only ``get`` keeps its ``get``."""
    if callable(getattr(type(dataset), "get_uint8", None)):
        return dataset.get_uint8("train", indices, epoch=epoch, augment=True)
    return dataset.get("train", indices, epoch=epoch)


def to_uint8(images: np.ndarray) -> np.ndarray:
    """float images in [0, 1] -> uint8 in [0, 255], rounded to the nearest level (same shape)."""
    return (np.clip(images, 0.0, 1.0) * np.float32(255) + np.float32(0.5)).astype(np.uint8)


def train_batches(
    dataset: ImageDataset, batch_size: int, *, seed: int, start_step: int = 0
) -> Iterator[dict[str, np.ndarray]]:
    """Endless training batches (``get``: float32 images, no augmentation) from global step ``start_step`` on, in
    this thread; batch ``s`` depends only on (seed, s). The training loop reads ``data.pipeline`` instead."""
    check_split(dataset, "train")
    per_epoch = steps_per_epoch(dataset, batch_size)
    n = dataset.split_size("train")
    step = start_step
    while True:
        order = epoch_order(n, seed=seed, epoch=step // per_epoch)
        for _ in range(step % per_epoch, per_epoch):
            epoch, indices = batch_indices(n, batch_size, seed=seed, step=step, order=order)
            yield dataset.get("train", indices, epoch=epoch)
            step += 1


def eval_batches(dataset: ImageDataset, split: str, batch_size: int, *, order_seed: int | None = None,
                 rows: tuple[int, int] | None = None) -> Iterator[dict[str, np.ndarray]]:
    """Every example of ``split`` once, in batches of ``batch_size`` (the last may be smaller): in index order,
    or with ``order_seed`` in a fixed shuffled order (a function of the seed only). ``rows`` (start, stop): only
    those rows of each batch (one process's share on a pod), so the last batch's share may hold fewer rows, or
    none (then a 0-row batch with the fields' shapes and dtypes)."""
    check_split(dataset, split)
    n = dataset.split_size(split)
    order = np.arange(n) if order_seed is None else np.random.default_rng([order_seed, 0xE7A1]).permutation(n)
    for start in range(0, n, batch_size):
        chunk = order[start:start + batch_size]
        if rows is None:
            yield dataset.get(split, chunk)
        elif rows[0] < len(chunk):
            yield dataset.get(split, chunk[rows[0]:rows[1]])
        else:  # this share of the last batch is all padding
            yield {k: v[:0] for k, v in dataset.get(split, chunk[:1]).items()}


def class_balance(labels: np.ndarray, num_classes: int) -> np.ndarray:
    """Examples per class: (num_classes,) int64."""
    return np.bincount(np.asarray(labels), minlength=num_classes)
