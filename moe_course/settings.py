"""Settings the chapters read from the environment, checked before anything trains."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

SEED_VARIABLE = "MOE_COURSE_SEED"
RETRAIN_VARIABLE = "MOE_COURSE_RETRAIN"
WORKDIR_VARIABLE = "MOE_COURSE_WORKDIR"
# Folders of the repository a notebook's kernel starts in (Jupyter starts a kernel in its notebook's folder).
NOTEBOOK_FOLDERS = ("chapters", "exercises", "mywork")
# Chapter 6's pretrained dense backbone (preset digits-24-p4), written by benchmarks/mod_backbone.py.
RECORDED_BACKBONE = Path(__file__).resolve().parent / "results" / "chapter06_backbone.npz"


def chapter_seed(environ: Mapping[str, str] = os.environ) -> int:
    """The seed a chapter initialises and trains its models with: ``MOE_COURSE_SEED``, 0 when unset or empty.

    Every random draw a chapter's claims rest on (parameter initialisation, router noise, batch order) follows
    this seed, so a chapter can be rerun with ``MOE_COURSE_SEED=1`` to see which of its numbers are the
    model's and which are the seed's. The data (the digit canvases) do not change with it.

    Raises:
        ValueError: the variable is set to anything but a non-negative integer (e.g. ``"-1"``, ``"one"``).
    """
    value = environ.get(SEED_VARIABLE, "").strip()
    if not value:
        return 0
    if not (value.isascii() and value.isdigit()):  # "²" is a Unicode digit, not a seed
        raise ValueError(f"{SEED_VARIABLE}={value!r} is not allowed; use a non-negative integer such as 0, 1 or 2")
    return int(value)


def retrain_recorded(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether a chapter trains again what it would otherwise load from a recorded model: ``MOE_COURSE_RETRAIN=1``.

    Raises:
        ValueError: the variable is set to anything but "", "0" or "1".
    """
    value = environ.get(RETRAIN_VARIABLE, "").strip()
    if value not in ("", "0", "1"):
        raise ValueError(f"{RETRAIN_VARIABLE}={value!r} is not allowed; use 1 (train again) or 0 (load the recorded "
                         "model, the default)")
    return value == "1"


def runs_dir(environ: Mapping[str, str] = os.environ, cwd: Path | None = None) -> Path:
    """The folder a chapter writes its runs (checkpoints) into: ``MOE_COURSE_WORKDIR`` when set, else ``runs/``.

    ``runs/`` is where ``moe-course train`` writes from the repository's root (``runs/<preset>``): a notebook
    whose kernel starts in ``chapters/``, ``exercises/`` or ``mywork/`` of the repository writes to the root's
    ``runs/`` too, not to a ``runs/`` beside the notebooks. Elsewhere it is ``runs/`` in the current folder.
    Returns a Path; nothing is created.
    """
    given = environ.get(WORKDIR_VARIABLE, "").strip()
    if given:
        return Path(given)
    here = Path.cwd() if cwd is None else cwd
    if here.name in NOTEBOOK_FOLDERS and (here.parent / "chapters").is_dir() and (here.parent / "moe_course").is_dir():
        return here.parent / "runs"
    return here / "runs"
