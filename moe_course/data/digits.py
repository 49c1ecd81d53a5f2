"""Cluttered digits: the course's embedded real dataset, built offline from scikit-learn's handwritten digits.

Each example takes one real 8x8 handwritten digit (UCI optical digits, shipped inside scikit-learn), upscales
it to a random size, drops it at a random position on a larger canvas and scatters background clutter
(random pen strokes and pixel noise) over the canvas. Most pixels are background or clutter (the digit's box
covers about a third of a 32x32 canvas; 58% of its 8x8 patches and 43% of its 4x4 patches touch the box), so
patches differ in importance -- what V-MoE's Batch Prioritized Routing and A-MoD exploit.

Splits are built from disjoint source glyphs (a writer's glyph seen in training never appears in val/test),
with the same number of glyphs per class. Training canvases are drawn afresh every epoch; val/test canvases
are fixed by the seed. Everything is a function of the seed.

A second task on the same canvases, ``task="glyph"``, asks WHICH source glyph is on the canvas: one class per
glyph (``glyphs_per_class[0]`` glyphs of each digit, e.g. 1,000 classes), every split drawing the same glyphs
under fresh placements, sizes and clutter. Telling apart two writers' sevens is stored knowledge, not a
general rule, so the task rewards parameters -- the regime where a mixture of experts pays (chapters 3 and 5).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from PIL import Image

from moe_course.data.base import SPLITS, check_indices, check_split, to_uint8

CLASS_NAMES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
_SPLIT_IDS = {"train": 0, "val": 1, "test": 2}
TASKS = ("digit", "glyph")


@dataclass(frozen=True)
class DigitsConfig:
    """How cluttered-digit canvases are drawn.

    image_size: canvas side in pixels. digit_size: (min, max) side of the pasted digit in pixels.
    strokes: (min, max) clutter strokes per canvas. stroke_length: (min, max) stroke length in pixels.
    stroke_intensity: (min, max) stroke brightness in [0, 1].
    noise: std of the additive pixel noise. glyphs_per_class: (train, val, test) source glyphs per class.
    eval_copies: canvases drawn per val/test glyph. seed: every random draw derives from it.
    task: "digit" (10 classes, disjoint glyphs per split) or "glyph" (one class per source glyph: the
    ``glyphs_per_class[0]`` glyphs of each digit, shared by all splits; val/test canvases are fresh draws).
    """

    image_size: int = 32
    digit_size: tuple[int, int] = (14, 22)
    strokes: tuple[int, int] = (2, 5)
    stroke_length: tuple[int, int] = (5, 14)
    stroke_intensity: tuple[float, float] = (0.2, 0.6)
    noise: float = 0.05
    glyphs_per_class: tuple[int, int, int] = (104, 35, 35)
    eval_copies: int = 3
    seed: int = 0
    task: str = "digit"

    @classmethod
    def for_image_size(cls, image_size: int, **overrides) -> "DigitsConfig":
        """The default drawing recipe scaled to another canvas side (digit and stroke sizes scale with it)."""
        base = cls()
        scale = image_size / base.image_size
        resize = lambda pair, floor: tuple(max(floor, round(v * scale)) for v in pair)
        return cls(image_size=image_size, digit_size=resize(base.digit_size, 8),
                   stroke_length=resize(base.stroke_length, 1), **overrides)

    def validate(self) -> None:
        """Raises ValueError naming the field, its value and what is allowed; returns None when valid."""
        if self.image_size < 12:
            raise ValueError(f"image_size={self.image_size} is too small; use at least 12 pixels")
        lo, hi = self.digit_size
        if not 8 <= lo <= hi <= self.image_size:
            raise ValueError(
                f"digit_size={self.digit_size} is not allowed; use 8 <= min <= max <= image_size={self.image_size}"
            )
        if not 0 <= self.strokes[0] <= self.strokes[1]:
            raise ValueError(f"strokes={self.strokes} is not allowed; use 0 <= min <= max")
        if not 1 <= self.stroke_length[0] <= self.stroke_length[1]:
            raise ValueError(f"stroke_length={self.stroke_length} is not allowed; use 1 <= min <= max")
        if not 0 <= self.stroke_intensity[0] <= self.stroke_intensity[1] <= 1:
            raise ValueError(f"stroke_intensity={self.stroke_intensity} is not allowed; use 0 <= min <= max <= 1")
        if self.noise < 0:
            raise ValueError(f"noise={self.noise} is not allowed; use a std >= 0")
        if min(self.glyphs_per_class) < 1 or sum(self.glyphs_per_class) > 174:
            raise ValueError(
                f"glyphs_per_class={self.glyphs_per_class} is not allowed; each >= 1 and at most 174 in total "
                "(the rarest digit class has 174 glyphs)"
            )
        if self.eval_copies < 1:
            raise ValueError(f"eval_copies={self.eval_copies} is not allowed; use >= 1")
        if self.task not in TASKS:
            raise ValueError(f"task={self.task!r} is not allowed; use one of {', '.join(map(repr, TASKS))}")


def _load_glyphs() -> tuple[np.ndarray, np.ndarray]:
    """The 1797 real 8x8 digits bundled with scikit-learn, as float32 in [0, 1], and their int labels."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    return (digits.images / 16.0).astype(np.float32), digits.target.astype(np.int32)


def _split_glyphs(labels: np.ndarray, glyphs_per_class: tuple[int, int, int], seed: int) -> dict[str, np.ndarray]:
    """Disjoint, class-balanced glyph indices per split, each sorted by class then draw order."""
    rng = np.random.default_rng([seed, 0xD161])
    parts: dict[str, list[np.ndarray]] = {s: [] for s in SPLITS}
    for c in range(10):
        members = rng.permutation(np.flatnonzero(labels == c))
        start = 0
        for split, count in zip(SPLITS, glyphs_per_class):
            parts[split].append(members[start : start + count])
            start += count
    return {s: np.concatenate(p) for s, p in parts.items()}


_BEND = 0.15  # a stroke's curve: uniform in [-0.15, 0.15], a slight one, like a pen's


def _stroke_params(rng: np.random.Generator, size: int, length_range: tuple[int, int],
                   intensity: tuple[float, float]) -> tuple[int, float, float, float, float, float]:
    """One pen stroke's random draws: (length, y0, x0, angle, bend, brightness); y0, x0 uniform in [0, size),
    angle in [0, pi), bend in [-0.15, 0.15), brightness in ``intensity``.

    The five uniforms come from one ``rng.random(5)``, each mapped as ``Generator.uniform`` maps its draw (low +
    (high - low) * u), so the values are those of five ``uniform`` calls at a fifth of their Python overhead.
    """
    length = int(rng.integers(length_range[0], length_range[1] + 1))
    u = rng.random(5).tolist()
    low, high = intensity
    return (length, size * u[0], size * u[1], np.pi * u[2], -_BEND + (_BEND - -_BEND) * u[3],
            low + (high - low) * u[4])


def _draw_strokes(images: np.ndarray, rows: list[int], strokes: list[tuple]) -> None:
    """Draw every stroke (row's canvas, params from ``_stroke_params``) into ``images`` (n, S, S) at once.

    Each stroke is 3*length points along a slightly bent line, rounded to pixels; a pixel keeps the brightest
    stroke over it. Vectorised over all strokes of the batch (a per-stroke loop made rendering the training
    bottleneck on two cores).
    """
    if not strokes:
        return
    size = images.shape[1]
    params = np.asarray(strokes, np.float64)
    counts = 3 * params[:, 0].astype(np.int64)
    stroke = np.repeat(np.arange(len(strokes)), counts)
    index = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    t = index * np.repeat(1.0 / (counts - 1), counts)  # np.linspace(0, 1, 3*length) per stroke
    t[np.cumsum(counts) - 1] = 1.0
    length, y0, x0, angle, bend, value = (params[stroke, j] for j in range(6))
    turn = angle + bend * t * length / 4
    ys = np.clip(np.round(y0 + length * t * np.sin(turn)), 0, size - 1).astype(int)
    xs = np.clip(np.round(x0 + length * t * np.cos(turn)), 0, size - 1).astype(int)
    np.maximum.at(images, (np.asarray(rows)[stroke], ys, xs), value.astype(images.dtype))


class ClutteredDigits:
    """The embedded dataset (see module docstring). Batches: image (n, S, S, 1) float32 in [0, 1], label (n,) int32.

    Extra per-example metadata in every batch: ``box`` (n, 4) int32 = (top, left, height, width) of the digit,
    for drawing and for checking which patches hold the object.
    """

    name = "digits"

    def __init__(self, config: DigitsConfig | None = None, **overrides):
        config = config or DigitsConfig()
        if overrides:
            config = DigitsConfig(**{**config.__dict__, **overrides})
        config.validate()
        self.config = config
        glyphs, labels = _load_glyphs()
        self._glyphs = glyphs
        self._labels = labels
        self._split_glyph_ids = _split_glyphs(labels, config.glyphs_per_class, config.seed)
        if config.task == "glyph":  # one class per training glyph, and every split draws those glyphs
            train_ids = self._split_glyph_ids["train"]
            self._split_glyph_ids = {split: train_ids for split in SPLITS}
            self._class_of = np.zeros(len(labels), np.int32)
            self._class_of[train_ids] = np.arange(len(train_ids))
            per_digit = config.glyphs_per_class[0]
            self.name = "digit-glyphs"
            self.class_names = tuple(f"{CLASS_NAMES[labels[g]]} #{i % per_digit}" for i, g in enumerate(train_ids))
        else:
            self._class_of = labels
            self.class_names = CLASS_NAMES
        self.num_classes = len(self.class_names)
        self.image_shape = (config.image_size, config.image_size, 1)
        self._cache: OrderedDict[tuple[str, int], dict[str, np.ndarray]] = OrderedDict()
        self._cache_lock = threading.Lock()

    @cached_property
    def _scaled(self) -> dict[int, np.ndarray]:
        """Every glyph upscaled (bilinear) to every allowed size: {size: (1797, size, size)}."""
        lo, hi = self.config.digit_size
        out = {}
        for size in range(lo, hi + 1):
            out[size] = np.stack(
                [np.asarray(Image.fromarray(g).resize((size, size), Image.BILINEAR)) for g in self._glyphs]
            ).clip(0.0, 1.0)
        return out

    def split_size(self, split: str) -> int:
        """Canvases in ``split``: one per glyph for train, ``eval_copies`` per glyph for val and test; ValueError
        for another split."""
        if split not in SPLITS:
            raise ValueError(f"split={split!r} is not allowed; use one of {', '.join(SPLITS)}")
        copies = 1 if split == "train" else self.config.eval_copies
        return len(self._split_glyph_ids[split]) * copies

    def glyph_ids(self, split: str) -> np.ndarray:
        """Indices into scikit-learn's digits of the source glyphs of ``split`` (disjoint across splits)."""
        check_split(self, split)
        return self._split_glyph_ids[split]

    def get(self, split: str, indices: np.ndarray, *, epoch: int = 0) -> dict[str, np.ndarray]:
        """Examples ``indices`` of ``split``. Training canvases change with ``epoch``; val/test do not.

        Each example is drawn from its own generator seeded by (seed, split, epoch, index), so a batch does
        not depend on which other examples are drawn with it. Whole splits are rendered once per epoch and
        kept (newest first) up to ``cache_bytes``: models trained side by side on one seed, and repeated
        evaluations, share the canvases instead of drawing them again.
        """
        indices = check_indices(self, split, indices)
        draw_epoch = epoch if split == "train" else 0
        rendered = self._rendered(split, draw_epoch)
        if rendered is None:
            return self._render(split, indices, draw_epoch)
        return {name: values[indices] for name, values in rendered.items()}

    def get_uint8(self, split: str, indices: np.ndarray, *, epoch: int = 0, augment: bool = False
                  ) -> dict[str, np.ndarray]:
        """``get``'s batch with "image" (n, S, S, 1) uint8 in [0, 255] (``base.to_uint8``). ``augment`` changes
        nothing: fresh training canvases every epoch are this dataset's augmentation."""
        batch = self.get(split, indices, epoch=epoch)
        return {**batch, "image": to_uint8(batch["image"])}

    cache_bytes = 128 * 2**20

    def __getstate__(self) -> dict:
        # A pickled copy (an input-pipeline worker process) draws only the canvases it is asked for: whole-epoch
        # renders would be repeated by every worker. The drawing itself is the same, so the canvases are too.
        state = {k: v for k, v in self.__dict__.items() if k not in ("_cache", "_cache_lock", "_scaled")}
        return {**state, "cache_bytes": 0}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _cache=OrderedDict(), _cache_lock=threading.Lock())

    def _rendered(self, split: str, draw_epoch: int) -> dict[str, np.ndarray] | None:
        """The whole split as drawn in ``draw_epoch``, from the cache; None when it exceeds ``cache_bytes``."""
        epoch_bytes = self.split_size(split) * (self.config.image_size ** 2 + 5) * 4
        keep = self.cache_bytes // epoch_bytes
        if keep < 1:
            return None
        with self._cache_lock:
            key = (split, draw_epoch)
            if key not in self._cache:
                self._cache[key] = self._render(split, np.arange(self.split_size(split)), draw_epoch)
                while len(self._cache) > keep:
                    self._cache.popitem(last=False)
            self._cache.move_to_end(key)
            return self._cache[key]

    def _render(self, split: str, indices: np.ndarray, draw_epoch: int) -> dict[str, np.ndarray]:
        n_glyphs = len(self._split_glyph_ids[split])
        cfg = self.config
        size = cfg.image_size
        images = np.zeros((len(indices), size, size, 1), np.float32)
        labels = np.zeros((len(indices),), np.int32)
        boxes = np.zeros((len(indices), 4), np.int32)
        canvases = np.zeros((len(indices), size, size), np.float32)
        noise = np.zeros_like(canvases)
        rows, strokes, pastes = [], [], []
        for row, index in enumerate(indices):
            glyph = self._split_glyph_ids[split][index % n_glyphs]
            rng = np.random.Generator(np.random.PCG64([cfg.seed, _SPLIT_IDS[split], draw_epoch, int(index)]))
            for _ in range(rng.integers(cfg.strokes[0], cfg.strokes[1] + 1)):
                rows.append(row)
                strokes.append(_stroke_params(rng, size, cfg.stroke_length, cfg.stroke_intensity))
            side = int(rng.integers(cfg.digit_size[0], cfg.digit_size[1] + 1))
            top, left = rng.integers(0, size - side + 1), rng.integers(0, size - side + 1)
            pastes.append((top, left, side, glyph))
            noise[row] = rng.normal(0.0, cfg.noise, (size, size))
            labels[row] = self._class_of[glyph]
            boxes[row] = (top, left, side, side)
        _draw_strokes(canvases, rows, strokes)
        for row, (top, left, side, glyph) in enumerate(pastes):
            window = canvases[row, top : top + side, left : left + side]
            np.maximum(window, self._scaled[side][glyph], out=window)
        images[..., 0] = np.clip(canvases + noise, 0.0, 1.0)
        return {"image": images, "label": labels, "box": boxes}

    def arrays(self, split: str, *, epoch: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """The whole split as (images (n, S, S, 1), labels (n,)): small enough to hold in memory."""
        batch = self.get(split, np.arange(self.split_size(split)), epoch=epoch)
        return batch["image"], batch["label"]


def patches_on_box(boxes: np.ndarray, image_size: int, patch_size: int) -> np.ndarray:
    """(n, patches) bool, row-major patch order: True where a patch overlaps the box (top, left, height,
    width) in pixels, e.g. a batch's ``box`` -- which patches hold the digit."""
    grid = np.arange(0, image_size, patch_size)
    top, left, h, w = np.asarray(boxes).T[:, :, None]
    rows = (grid[None] + patch_size > top) & (grid[None] < top + h)  # (n, grid)
    cols = (grid[None] + patch_size > left) & (grid[None] < left + w)
    return (rows[:, :, None] & cols[:, None, :]).reshape(len(boxes), -1)
