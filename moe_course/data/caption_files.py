"""Full-scale image-caption data (COCO captions and plain tab-separated files) in the image-text batch format.

Layout (``root`` is what ``--data-dir`` points at)::

    root/train.json or root/train.tsv    required: the training captions
    root/val.json   or root/val.tsv      required
    root/test.json  or root/test.tsv     optional (without it the test split is empty)
    root/<split>/<image files>           the images the split's caption file names, by path relative to it

A ``.json`` file is in the COCO captions format (``captions_train2017.json`` renamed, with ``train2017/``
renamed or linked to ``train/``): a JSON object with an ``"images"`` list of ``{"id", "file_name"}`` and an
``"annotations"`` list of ``{"image_id", "caption"}``. A ``.tsv`` file has one ``<image file><TAB><caption>`` per line.
Each (image, caption) pair is one example, in file order; an image with five captions gives five examples.
Everything is checked in the constructor -- the files parse, every caption names an image that exists --
and each problem raises one ``DataError`` naming the path (and line) and what was expected. Pixels are read
in ``get`` (``folders.read_image``: shorter side resized, center crop; Inception crops for training).
The data has no class labels: ``label`` is -1 and ``num_classes`` 0, so zero-shot classification does not
apply; retrieval does.
The subword tokenizer is trained on the training captions (deterministic) unless one is passed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from moe_course.data.base import SPLITS, DataError, check_indices
from moe_course.data.folders import read_images
from moe_course.data.tokenizer import SubwordTokenizer

FORMATS = (".json", ".tsv")


def _caption_file(root: Path, split: str, required: bool) -> Path | None:
    found = [root / f"{split}{suffix}" for suffix in FORMATS if (root / f"{split}{suffix}").is_file()]
    if len(found) > 1:
        raise DataError(f"{found[0]} and {found[1]}: both exist; keep one caption file per split")
    if not found and required:
        raise DataError(f"{root / split}.json: does not exist (nor {split}.tsv); expected the {split} captions as "
                        f"COCO JSON or image<TAB>caption lines")
    return found[0] if found else None


def _read_coco(path: Path) -> list[tuple[str, str]]:
    expected = 'expected COCO captions JSON: {"images": [{"id", "file_name"}], "annotations": [{"image_id", "caption"}]}'
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
        files = {image["id"]: str(image["file_name"]) for image in record["images"]}
        pairs = [(annotation["image_id"], str(annotation["caption"]).strip()) for annotation in record["annotations"]]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise DataError(f"{path}: cannot be read ({type(exc).__name__}: {exc}); {expected}") from exc
    unknown = next((image_id for image_id, _ in pairs if image_id not in files), None)
    if unknown is not None:
        raise DataError(f"{path}: an annotation names image_id {unknown!r}, which is not in its \"images\" list")
    return [(files[image_id], caption) for image_id, caption in pairs]


def _read_tsv(path: Path) -> list[tuple[str, str]]:
    pairs = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: cannot be read ({type(exc).__name__}: {exc}); expected UTF-8 text") from exc
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        file, tab, caption = line.partition("\t")
        if not tab or not file.strip() or not caption.strip():
            raise DataError(f"{path}:{number}: {line[:60]!r} is not '<image file><TAB><caption>'")
        pairs.append((file.strip(), caption.strip()))
    return pairs


def _check_images(pairs: list[tuple[str, str]], folder: Path, caption_file: Path) -> list[str]:
    """Full image paths of ``pairs``; DataError when the caption file names an image the folder lacks."""
    if not folder.is_dir():
        raise DataError(f"{folder}: {'is not a folder' if folder.exists() else 'does not exist'}; expected the "
                        f"images that {caption_file} names")
    paths = [folder / file for file, _ in pairs]
    missing = next((p for p in paths if not p.is_file()), None)
    if missing is not None:
        raise DataError(f"{missing}: does not exist, but {caption_file} names it; the caption file does not match "
                        f"the images in {folder}")
    return [os.fspath(p) for p in paths]


class ImageCaptions:
    """Image-caption pairs from the layout of the module docstring.

    Batches: ``image`` (n, S, S, 3) float32 in [0, 1], ``label`` (n,) int32 = -1, ``caption`` (n,) str,
    ``text`` (n, seq_len) int32, ``text_mask`` (n, seq_len) bool (see ``data.captioned``).
    tokenizer: a ``SubwordTokenizer``, or None to train one with ``vocab_size`` pieces on the training captions.
    seed: draws the training crops of the input pipeline (``get_uint8(..., augment=True)``).
    Raises DataError (constructor) for a missing or malformed caption file, a missing image folder, or a
    caption that names a missing image; in ``get`` for an unreadable image. ValueError for bad sizes.
    """

    num_classes = 0
    class_names: tuple[str, ...] = ()

    def __init__(self, root: str | os.PathLike, *, image_size: int = 224, tokenizer: SubwordTokenizer | None = None,
                 seq_len: int = 16, vocab_size: int = 8000, name: str = "captions", seed: int = 0):
        if image_size < 1:
            raise ValueError(f"image_size={image_size} is not allowed; use a side of at least 1 pixel")
        root = Path(root)
        if not root.is_dir():
            raise DataError(f"{root}: {'is not a folder' if root.exists() else 'does not exist'}; expected a folder "
                            "with train.json/.tsv, val.json/.tsv and the train/, val/ image folders")
        self.root, self.name, self.seed = root, name, seed
        self.image_shape = (image_size, image_size, 3)
        self._files: dict[str, list[str]] = {}
        self._captions: dict[str, list[str]] = {}
        for split in SPLITS:
            path = _caption_file(root, split, required=split != "test")
            pairs = [] if path is None else (_read_coco(path) if path.suffix == ".json" else _read_tsv(path))
            if path is not None and not pairs:
                raise DataError(f"{path}: holds no captions; expected at least one image-caption pair")
            self._files[split] = _check_images(pairs, root / split, path) if pairs else []
            self._captions[split] = [caption for _, caption in pairs]
        if tokenizer is None:
            tokenizer = SubwordTokenizer.train(self._captions["train"], vocab_size=vocab_size, seq_len=seq_len)
        elif tokenizer.seq_len != seq_len:
            raise ValueError(f"seq_len={seq_len} disagrees with the tokenizer's seq_len={tokenizer.seq_len}")
        self.tokenizer = tokenizer

    @property
    def seq_len(self) -> int:
        """Text tokens per caption (the tokenizer's sequence length)."""
        return self.tokenizer.seq_len

    def split_size(self, split: str) -> int:
        """Number of image-caption pairs in ``split``; ValueError for an unknown split."""
        if split not in SPLITS:
            raise ValueError(f"split={split!r} is not allowed; use one of {', '.join(SPLITS)}")
        return len(self._files[split])

    def get(self, split: str, indices: np.ndarray, *, epoch: int = 0) -> dict[str, np.ndarray]:
        """Examples ``indices`` of ``split`` in the image-text batch format; ``epoch`` is unused."""
        batch = self.get_uint8(split, indices)
        return {**batch, "image": batch["image"].astype(np.float32) / 255.0}

    def get_uint8(self, split: str, indices: np.ndarray, *, epoch: int = 0, augment: bool = False
                  ) -> dict[str, np.ndarray]:
        """``get``'s batch with "image" (n, S, S, 3) uint8 in [0, 255]. ``augment``: the Inception crop of
        ``folders.read_image`` drawn from (``seed``, ``epoch``, index), without the flip (a caption may say
        "left" or "right")."""
        indices = check_indices(self, split, indices)
        seeds = [(self.seed, epoch, int(i)) for i in indices] if augment else None
        images = read_images([self._files[split][i] for i in indices], self.image_shape[0], augment_seeds=seeds,
                             flip=False)
        captions = [self._captions[split][i] for i in indices]
        text, text_mask = self.tokenizer.encode(captions)
        return {"image": images, "label": np.full(len(indices), -1, np.int32),
                "caption": np.asarray(captions, dtype=str), "text": text, "text_mask": text_mask}
