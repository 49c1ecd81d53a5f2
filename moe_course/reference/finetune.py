"""A released checkpoint as the start of a fine-tuning run: its body, a new head for a new set of classes.

big_vision's transfer runs (``configs/transfer.py``: ``model_init`` with
``dont_load=['head/kernel', 'head/bias']``) and vmoe's fine-tuning configs (``vmoe/configs/vmoe_paper/*_ft_*.py``: ``initialize_from_vmoe``
with the rule ``('head', '')``) restore every parameter but the head, which starts as a fresh model's (zeros in
all three code bases) with the new class count; the position embeddings are resized to the new image size as
the readers do (``names.resize_position_embeddings``, big_vision's ``resample_posemb``). Both code bases feed
the checkpoints pixels in [-1, 1], so the fine-tuned model takes the course's [0, 1] images and maps them there
itself (``value_range="signed"``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from flax import nnx

from moe_course.models import build_model
from moe_course.reference.evaluate import load_reference


def finetune_start(path: str | os.PathLike, checkpoint_format: str, *, num_classes: int,
                   image_size: int | None = None, model_config: str | os.PathLike | Mapping | None = None,
                   group_size: int | None = None, seed: int = 0, name: str | None = None) -> nnx.Module:
    """The model a fine-tuning run starts from: the checkpoint at ``path`` (``checkpoint_format`` "big_vision"
    or "vmoe", ``model_config``/``group_size`` as in ``load_reference``) at ``image_size`` (None: its own),
    every parameter copied from it except the head, which is a fresh ``build_model(config, Rngs(seed))``'s for
    ``num_classes`` classes. Its config: the checkpoint's with num_classes, value_range="signed" and ``name``
    (default: "<format>-finetune"). Raises ValueError as ``load_reference`` does, and for num_classes < 1.
    """
    _check_classes(num_classes)
    loaded = load_reference(path, checkpoint_format, model_config=model_config, image_size=image_size,
                            group_size=group_size)
    return with_new_head(loaded, num_classes=num_classes, seed=seed, name=name or f"{checkpoint_format}-finetune")


def with_new_head(loaded: nnx.Module, *, num_classes: int, seed: int = 0, name: str = "finetune") -> nnx.Module:
    """``loaded`` (a reference model of ``load_reference``) with a fresh head for ``num_classes`` classes: a new
    model of its config with num_classes, value_range="signed" and ``name``, holding every parameter of
    ``loaded`` but the head. Raises ValueError for num_classes < 1."""
    _check_classes(num_classes)
    config = loaded.config.replace(num_classes=num_classes, value_range="signed", name=name)
    model = build_model(config, rngs=nnx.Rngs(seed))
    state = nnx.state(loaded)
    state["head"] = nnx.state(model)["head"]
    nnx.update(model, state)
    return model


def _check_classes(num_classes) -> None:
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise ValueError(f"num_classes={num_classes!r} is not allowed; use an integer >= 1")
