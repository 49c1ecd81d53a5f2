"""A reference checkpoint as a ready model, and the pixel range those checkpoints were trained on."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

import numpy as np
from flax import nnx

from moe_course.reference.big_vision import vit_from_big_vision
from moe_course.reference.vmoe import vmoe_from_checkpoint

FORMATS = ("vmoe", "big_vision")


def load_reference(path: str | os.PathLike, checkpoint_format: str, *,
                   model_config: str | os.PathLike | Mapping | None = None, image_size: int | None = None,
                   group_size: int | None = None) -> nnx.Module:
    """The model of a reference checkpoint, ready for the course's images: ``checkpoint_format`` "big_vision"
    (``path`` = the ``.npz``, a ``ViT``) or "vmoe" (``path`` = the checkpoint prefix, a ``VMoE``; ``model_config`` =
    vmoe's ``config.model`` as a dict or the path of a JSON file holding it). image_size / group_size as in
    ``vmoe_from_checkpoint``.

    Both codes train on pixels in [-1, 1] (their input pipelines' ``value_range(-1, 1)``); the returned model's
    config says ``value_range="signed"``, so it takes images in [0, 1], as every course dataset gives them, and
    maps them to [-1, 1] itself -- fed [-1, 1] pixels it would map them a second time. (The readers
    ``vit_from_big_vision`` / ``vmoe_from_checkpoint`` return the stored model as it is, taking [-1, 1]: wrap a
    course dataset in ``SignedPixels`` for those.) Raises ValueError naming ``format`` for another format, or
    ``model_config`` when it is given for big_vision or missing for vmoe."""
    if checkpoint_format not in FORMATS:
        raise ValueError(f"format={checkpoint_format!r} is not allowed; use one of {', '.join(FORMATS)}")
    if checkpoint_format == "big_vision":
        if model_config is not None:
            raise ValueError("model_config is only for vmoe checkpoints; a big_vision .npz describes itself")
        return _signed(vit_from_big_vision(path, image_size=image_size))
    if model_config is None:
        raise ValueError("model_config is needed for a vmoe checkpoint: the experiment's config.model (as a JSON "
                         "file), which holds the routing settings the checkpoint's arrays do not")
    if not isinstance(model_config, Mapping):
        model_config = json.loads(open(model_config).read())
    return _signed(vmoe_from_checkpoint(path, model_config, image_size=image_size, group_size=group_size))


def _signed(model: nnx.Module) -> nnx.Module:
    """``model``, now mapping its [0, 1] input to the [-1, 1] its checkpoint was trained on (``ViT.embed``)."""
    model.config = model.config.replace(value_range="signed")
    return model


class SignedPixels:
    """``dataset`` (any course ``ImageDataset``, pixels in [0, 1]) with pixels scaled to [-1, 1], the range
    big_vision's and vmoe's input pipelines (``value_range(-1, 1)``) give their models."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __getattr__(self, name):
        return getattr(self.dataset, name)

    def get(self, split: str, indices: np.ndarray, *, epoch: int = 0) -> dict[str, np.ndarray]:
        """The wrapped dataset's batch with "image" scaled from [0, 1] to [-1, 1]."""
        batch = dict(self.dataset.get(split, indices, epoch=epoch))
        batch["image"] = batch["image"] * np.float32(2) - np.float32(1)
        return batch
