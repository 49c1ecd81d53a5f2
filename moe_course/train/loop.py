"""One training loop for every model in the course: compiled step, progress bar, history, checkpoints, resume."""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import jax
import numpy as np
from flax import nnx
from tqdm.auto import tqdm

from moe_course.configs import config_to_dict
from moe_course.data.base import ImageDataset, steps_per_epoch, train_batches
from moe_course.models import build_model
from moe_course.train.checkpoint import RunCheckpoints
from moe_course.train.config import TrainConfig
from moe_course.train.evaluate import evaluate
from moe_course.train.optim import learning_rate_schedule, make_optimizer
from moe_course.train.steps import make_eval_step, make_train_step


@dataclass
class TrainResult:
    """model: the trained nnx model. history: one dict per logged step (step, loss, task_loss, aux_loss,
    accuracy, learning_rate, seconds since the run started; val_accuracy/val_loss where evaluated).
    resumed_from: the checkpoint step the run started from, or None. seconds: wall time of this call.
    """

    model: nnx.Module
    history: list[dict] = field(default_factory=list)
    resumed_from: int | None = None
    seconds: float = 0.0


def _prefetch(iterator: Iterator, size: int = 2) -> Iterator:
    """Build the next batches in a background thread while the device runs the current step."""
    q: queue.Queue = queue.Queue(maxsize=size)
    stop = threading.Event()

    def work():
        for item in iterator:
            while not stop.is_set():
                try:
                    q.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if stop.is_set():
                return

    threading.Thread(target=work, daemon=True).start()
    try:
        while True:
            yield q.get()
    finally:
        stop.set()


def check_compatible(model_config, dataset: ImageDataset, config: TrainConfig) -> None:
    """Raises ValueError when the dataset's images or classes, or the batch sizes, do not fit the model config."""
    h, w, c = dataset.image_shape
    if (h, w) != (model_config.image_size, model_config.image_size):
        raise ValueError(
            f"image_size={model_config.image_size} of the model does not match the {h}x{w} images of dataset "
            f"{dataset.name!r}; set image_size={h} or load the data at {model_config.image_size}"
        )
    if c != model_config.channels:
        raise ValueError(f"channels={model_config.channels} of the model; dataset {dataset.name!r} has {c}")
    group = getattr(model_config, "group_size", None)
    if group is not None:
        for name in ("batch_size", "eval_batch_size"):
            if getattr(config, name) % group:
                raise ValueError(f"{name}={getattr(config, name)} is not a multiple of the model's "
                                 f"group_size={group} (images per routing group); use a multiple of {group}")
    if dataset.num_classes != model_config.num_classes:
        raise ValueError(
            f"num_classes={model_config.num_classes} of the model; dataset {dataset.name!r} has {dataset.num_classes}"
        )


def train(
    model_config,
    dataset: ImageDataset,
    config: TrainConfig = TrainConfig(),
    *,
    workdir: str | Path | None = None,
    progress: bool = True,
    stop_after: int | None = None,
    init_model: nnx.Module | None = None,
) -> TrainResult:
    """Train ``build_model(model_config)`` on ``dataset``'s train split.

    With ``workdir``, checkpoints go there every ``config.checkpoint_every`` steps and at the end, and a run
    that finds checkpoints there resumes from the newest: parameters, optimizer state, data order and keys
    continue exactly as the uninterrupted run would. ``stop_after`` ends this call after that global step
    without a final checkpoint, as a crash there would (for tests and lessons). ``init_model``: start from this
    model's weights instead of a fresh initialisation (fine-tuning, e.g. an MoD ViT adapted from a pretrained
    ViT); its config must equal ``model_config``, and a checkpoint in ``workdir`` still takes precedence. Every config problem raises ValueError before any
    compilation.
    """
    model_config.validate()
    config.validate()
    check_compatible(model_config, dataset, config)
    per_epoch = steps_per_epoch(dataset, config.batch_size)
    started = time.perf_counter()

    if init_model is not None and getattr(init_model, "config", None) != model_config:
        raise ValueError(f"init_model has config {getattr(init_model, 'config', None)!r}; it must equal model_config")
    model = init_model if init_model is not None else build_model(model_config, rngs=nnx.Rngs(config.seed))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx = make_optimizer(config)
    opt_state = tx.init(params)
    history: list[dict] = []
    start_step, resumed_from = 0, None
    checkpoints = None
    if workdir is not None:
        checkpoints = RunCheckpoints(workdir, keep=config.keep_checkpoints)
        checkpoints.check_run_config(
            {"model": config_to_dict(model_config), "train": config,
             "data": {"name": dataset.name, "shape": list(dataset.image_shape)}}
        )
        latest = checkpoints.latest_step()
        if latest is not None:
            state, history = checkpoints.restore(latest, {"params": params, "opt_state": opt_state})
            params, opt_state = state["params"], state["opt_state"]
            start_step = resumed_from = latest
            print(f"Resuming from the checkpoint of step {latest} in {checkpoints.workdir}")

    train_step = make_train_step(graphdef, tx)
    eval_step = make_eval_step(graphdef)
    schedule = learning_rate_schedule(config)
    base_key = jax.random.key(config.seed)
    last = config.steps if stop_after is None else min(stop_after, config.steps)
    batches = _prefetch(train_batches(dataset, config.batch_size, seed=config.seed, start_step=start_step))
    window: list[dict] = []
    # smoothing=0: the rate shown is steps done / time elapsed. The default moving average swings wildly when
    # steps arrive in bursts (asynchronous dispatch, or two runs trained side by side in threads).
    bar = tqdm(total=config.steps, initial=start_step, desc=f"train {model_config.name}", disable=not progress,
               unit="step", dynamic_ncols=True, smoothing=0)

    def due(every: int, step: int) -> bool:
        return step == config.steps or (every > 0 and step % every == 0)

    try:
        for step in range(start_step + 1, last + 1):
            batch = next(batches)
            params, opt_state, metrics = train_step(
                params, rest, opt_state, {"image": batch["image"], "label": batch["label"]},
                jax.random.fold_in(base_key, step),
            )
            window.append(metrics)
            if due(config.log_every, step) or due(config.eval_every, step) or step == last:
                means = {k: float(np.mean([float(m[k]) for m in window])) for k in window[0]}
                record = {"step": step, "epoch": (step - 1) // per_epoch, **means,
                          "learning_rate": float(schedule(step - 1)),
                          "seconds": time.perf_counter() - started}
                window = []
                if due(config.eval_every, step) and dataset.split_size("val"):
                    model = nnx.merge(graphdef, params, rest)
                    val = evaluate(model, dataset, "val", batch_size=config.eval_batch_size, eval_step=eval_step)
                    record.update(val_accuracy=val["accuracy"], val_loss=val["loss"])
                history.append(record)
                bar.set_postfix(loss=f"{record['loss']:.3f}", acc=f"{record['accuracy']:.3f}", refresh=False)
            bar.update(1)
            if checkpoints is not None and due(config.checkpoint_every, step):
                checkpoints.save(step, {"params": params, "opt_state": opt_state}, history)
    finally:
        bar.close()
        batches.close()
        if checkpoints is not None:
            checkpoints.close()
    seconds = time.perf_counter() - started
    if progress and last > start_step:  # also a static record: a saved notebook shows progress bars at 0%
        print(f"{model_config.name}: steps {start_step + 1}-{last} in {seconds:.0f} s, "
              f"{(last - start_step) / seconds:.1f} steps/s (compilation and validation included)")
    return TrainResult(
        model=nnx.merge(graphdef, params, rest), history=history, resumed_from=resumed_from, seconds=seconds,
    )
