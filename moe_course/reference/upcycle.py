"""A dense checkpoint -- a big_vision ViT ``.npz`` or a run of ``moe-course train vit`` -- upcycled into the V-MoE a
run starts from (``moe-course train vmoe --upcycle-from PATH``; sparse upcycling, Komatsuzaki et al., ICLR 2023,
arXiv 2212.05055; the parameter surgery is ``moe_course.models.upcycle``).

Without a preset, the MoE layers are the paper's choices for its upcycled vision models, as we read its design
decisions (the paper is not among the course's seeds, so no section number is cited here): the MLP of every other
block upcycled (half of them), 32 experts, Expert Choice routing (Zhou et al. 2022) with capacity factor 2 (each
expert takes 2 N / E of a group's N tokens, so a token is processed by 2 experts on average). Groups of 8 images
are our choice; the paper routes Expert Choice over its batches without naming a group size for vision.
"""

from __future__ import annotations

import os
from pathlib import Path

from moe_course.configs.vit import backbone_of
from moe_course.configs.vmoe import VMoEConfig
from moe_course.models import ViT, VMoE, upcycle
from moe_course.reference.big_vision import vit_from_big_vision
from moe_course.reference.finetune import with_new_head

UPCYCLE_FORMATS = ("big_vision", "moe-course")
UPCYCLING_MOE = dict(num_experts=32, placement="every-2", allocation="experts_choice", k=1, capacity_ratio=2.0,
                     group_size=8)


def dense_format(path: str | os.PathLike, checkpoint_format: str | None) -> str:
    """``checkpoint_format``, or when None the one ``path`` has: "moe-course" for a directory (a run), else
    "big_vision" (an ``.npz``). Raises ValueError naming ``init_format`` for another format."""
    if checkpoint_format is None:
        return "moe-course" if Path(path).is_dir() else "big_vision"
    return _checked(checkpoint_format)


def _checked(checkpoint_format: str) -> str:
    if checkpoint_format not in UPCYCLE_FORMATS:
        raise ValueError(f"init_format={checkpoint_format!r} cannot be upcycled; use one of "
                         f"{', '.join(UPCYCLE_FORMATS)} (a vmoe checkpoint is a V-MoE already: fine-tune it with "
                         f"--init-checkpoint)")
    return checkpoint_format


def load_dense(path: str | os.PathLike, checkpoint_format: str | None = None, *,
               image_size: int | None = None) -> ViT:
    """The dense ViT of ``load_dense_run`` (without its optimizer state)."""
    return load_dense_run(path, checkpoint_format, image_size=image_size)[0]


def load_dense_run(path: str | os.PathLike, checkpoint_format: str | None = None, *,
                   image_size: int | None = None) -> tuple[ViT, object]:
    """(dense ViT, its optimizer state or None) at ``path``: a big_vision ``.npz`` (``vit_from_big_vision``;
    image_size resizes its position embeddings; its config says value_range="signed", the [-1, 1] pixels
    big_vision trained on; it holds no optimizer state: None) or a course run directory (the newest checkpoint,
    ``train.restore.load_run``, with the optax state saved beside the parameters; image_size must be the run's).
    Raises ValueError for a run that holds no dense ViT, or an image_size a run was not trained at."""
    from moe_course.train.restore import load_run

    checkpoint_format = dense_format(path, checkpoint_format)
    if checkpoint_format == "big_vision":
        dense = vit_from_big_vision(path, image_size=image_size)
        dense.config = dense.config.replace(value_range="signed")
        return dense, None
    run = load_run(path)
    dense = run.model
    if type(dense) is not ViT:
        raise ValueError(f"run {os.fspath(path)!r} holds a {type(dense).__name__}; upcycle a dense ViT run "
                         f"(moe-course train vit ...)")
    if image_size is not None and image_size != dense.config.image_size:
        raise ValueError(f"image_size={image_size} is not allowed for run {os.fspath(path)!r}: it was trained at "
                         f"{dense.config.image_size} px; a course run upcycles at its own image size")
    return dense, run.opt_state


def upcycle_start(dense: ViT, checkpoint_format: str, *, config: VMoEConfig | None = None,
                  num_classes: int | None = None, seed: int = 0, name: str | None = None,
                  optimizer_state=None):
    """The V-MoE an upcycling run starts from: ``dense`` (``load_dense``'s model of a ``checkpoint_format``
    checkpoint) upcycled to ``config`` (None: its own backbone with ``UPCYCLING_MOE``, named ``name`` or
    "upcycled-<format>"), router from ``seed``. With ``optimizer_state`` (the dense run's, ``load_dense_run``)
    returns (V-MoE, the state carried to it: ``models.upcycle(..., optimizer_state=...)``), else the V-MoE.

    num_classes: the run's dataset's classes. A big_vision checkpoint trained on another label set gets a fresh
    (zero) head for them first, as fine-tuning does (``reference.finetune.with_new_head``); a course run must have
    been trained on as many classes (upcycling continues its task). Raises ValueError for that, for a format
    ``dense_format`` refuses, and for a ``config`` that does not fit the dense model
    (``models.upcycling.check_upcyclable``: width, depth, patch size, MoE layers outside the dense depth, ...).
    """
    checkpoint_format = _checked(checkpoint_format)
    if num_classes is not None and num_classes != dense.config.num_classes:
        if checkpoint_format == "moe-course":
            raise ValueError(f"num_classes={num_classes} differs from the {dense.config.num_classes} classes the "
                             f"dense run was trained on; upcycling continues the dense run's task")
        dense = with_new_head(dense, num_classes=num_classes, seed=seed, name=dense.config.name)
    if config is None:
        backbone = backbone_of(dense.config).__dict__
        config = VMoEConfig(**{**backbone, "name": name or f"upcycled-{checkpoint_format}"}, **UPCYCLING_MOE)
    return upcycle(dense, config, seed=seed, optimizer_state=optimizer_state)
