"""Settings the chapters read from the environment, checked before anything trains."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

SEED_VARIABLE = "MOE_COURSE_SEED"
RETRAIN_VARIABLE = "MOE_COURSE_RETRAIN"
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
