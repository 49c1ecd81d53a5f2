"""Image-text pairs from the cluttered digits: every canvas with a caption and its subword tokens (LIMoE).

The image-text batch format extends the course's batch dict (``data.base``) with
  ``caption``: (batch,) str (numpy unicode array), the text paired with each image;
  ``text``: (batch, seq_len) int32 subword ids, ``PAD_ID`` after the caption's last piece;
  ``text_mask``: (batch, seq_len) bool, True on real pieces (padding must never count anywhere).
``label`` stays: the embedded data knows each image's class (zero-shot evaluation uses it, training does not).

Captions are deterministic functions of (seed, split, epoch, index), like the canvases: a training caption
changes with the epoch (new canvas, so new size/position facts, and a newly drawn template); val/test
captions are fixed. The tokenizer is trained on the training captions of the first ``tokenizer_epochs``
epochs (``SubwordTokenizer.train``), unless one is passed in.
"""

from __future__ import annotations

import numpy as np

from moe_course.data.base import check_indices
from moe_course.data.captions import CAPTION_TEMPLATES, ZERO_SHOT_TEMPLATES, caption, class_prompts
from moe_course.data.digits import _SPLIT_IDS, ClutteredDigits
from moe_course.data.tokenizer import SubwordTokenizer

_CAPTION_STREAM = 0xCA97  # a random stream of its own, so captions never disturb the canvases' draws


class CaptionedDigits:
    """Cluttered digits (``ClutteredDigits``) with a caption per canvas, in the image-text batch format.

    digits: the image dataset (default ``ClutteredDigits()``). tokenizer: a ``SubwordTokenizer``, or None to
    train one on the training captions of epochs 0 .. tokenizer_epochs-1 with ``vocab_size`` pieces and
    ``seq_len`` tokens per caption (default 16, LIMoE App. A). Raises ValueError for seq_len < 1,
    tokenizer_epochs < 1, or a tokenizer given together with seq_len/vocab_size that disagree with it.
    """

    def __init__(self, digits: ClutteredDigits | None = None, *, tokenizer: SubwordTokenizer | None = None,
                 seq_len: int = 16, vocab_size: int = 128, tokenizer_epochs: int = 3):
        self.digits = digits or ClutteredDigits()
        self.name = f"{self.digits.name}-captions"
        self.class_names = self.digits.class_names
        self.num_classes = self.digits.num_classes
        self.image_shape = self.digits.image_shape
        if tokenizer is None:
            if not isinstance(tokenizer_epochs, int) or tokenizer_epochs < 1:
                raise ValueError(f"tokenizer_epochs={tokenizer_epochs!r} is not allowed; use an integer >= 1")
            corpus = [c for e in range(tokenizer_epochs) for c in self.split_captions("train", epoch=e)]
            tokenizer = SubwordTokenizer.train(corpus, vocab_size=vocab_size, seq_len=seq_len)
        elif tokenizer.seq_len != seq_len:
            raise ValueError(f"seq_len={seq_len} disagrees with the tokenizer's seq_len={tokenizer.seq_len}; "
                             "pass the same value or leave seq_len at the tokenizer's")
        self.tokenizer = tokenizer

    @property
    def seq_len(self) -> int:
        """Text tokens per caption (the tokenizer's sequence length)."""
        return self.tokenizer.seq_len

    def split_size(self, split: str) -> int:
        """Number of pairs in ``split`` (one per canvas of the digits split)."""
        return self.digits.split_size(split)

    def captions_for(self, split: str, indices: np.ndarray, labels: np.ndarray, boxes: np.ndarray, *,
                     epoch: int = 0) -> list[str]:
        """Captions of examples ``indices`` of ``split`` whose canvases have ``labels`` (n,) and ``boxes`` (n, 4)."""
        cfg = self.digits.config
        draw_epoch = epoch if split == "train" else 0
        out = []
        for index, label, box in zip(np.asarray(indices), labels, boxes):
            rng = np.random.default_rng([cfg.seed, _SPLIT_IDS[split], draw_epoch, int(index), _CAPTION_STREAM])
            template = int(rng.integers(0, len(CAPTION_TEMPLATES)))
            out.append(caption(self.class_names[int(label)], box, image_size=cfg.image_size,
                               digit_size=cfg.digit_size, template=template))
        return out

    def split_captions(self, split: str, *, epoch: int = 0) -> list[str]:
        """Every caption of ``split`` (of ``epoch`` for train), in index order."""
        batch = self.digits.get(split, np.arange(self.split_size(split)), epoch=epoch)
        return self.captions_for(split, np.arange(self.split_size(split)), batch["label"], batch["box"], epoch=epoch)

    def get(self, split: str, indices: np.ndarray, *, epoch: int = 0) -> dict[str, np.ndarray]:
        """Examples ``indices`` of ``split``: the digits' batch (image, label, box) plus caption, text, text_mask."""
        indices = check_indices(self.digits, split, indices)
        return self._with_captions(split, indices, self.digits.get(split, indices, epoch=epoch), epoch)

    def get_uint8(self, split: str, indices: np.ndarray, *, epoch: int = 0, augment: bool = False
                  ) -> dict[str, np.ndarray]:
        """``get``'s batch with "image" uint8 in [0, 255] (``ClutteredDigits.get_uint8``)."""
        indices = check_indices(self.digits, split, indices)
        batch = self.digits.get_uint8(split, indices, epoch=epoch, augment=augment)
        return self._with_captions(split, indices, batch, epoch)

    def _with_captions(self, split: str, indices: np.ndarray, batch: dict, epoch: int) -> dict[str, np.ndarray]:
        captions = self.captions_for(split, indices, batch["label"], batch["box"], epoch=epoch)
        text, text_mask = self.tokenizer.encode(captions)
        return {**batch, "caption": np.asarray(captions, dtype=str), "text": text, "text_mask": text_mask}

    def prompts(self) -> tuple[np.ndarray, np.ndarray]:
        """Zero-shot prompts (``captions.ZERO_SHOT_TEMPLATES``) tokenized: ids and mask (classes, templates, seq_len)."""
        prompts = class_prompts(self.class_names, ZERO_SHOT_TEMPLATES)
        ids, mask = self.tokenizer.encode([p for row in prompts for p in row])
        shape = (len(prompts), len(prompts[0]), self.seq_len)
        return ids.reshape(shape), mask.reshape(shape)
