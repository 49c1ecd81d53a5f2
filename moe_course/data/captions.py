"""Captions for cluttered-digit canvases, built from the facts the generator knows (LIMoE Sec. 3, App. A).

LIMoE trains on image-text pairs; for JFT images it makes the text from class names. Class names alone would
make every image of a class share one caption, so retrieval would only be classification. Here a caption also
states what the generator knows about how the digit was drawn -- its size (small / medium / large, the third
of the ``digit_size`` range its side falls in) and where it sits (which third of the free room it was placed
in, vertically and horizontally) -- in one of several sentence templates. So captions of one class differ,
and matching an image to its own caption needs the size and position as well as the class.

Zero-shot classification uses class prompts instead (``ZERO_SHOT_TEMPLATES``): sentences that name the class
and nothing about any one image -- a few plain ones and every caption template filled with every size and
position -- averaged per class (prompt ensembling, CLIP Sec. 3.1.4).
"""

from __future__ import annotations

SIZE_WORDS = ("small", "medium", "large")
VERTICAL_WORDS = ("top", "middle", "bottom")
HORIZONTAL_WORDS = ("left", "center", "right")

# Each caption template uses {name} (class name), {size} (SIZE_WORDS) and {position} (``position_phrase``).
CAPTION_TEMPLATES = (
    "a {size} {name} in the {position}",
    "a handwritten {name}, {size}, at the {position}",
    "the digit {name} in {size} print near the {position}",
    "{position}: a {size} digit {name}",
    "a picture of a {size} {name} at the {position} of the canvas",
    "a {name} written {size} in the {position} among clutter",
)
# Zero-shot prompts name the class only.
PROMPT_TEMPLATES = (
    "a {name}",
    "the digit {name}",
    "a handwritten {name}",
    "a picture of the number {name}",
)
# The nine phrases ``position_phrase`` can return.
POSITION_PHRASES = ("top left", "top", "top right", "left", "center", "right", "bottom left", "bottom",
                    "bottom right")


def attribute_templates() -> tuple[str, ...]:
    """Every caption template with its {size} and {position} filled in by every size word and position phrase
    (6 x 3 x 9 = 162 templates, {name} left open): prompts in the form the training captions take that still
    say nothing about any one image. Averaged per class they describe a class at every size and place -- prompt
    ensembling over attributes, as CLIP's ImageNet prompts include "a photo of a big {}" and "... small {}"."""
    return tuple(t.replace("{size}", size).replace("{position}", where)
                 for t in CAPTION_TEMPLATES for size in SIZE_WORDS for where in POSITION_PHRASES)


# What zero-shot classification averages per class: the plain class prompts and the attribute templates (on the
# validation split of a 3,000-step digits-limoe run: 0.814 with PROMPT_TEMPLATES alone, 0.856 with these).
ZERO_SHOT_TEMPLATES = PROMPT_TEMPLATES + attribute_templates()


def _third(offset: int, room: int) -> int:
    """0, 1 or 2: which third of [0, room] ``offset`` lies in (0 when there is no room)."""
    if room <= 0:
        return 0
    return min(2, int(3 * offset / (room + 1)))


def size_word(side: int, digit_size: tuple[int, int]) -> str:
    """"small", "medium" or "large": the third of the inclusive range ``digit_size`` = (min, max) pixels that
    the digit's ``side`` falls in. Raises ValueError when ``side`` lies outside the range."""
    lo, hi = digit_size
    if not lo <= side <= hi:
        raise ValueError(f"side={side} is not allowed; use a digit side in digit_size={digit_size}")
    return SIZE_WORDS[_third(side - lo, hi - lo)]


def position_phrase(top: int, left: int, side: int, image_size: int) -> str:
    """Where a ``side``-pixel digit pasted at (top, left) sits on an ``image_size`` canvas, in words.

    Each axis is split into thirds of the room the digit could have been placed in (``image_size - side``
    pixels): vertically top / middle / bottom, horizontally left / center / right. The phrase drops the
    middle words: "top left", "top", "left", "center" (both middle), "bottom right", ... (9 phrases).
    Raises ValueError when the digit does not fit on the canvas.
    """
    room = image_size - side
    if not (0 <= top <= room and 0 <= left <= room):
        raise ValueError(f"box (top={top}, left={left}, side={side}) does not fit an image_size={image_size} canvas")
    v, h = VERTICAL_WORDS[_third(top, room)], HORIZONTAL_WORDS[_third(left, room)]
    words = [w for w in (v, h) if w not in ("middle", "center")]
    return " ".join(words) or "center"


def caption(name: str, box, *, image_size: int, digit_size: tuple[int, int], template: int) -> str:
    """The caption of one canvas: ``CAPTION_TEMPLATES[template]`` filled with the class ``name``, the size word
    and the position phrase of ``box`` = (top, left, height, width) in pixels (a square digit: height = width).
    Raises ValueError for a template index out of range or a box that does not fit (see ``position_phrase``)."""
    if not 0 <= template < len(CAPTION_TEMPLATES):
        raise ValueError(f"template={template} is not allowed; use 0 <= template < {len(CAPTION_TEMPLATES)}")
    top, left, side, _ = (int(v) for v in box)
    return CAPTION_TEMPLATES[template].format(
        name=name, size=size_word(side, digit_size), position=position_phrase(top, left, side, image_size))


def class_prompts(class_names, templates: tuple[str, ...] = PROMPT_TEMPLATES) -> list[list[str]]:
    """Zero-shot prompts: ``[[template.format(name=c) for template in templates] for c in class_names]``,
    shape (classes, templates). Raises ValueError for an empty template list or a template without {name}."""
    if not templates:
        raise ValueError("templates=() is not allowed; give at least one prompt template with {name}")
    for t in templates:
        if "{name}" not in t:
            raise ValueError(f"prompt template {t!r} has no {{name}} field; every prompt must name the class")
    return [[t.format(name=name) for t in templates] for name in class_names]
