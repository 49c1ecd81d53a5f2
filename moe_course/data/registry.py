"""One entry point from a dataset name (and ``--data-dir``) to a dataset object."""

from __future__ import annotations

import os
from pathlib import Path

from moe_course.data.base import DataError, ImageDataset
from moe_course.data.caption_files import ImageCaptions
from moe_course.data.captioned import CaptionedDigits
from moe_course.data.cifar import Cifar
from moe_course.data.digits import ClutteredDigits, DigitsConfig
from moe_course.data.folders import ImageFolder
from moe_course.data.randaugment import format_randaugment

DATASETS = ("digits", "cifar10", "cifar100", "imagefolder", "digits-captions", "captions", "digit-glyphs")
GLYPHS_PER_DIGIT = 80  # digit-glyphs: 800 classes, the parameter-bound regime of docs/results.md, "Where experts pay"
# What each dataset with files reads: the kind a chapter's full-scale cell names when the data does not fit.
KINDS = {
    "cifar10": "CIFAR-10 python data (cifar-10-python.tar.gz or its extracted cifar-10-batches-py/)",
    "cifar100": "CIFAR-100 python data (cifar-100-python.tar.gz or its extracted cifar-100-python/)",
    "imagefolder": "an image folder (train/<class>/*.jpeg and val/<class>/...)",
    "captions": "image-caption data (train.json in COCO captions format or train.tsv, images under train/)",
}


def data_kind(path: str | os.PathLike) -> str:
    """What the files at ``path`` look like, in the words of ``KINDS``: one of its keys, "cifar" (either CIFAR),
    or "unknown" (including a missing path). Only names and the folder layout are looked at."""
    path = Path(path)
    names = {p.name for p in path.iterdir()} if path.is_dir() else {path.name}
    if (any(name.startswith("cifar-") for name in names) or names & {"data_batch_1", "batches.meta"}
            or ((path / "meta").is_file() and (path / "train").is_file())):
        return "cifar"
    if names & {"train.json", "train.tsv"}:
        return "captions"
    if (path / "train").is_dir() and any(child.is_dir() for child in (path / "train").iterdir()):
        return "imagefolder"
    return "unknown"


def check_randaugment_dataset(name: str, randaugment) -> None:
    """ValueError naming randaugment unless it is None or the dataset is an image folder (the only kind with
    3-channel photos to augment), wherever RandAugment is to run (input workers or accelerator)."""
    if randaugment is not None and name != "imagefolder":
        raise ValueError(f"randaugment={format_randaugment(randaugment)} applies to image folders (dataset "
                         f"'imagefolder'); dataset {name!r} has no RandAugment: leave it out")


def load_dataset(
    name: str, path: str | os.PathLike | None = None, *, image_size: int | None = None, seed: int = 0,
    randaugment: tuple[int, float] | None = None, eval_crop_fraction: float | None = None,
    minival_fraction: float = 0.0,
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
    fixes the digits' canvases and the training crops of image folders and caption folders (CIFAR has no
    randomness). ``randaugment`` (image folders only): RandAugment (N, M) after the training crop and flip
    (``ImageFolder``, ``data.randaugment``); None: none. ``eval_crop_fraction`` and ``minival_fraction`` (image
    folders only): a recipe's evaluation crop and held-out minival (``ImageFolder``; ``recipes.data_recipe_for``).

    Raises:
      ValueError: an unknown ``name``; ``randaugment`` for another dataset than imagefolder, or a bad one (also
        ``randaugment.RandAugmentUnavailable``, a ValueError, without PyTorch or kornia), or an evaluation crop or
        minival for another dataset -- before any file is read.
      DataError: a missing ``path`` where one is needed, a ``path`` for digits, or a bad path/layout/file;
        for files of another kind (an image folder given to cifar10, ...) one line naming both kinds.
    """
    if name not in DATASETS:
        raise ValueError(f"dataset {name!r} is not known; use one of {', '.join(DATASETS)}")
    check_randaugment_dataset(name, randaugment)
    if name != "imagefolder" and (eval_crop_fraction is not None or minival_fraction):
        raise ValueError(f"eval_crop_fraction={eval_crop_fraction!r}, minival_fraction={minival_fraction!r} apply to "
                         f"image folders (dataset 'imagefolder'); dataset {name!r} has its own splits: leave them out")
    if name in ("digits", "digits-captions", "digit-glyphs"):
        if path is not None:
            raise DataError(f"{path}: dataset {name!r} is embedded and takes no path; drop --data-dir")
        task = dict(task="glyph", glyphs_per_class=(GLYPHS_PER_DIGIT, 1, 1)) if name == "digit-glyphs" else {}
        config = (DigitsConfig(seed=seed, **task) if image_size is None
                  else DigitsConfig.for_image_size(image_size, seed=seed, **task))
        return CaptionedDigits(ClutteredDigits(config)) if name == "digits-captions" else ClutteredDigits(config)
    if path is None:
        raise DataError(f"dataset {name!r} needs its files: pass --data-dir (the path to them)")
    try:
        if name in ("cifar10", "cifar100"):
            return Cifar(path, variant=name, image_size=image_size or 32)
        if name == "captions":
            return ImageCaptions(path, image_size=image_size or 224, seed=seed)
        return ImageFolder(path, image_size=image_size or 224, seed=seed, randaugment=randaugment,
                           eval_crop_fraction=eval_crop_fraction, minival_fraction=minival_fraction)
    except DataError as error:
        found = data_kind(path)
        if found in ("unknown", name) or (found == "cifar" and name.startswith("cifar")):
            raise
        looks = "CIFAR python data" if found == "cifar" else KINDS[found].split(" (")[0]
        raise DataError(f"{path} looks like {looks}, but dataset {name!r} reads {KINDS[name]}") from error
