"""One entry point from a dataset name (and ``--data-dir``) to a dataset object."""

from __future__ import annotations

import os

from moe_course.data.base import DataError, ImageDataset
from moe_course.data.caption_files import ImageCaptions
from moe_course.data.captioned import CaptionedDigits
from moe_course.data.cifar import Cifar
from moe_course.data.digits import ClutteredDigits, DigitsConfig
from moe_course.data.folders import ImageFolder

DATASETS = ("digits", "cifar10", "cifar100", "imagefolder", "digits-captions", "captions", "digit-glyphs")
GLYPHS_PER_DIGIT = 30  # digit-glyphs: 300 classes, the parameter-bound regime of README's "Where experts pay"


def load_dataset(
    name: str, path: str | os.PathLike | None = None, *, image_size: int | None = None, seed: int = 0
) -> ImageDataset:
    """The dataset ``name`` (one of ``DATASETS``).

    digits: the embedded cluttered digits (``path`` must be None; ``seed`` fixes the canvases).
    digits-captions: the same canvases with captions and tokens (``CaptionedDigits``), for image-text models.
    digit-glyphs: the same canvases, labelled with WHICH source glyph they show (``task="glyph"``:
    ``GLYPHS_PER_DIGIT`` glyphs of each digit, one class each; val/test redraw the training glyphs).
    captions: an image-caption folder (``ImageCaptions``: COCO JSON or image<TAB>caption files).
    cifar10 / cifar100: ``path`` = the python archive or its extracted folder (see ``Cifar``); val = the last
    5000 training images. imagefolder: ``path`` = a ``train/`` + ``val/`` class-folder tree (see ``ImageFolder``).
    ``image_size`` (None: the dataset's own default -- 32, 32, 32, 224) sets the returned image side; ``seed``
    only matters for digits (the others have no randomness).

    Raises:
      ValueError: an unknown ``name``.
      DataError: a missing ``path`` where one is needed, a ``path`` for digits, or a bad path/layout/file.
    """
    if name not in DATASETS:
        raise ValueError(f"dataset {name!r} is not known; use one of {', '.join(DATASETS)}")
    if name in ("digits", "digits-captions", "digit-glyphs"):
        if path is not None:
            raise DataError(f"{path}: dataset {name!r} is embedded and takes no path; drop --data-dir")
        task = dict(task="glyph", glyphs_per_class=(GLYPHS_PER_DIGIT, 1, 1)) if name == "digit-glyphs" else {}
        config = (DigitsConfig(seed=seed, **task) if image_size is None
                  else DigitsConfig.for_image_size(image_size, seed=seed, **task))
        return CaptionedDigits(ClutteredDigits(config)) if name == "digits-captions" else ClutteredDigits(config)
    if path is None:
        raise DataError(f"dataset {name!r} needs its files: pass --data-dir (the path to them)")
    if name in ("cifar10", "cifar100"):
        return Cifar(path, variant=name, image_size=image_size or 32)
    if name == "captions":
        return ImageCaptions(path, image_size=image_size or 224)
    return ImageFolder(path, image_size=image_size or 224)
