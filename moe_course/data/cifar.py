"""CIFAR-10 and CIFAR-100 read from the standard "python version" archives, in the course's batch format.

``path`` is any of: the downloaded archive (``cifar-10-python.tar.gz`` / ``cifar-100-python.tar.gz``, read
in place with ``tarfile``, nothing is extracted to disk); its extracted folder (``cifar-10-batches-py/`` /
``cifar-100-python/``); or a folder holding either of those. Every file is checked and decoded in the
constructor, so a wrong layout or a corrupt file fails before any training; the whole dataset is then held
in memory as uint8 (CIFAR-10: 180 MB).

The archives store pickled dicts: ``b"data"`` (N, 3072) uint8, each row one image as 3 colour planes of
32x32 (channel, row, column), and ``b"labels"`` (CIFAR-10) or ``b"fine_labels"`` (CIFAR-100). The pickles are
read by an unpickler that only accepts the few numpy globals these files use, so a crafted file cannot run
code. The ``val`` split is the LAST ``val_size`` training examples (deterministic, disjoint from ``train``);
``test`` is the official test set.
"""

from __future__ import annotations

import io
import os
import pickle
import re
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
from PIL import Image

from moe_course.data.base import SPLITS, DataError, check_indices

CIFAR_SIZE = 32
_PIXELS = 3 * CIFAR_SIZE * CIFAR_SIZE


@dataclass(frozen=True)
class _Layout:
    """Where one CIFAR variant keeps what, inside its archive / extracted folder."""

    folder: str  # the folder the archive extracts to
    archive: str  # the downloaded file's name
    train_pattern: str  # regex (full match) of the training pickles; the first group orders them
    test: str
    meta: str
    label_key: bytes
    names_key: bytes
    num_classes: int
    expected: str  # for error messages


_LAYOUTS = {
    "cifar10": _Layout(
        folder="cifar-10-batches-py",
        archive="cifar-10-python.tar.gz",
        train_pattern=r"data_batch_(\d+)",
        test="test_batch",
        meta="batches.meta",
        label_key=b"labels",
        names_key=b"label_names",
        num_classes=10,
        expected="cifar-10-batches-py/ with data_batch_1..5, test_batch and batches.meta",
    ),
    "cifar100": _Layout(
        folder="cifar-100-python",
        archive="cifar-100-python.tar.gz",
        train_pattern=r"(train)",
        test="test",
        meta="meta",
        label_key=b"fine_labels",
        names_key=b"fine_label_names",
        num_classes=100,
        expected="cifar-100-python/ with train, test and meta",
    ),
}

# The only globals a CIFAR pickle needs: numpy arrays / scalars (numpy 1.x and 2.x module names) and the
# bytes re-encoding Python 3 uses at protocol 2.
_SAFE_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("_codecs", "encode"),
}

# What a corrupt pickle / archive can raise while being read.
_PICKLE_ERRORS = (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError)
_ARCHIVE_ERRORS = (tarfile.TarError, EOFError, OSError, zlib.error)


class _SafeUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) not in _SAFE_GLOBALS:
            raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a CIFAR pickle")
        return super().find_class(module, name)


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


def _unpickle(where: str, blob: bytes) -> dict:
    """The dict pickled in ``blob``; DataError naming ``where`` when it is not one."""
    try:
        obj = _SafeUnpickler(io.BytesIO(blob), encoding="bytes").load()
    except _PICKLE_ERRORS as exc:
        message = f"{where}: not a readable CIFAR pickle ({_one_line(exc)}); expected a pickled batch dict"
        raise DataError(message) from exc
    if not isinstance(obj, dict):
        raise DataError(f"{where}: holds a {type(obj).__name__}; expected a pickled dict")
    return obj


def _read_members(path: Path, layout: _Layout, wanted: Callable[[str], bool]) -> dict[str, dict]:
    """Unpickled members of ``layout.folder`` whose base names pass ``wanted``: {base name: dict}.

    ``path`` is the archive (read in one sequential pass) or the extracted folder.
    """
    found = {}
    if path.is_dir():
        for name in sorted(os.listdir(path)):
            if wanted(name) and (path / name).is_file():
                try:
                    blob = (path / name).read_bytes()
                except OSError as exc:
                    message = f"{path / name}: cannot be read ({_one_line(exc)}); expected a CIFAR pickle"
                    raise DataError(message) from exc
                found[name] = _unpickle(str(path / name), blob)
        return found
    member = None
    try:
        with tarfile.open(path, "r:*") as tar:
            for member in tar:
                parts = Path(member.name).parts
                parts = parts[1:] if parts[:1] == (".",) else parts
                if member.isfile() and len(parts) == 2 and parts[0] == layout.folder and wanted(parts[1]):
                    blob = tar.extractfile(member).read()
                    found[parts[1]] = _unpickle(f"{path} (member {member.name})", blob)
    except _ARCHIVE_ERRORS as exc:
        where = f"{path} (member {member.name})" if member is not None else str(path)
        raise DataError(
            f"{where}: not a readable CIFAR archive ({_one_line(exc)}); expected the python version "
            f"{layout.archive} containing {layout.expected}"
        ) from exc
    return found


def _resolve(path: Path, layout: _Layout) -> Path:
    """The archive or extracted folder ``path`` points at (itself, or inside a folder holding it)."""
    if not path.exists():
        raise DataError(f"{path}: does not exist; expected the CIFAR archive {layout.archive} or {layout.expected}")
    if path.is_dir():
        for candidate in (path / layout.folder, path / layout.archive):
            if candidate.exists():
                return candidate
    return path


def _decode(where: str, batch: dict, layout: _Layout) -> tuple[np.ndarray, np.ndarray]:
    """One pickled batch as (images (N, 32, 32, 3) uint8, labels (N,) int32)."""
    for key in (b"data", layout.label_key):
        if key not in batch:
            raise DataError(f"{where}: the pickled dict has no {key!r}; expected keys b'data' and {layout.label_key!r}")
    data = np.asarray(batch[b"data"])
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != _PIXELS:
        raise DataError(f"{where}: b'data' is {data.dtype} {data.shape}; expected uint8 (N, {_PIXELS})")
    try:
        labels = np.asarray(batch[layout.label_key], dtype=np.int64)
    except (TypeError, ValueError) as exc:
        raise DataError(f"{where}: {layout.label_key!r} is not a list of integers ({_one_line(exc)})") from exc
    if labels.shape != (len(data),):
        raise DataError(
            f"{where}: {layout.label_key!r} has shape {labels.shape}; expected ({len(data)},), one per image"
        )
    if labels.size and (labels.min() < 0 or labels.max() >= layout.num_classes):
        raise DataError(
            f"{where}: labels span [{labels.min()}, {labels.max()}]; expected [0, {layout.num_classes}) "
            f"(is this the other CIFAR variant?)"
        )
    images = data.reshape(-1, 3, CIFAR_SIZE, CIFAR_SIZE).transpose(0, 2, 3, 1)  # CHW rows -> NHWC
    return np.ascontiguousarray(images), labels.astype(np.int32)


def _class_names(where: str, meta: dict, layout: _Layout) -> tuple[str, ...]:
    names = meta.get(layout.names_key)
    if not isinstance(names, (list, tuple)) or len(names) != layout.num_classes:
        raise DataError(f"{where}: has no {layout.names_key!r}; expected a list of {layout.num_classes} class names")
    return tuple(n.decode("utf-8") if isinstance(n, bytes) else str(n) for n in names)


class Cifar:
    """CIFAR-10 / CIFAR-100 (see module docstring).

    Batches: ``image`` (n, S, S, 3) float32 in [0, 1] with S = ``image_size`` (32 is the stored size; any
    other size is resized bilinearly on the fly), ``label`` (n,) int32 in [0, num_classes).

    Args:
      path: the archive, the extracted folder, or a folder holding either.
      variant: "cifar10" or "cifar100".
      image_size: side of the returned images in pixels.
      val_size: the last ``val_size`` training examples become the ``val`` split (0: no val split).

    Raises:
      DataError: a missing path, a missing file or archive member, or a corrupt archive / pickle; the one-line
        message names the path and what was expected.
      ValueError: a bad ``variant``, ``image_size`` or ``val_size``.
    """

    def __init__(
        self, path: str | os.PathLike, *, variant: str = "cifar10", image_size: int = 32, val_size: int = 5000
    ):
        if variant not in _LAYOUTS:
            raise ValueError(f"variant={variant!r} is not allowed; use one of {', '.join(_LAYOUTS)}")
        if image_size < 1:
            raise ValueError(f"image_size={image_size} is not allowed; use a side of at least 1 pixel")
        if val_size < 0:
            raise ValueError(f"val_size={val_size} is not allowed; use >= 0 (0: no val split)")
        layout = _LAYOUTS[variant]
        self.name = variant
        self.num_classes = layout.num_classes
        self.image_shape = (image_size, image_size, 3)
        self.path = _resolve(Path(path), layout)

        is_train = re.compile(layout.train_pattern).fullmatch
        members = _read_members(self.path, layout, lambda n: bool(is_train(n)) or n in (layout.test, layout.meta))
        train_names = sorted((n for n in members if is_train(n)), key=lambda n: _sort_key(is_train(n).group(1)))
        missing = [n for n in (layout.test, layout.meta) if n not in members]
        if not train_names:
            missing.insert(0, "data_batch_1" if variant == "cifar10" else "train")
        elif variant == "cifar10":  # batches 1..k, no gaps: a gap means an incomplete copy
            numbers = [int(is_train(n).group(1)) for n in train_names]
            missing[:0] = [f"data_batch_{i}" for i in range(1, max(numbers) + 1) if i not in numbers]
        if missing:
            raise DataError(f"{self.path}: missing {', '.join(missing)}; expected {layout.expected}")

        def where(name: str) -> str:
            return str(self.path / name) if self.path.is_dir() else f"{self.path} (member {layout.folder}/{name})"

        self.class_names = _class_names(where(layout.meta), members[layout.meta], layout)
        train = [_decode(where(n), members[n], layout) for n in train_names]
        train_images = np.concatenate([t[0] for t in train])
        train_labels = np.concatenate([t[1] for t in train])
        if val_size >= len(train_images):
            raise ValueError(
                f"val_size={val_size} leaves no training examples of the {len(train_images)} in {self.path}; "
                f"use at most {len(train_images) - 1}"
            )
        cut = len(train_images) - val_size
        test_images, test_labels = _decode(where(layout.test), members[layout.test], layout)
        self._images = {"train": train_images[:cut], "val": train_images[cut:], "test": test_images}
        self._labels = {"train": train_labels[:cut], "val": train_labels[cut:], "test": test_labels}

    def split_size(self, split: str) -> int:
        """Examples in ``split`` ("train", "val", "test"; val is empty when ``val_size=0``); ValueError otherwise."""
        if split not in SPLITS:
            raise ValueError(f"split={split!r} is not allowed; use one of {', '.join(SPLITS)}")
        return len(self._labels[split])

    def get(self, split: str, indices: np.ndarray, *, epoch: int = 0) -> dict[str, np.ndarray]:
        """Examples ``indices`` of ``split``: image (n, S, S, 3) float32 in [0, 1], label (n,) int32.

        ``epoch`` is unused (no augmentation). ValueError for an unknown/empty split or out-of-range index.
        """
        batch = self.get_uint8(split, indices)
        return {**batch, "image": batch["image"].astype(np.float32) / 255.0}

    def get_uint8(self, split: str, indices: np.ndarray, *, epoch: int = 0, augment: bool = False
                  ) -> dict[str, np.ndarray]:
        """``get``'s batch with "image" (n, S, S, 3) uint8 in [0, 255]; ``epoch`` and ``augment`` change nothing
        (the CIFAR recipes here train without augmentation)."""
        indices = check_indices(self, split, indices)
        images = self._images[split][indices]
        size = self.image_shape[0]
        if size != CIFAR_SIZE:
            resized = np.empty((len(indices), size, size, 3), np.uint8)
            for row, image in enumerate(images):
                resized[row] = np.asarray(Image.fromarray(image).resize((size, size), Image.BILINEAR))
            images = resized
        return {"image": images, "label": self._labels[split][indices]}


def _sort_key(group: str) -> tuple[int, str]:
    return (int(group), group) if group.isdigit() else (0, group)
