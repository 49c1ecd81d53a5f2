"""Several independent trainings or evaluations at once, one thread each.

The course's small models keep little more than one CPU core busy, and XLA compiles a program on one core:
two runs side by side take about the time of one on a two-core laptop. Each run has its own model,
optimizer, data order and checkpoints, so the results equal those of the same runs one after another.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterable, TypeVar

from flax import nnx

from moe_course.data.base import ImageDataset
from moe_course.models.vmoe import with_routing
from moe_course.train.config import TrainConfig
from moe_course.train.evaluate import evaluate
from moe_course.train.loop import TrainResult, train

T = TypeVar("T")
R = TypeVar("R")


def side_by_side(fn: Callable[[T], R], items: Iterable[T], *, workers: int | None = None) -> list[R]:
    """``[fn(item) for item in items]``, computed in ``workers`` threads (default: the CPU count, at most one
    per item). The first exception raised by ``fn`` is raised here, after every started call has ended."""
    items = list(items)
    workers = workers or max(1, min(len(items), os.cpu_count() or 1))
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(fn, items))


def train_side_by_side(runs: dict[str, object], dataset: ImageDataset, config: TrainConfig | dict[str, TrainConfig],
                       *, workdir: str | Path | None = None, progress: bool = True) -> dict[str, TrainResult]:
    """Train every ``{name: model config}`` of ``runs`` on ``dataset``, all at once.

    config: one TrainConfig for every run, or ``{name: TrainConfig}`` for each. With ``workdir``, run ``name``
    checkpoints to (and resumes from) ``workdir/name`` (a "/" in the name becomes "-"). Returns
    ``{name: TrainResult}`` in the order of ``runs``. Raises ValueError when a run has no TrainConfig, and
    what ``train`` raises (ValueError for a bad config, before anything compiles).
    """
    configs = config if isinstance(config, dict) else dict.fromkeys(runs, config)
    missing = [name for name in runs if name not in configs]
    if missing:
        raise ValueError(f"config has no TrainConfig for run(s) {missing}; give one for every name in runs")

    def run(name: str) -> TrainResult:
        where = None if workdir is None else Path(workdir) / name.replace("/", "-")
        return train(runs[name], dataset, configs[name], workdir=where, progress=progress)

    return dict(zip(runs, side_by_side(run, runs, workers=len(runs))))


def evaluate_routings(model: nnx.Module, dataset: ImageDataset, settings: Iterable[dict], split: str = "test", *,
                      workers: int | None = None) -> list[dict[str, float]]:
    """``evaluate`` a trained V-MoE once per routing in ``settings`` (dicts for ``with_routing``: k,
    capacity_ratio, allocation, ...), several at once; each on its own copy, so ``model`` is unchanged.

    Returns one ``evaluate`` result per setting, in order. Raises ValueError for an unknown setting or a bad
    value (from ``with_routing``) before anything compiles.
    """
    settings = list(settings)
    copies = [with_routing(nnx.clone(model), **routing) for routing in settings]
    return side_by_side(lambda copy: evaluate(copy, dataset, split), copies, workers=workers)
