"""One training loop for every model in the course: compiled step, progress bar, history, checkpoints, resume."""

from __future__ import annotations

import dataclasses
import math
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh
from tqdm.auto import tqdm

from moe_course.configs import config_to_dict
from moe_course.data.base import ImageDataset, steps_per_epoch, train_batches
from moe_course.models import build_model
from moe_course.parallel.sharding import put, replicated, shard_batch
from moe_course.parallel.training import check_mesh_fits, shard_training_state
from moe_course.train.checkpoint import RunCheckpoints
from moe_course.train.config import TrainConfig
from moe_course.train.evaluate import evaluate
from moe_course.train.objectives import CONTRASTIVE, objective_for
from moe_course.train.optim import learning_rate_schedule, make_optimizer
from moe_course.train.steps import checks_enabled, make_eval_step, make_train_step


@dataclass
class TrainResult:
    """model: the trained nnx model. history: one dict per logged step (step, loss, task_loss, aux_loss,
    accuracy and the objective's other metrics, each the mean over the steps since the previous record;
    loss_max, the largest single-step loss among them, so a spike is not averaged away; learning_rate,
    seconds since the run started; val_accuracy/val_loss where evaluated).
    resumed_from: the checkpoint step the run started from, or None. seconds: wall time of this call.
    """

    model: nnx.Module
    history: list[dict] = field(default_factory=list)
    resumed_from: int | None = None
    seconds: float = 0.0


def _prefetch(iterator: Iterator, size: int = 2) -> Iterator:
    """Build the next batches in a background thread while the device runs the current step.

    An exception raised while building a batch (e.g. the DataError of a corrupt image file) is handed to
    the consumer and raised there, in order, when it asks for that batch: it never dies with the thread
    while the consumer waits on an empty queue.
    """
    q: queue.Queue = queue.Queue(maxsize=size)
    stop = threading.Event()

    def put(entry) -> bool:
        while not stop.is_set():
            try:
                q.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def work():
        try:
            for item in iterator:
                if not put((item, None)):
                    return
        except BaseException as exc:  # any failure, handed over rather than printed by the dying thread
            put((None, exc))
            return
        put((None, StopIteration()))

    threading.Thread(target=work, daemon=True).start()
    try:
        while True:
            item, failure = q.get()
            if isinstance(failure, StopIteration):
                return
            if failure is not None:
                raise failure
            yield item
    finally:
        stop.set()


class TrainingDiverged(RuntimeError):
    """The loss or the parameters became NaN or infinite. step: the first step where it was seen.
    last_checkpoint: the newest checkpoint step on disk (all written before the divergence), or None.
    history: the metric records logged before the divergence."""

    def __init__(self, message: str, *, step: int, last_checkpoint: int | None, history: list[dict]):
        super().__init__(message)
        self.step, self.last_checkpoint, self.history = step, last_checkpoint, history


@jax.jit
def _all_finite(tree) -> jax.Array:
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(leaf)) for leaf in jax.tree.leaves(tree)]))


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
    caption_only = objective_for(model_config) is CONTRASTIVE and dataset.num_classes == 0  # retrieval data
    if dataset.num_classes != model_config.num_classes and not caption_only:
        raise ValueError(
            f"num_classes={model_config.num_classes} of the model; dataset {dataset.name!r} has {dataset.num_classes}"
        )
    if objective_for(model_config) is CONTRASTIVE:
        tokenizer = getattr(dataset, "tokenizer", None)
        if tokenizer is None:
            raise ValueError(f"dataset {dataset.name!r} has no captions; a one-tower image-text model trains on an "
                             "image-caption dataset (e.g. CaptionedDigits)")
        if tokenizer.seq_len != model_config.seq_len:
            raise ValueError(f"seq_len={model_config.seq_len} of the model does not match the {tokenizer.seq_len}-token "
                             f"captions of dataset {dataset.name!r}; set seq_len={tokenizer.seq_len}")
        if tokenizer.vocab_size > model_config.vocab_size:
            raise ValueError(f"vocab_size={model_config.vocab_size} of the model is smaller than the tokenizer's "
                             f"{tokenizer.vocab_size} pieces; use vocab_size >= {tokenizer.vocab_size}")


def _check_finite(losses: list[tuple[int, jax.Array]], params, *, saving: bool, last_saved: int | None,
                  workdir, history: list[dict]) -> None:
    """Raise TrainingDiverged at the first non-finite loss in ``losses``, or for non-finite params before a save."""
    bad = next(((step, float(loss)) for step, loss in losses if not math.isfinite(float(loss))), None)
    if bad is None and saving and not bool(_all_finite(params)):
        bad = (losses[-1][0], None)
    if bad is None:
        return
    step, loss = bad
    what = f"the loss became {loss}" if loss is not None else "the parameters became non-finite (NaN or inf)"
    if last_saved is not None:
        keep = f"the last good checkpoint is step {last_saved} in {Path(workdir) / 'checkpoints'}"
    else:
        keep = "no checkpoint was written" if workdir is not None else "no workdir, so no checkpoint"
    raise TrainingDiverged(
        f"training diverged: {what} at step {step}; {keep}, and none is written from step {step} on; "
        "lower the learning rate or lengthen the warm-up and start again",
        step=step, last_checkpoint=last_saved, history=list(history),
    )


def _validate(model, dataset, config: TrainConfig, eval_step) -> dict[str, float]:
    """The val-split entries of a history record: val_accuracy and val_loss for a classifier; for a contrastive
    model val_accuracy = zero-shot accuracy, and retrieval recall@1 both ways."""
    if eval_step is None:
        from moe_course.analysis.zero_shot import evaluate_contrastive

        val = evaluate_contrastive(model, dataset, "val", batch_size=config.eval_batch_size)
        record = {"val_i2t_recall@1": val["i2t_recall@1"], "val_t2i_recall@1": val["t2i_recall@1"]}
        return {**record, "val_accuracy": val["zero_shot_accuracy"]} if "zero_shot_accuracy" in val else record
    val = evaluate(model, dataset, "val", batch_size=config.eval_batch_size, eval_step=eval_step)
    return {"val_accuracy": val["accuracy"], "val_loss": val["loss"]}


def train(
    model_config,
    dataset: ImageDataset,
    config: TrainConfig = TrainConfig(),
    *,
    workdir: str | Path | None = None,
    progress: bool = True,
    stop_after: int | None = None,
    init_model: nnx.Module | None = None,
    mesh: Mesh | None = None,
) -> TrainResult:
    """Train ``build_model(model_config)`` on ``dataset``'s train split.

    With ``workdir``, checkpoints go there every ``config.checkpoint_every`` steps and at the end, and a run
    that finds checkpoints there resumes from the newest: parameters, optimizer state, data order and keys
    continue exactly as the uninterrupted run would. ``stop_after`` ends this call after that global step
    without a final checkpoint, as a crash there would (for tests and lessons). ``init_model``: start from this
    model's weights instead of a fresh initialisation (fine-tuning, e.g. an MoD ViT adapted from a pretrained
    ViT); its config must equal ``model_config``, and a checkpoint in ``workdir`` still takes precedence. Every config problem raises ValueError before any
    compilation.

    ``mesh`` (``moe_course.parallel.make_mesh``): train sharded over its devices -- every device holds
    different images of each batch, the experts of every MoE layer are split over the ``expert`` axis and
    reached by all-to-all, everything else is replicated; several processes (``jax.distributed``) work the
    same way. The losses equal the one-device run's up to float rounding. The mesh is not part of the run's
    configuration: a checkpoint written on one mesh resumes on any other (or on none). ``init_model`` is then
    switched to the mesh in place. A batch size that does not split over the mesh raises ValueError first.

    Divergence: the per-step losses are checked whenever metrics are logged and before every checkpoint, and
    the parameters before every checkpoint. A NaN or infinite value raises ``TrainingDiverged`` naming the
    first bad step and the last good checkpoint; no checkpoint is written from that step on, and the
    checkpoints on disk (with their histories) stay as they were.
    """
    model_config.validate()
    config.validate()
    check_compatible(model_config, dataset, config)
    if mesh is not None:
        check_mesh_fits(mesh, model_config, config)
    per_epoch = steps_per_epoch(dataset, config.batch_size)
    started = time.perf_counter()

    if init_model is not None and getattr(init_model, "config", None) != model_config:
        raise ValueError(f"init_model has config {getattr(init_model, 'config', None)!r}; it must equal model_config")
    model = init_model if init_model is not None else build_model(model_config, rngs=nnx.Rngs(config.seed))
    tx = make_optimizer(config)
    shardings = None
    if mesh is None:
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)
        opt_state = tx.init(params)
    else:
        graphdef, params, rest, opt_state, shardings = shard_training_state(model, mesh, tx)
    history: list[dict] = []
    start_step, resumed_from = 0, None
    checkpoints = None
    if workdir is not None:
        checkpoints = RunCheckpoints(workdir, keep=config.keep_checkpoints)
        checkpoints.check_run_config(
            {"model": config_to_dict(model_config), "train": config,
             "data": {"name": dataset.name, "shape": list(dataset.image_shape)}},
            defaults={"model": config_to_dict(type(model_config)()), "train": dataclasses.asdict(TrainConfig())},
        )
        newest = checkpoints.restore_newest({"params": params, "opt_state": opt_state}, set_aside_damaged=True)
        if newest is not None:
            latest, state, history = newest
            params, opt_state = state["params"], state["opt_state"]
            start_step = resumed_from = latest
            print(f"Resuming from the checkpoint of step {latest} in {checkpoints.workdir}")

    checked = checks_enabled(model_config)
    objective = objective_for(model_config)
    train_step = make_train_step(graphdef, tx, checked=checked, objective=objective, shardings=shardings)
    eval_step = make_eval_step(graphdef, checked=checked) if objective is not CONTRASTIVE else None
    place = (lambda batch: batch) if mesh is None else (lambda batch: shard_batch(batch, mesh))
    if mesh is not None and eval_step is not None:
        compiled_eval = eval_step
        eval_step = lambda params, rest, batch: compiled_eval(params, rest, place(batch))
    schedule = learning_rate_schedule(config)
    base_key = jax.random.key(config.seed)
    last = config.steps if stop_after is None else min(stop_after, config.steps)
    batches = _prefetch(train_batches(dataset, config.batch_size, seed=config.seed, start_step=start_step))
    window: list[dict] = []
    unchecked: list[tuple[int, jax.Array]] = []  # (step, loss) since the last finiteness check
    last_saved = resumed_from
    # smoothing=0: the rate shown is steps done / time elapsed. The default moving average swings wildly when
    # steps arrive in bursts (asynchronous dispatch, or two runs trained side by side in threads).
    bar = tqdm(total=config.steps, initial=start_step, desc=f"train {model_config.name}", disable=not progress,
               unit="step", dynamic_ncols=True, smoothing=0)

    def due(every: int, step: int) -> bool:
        return step == config.steps or (every > 0 and step % every == 0)

    try:
        for step in range(start_step + 1, last + 1):
            batch = next(batches)
            key = jax.random.fold_in(base_key, step)
            params, opt_state, metrics = train_step(
                params, rest, opt_state, place({k: batch[k] for k in objective.batch_keys}),
                key if mesh is None else put(key, replicated(mesh)),
            )
            window.append(metrics)
            unchecked.append((step, metrics["loss"]))
            saving = checkpoints is not None and due(config.checkpoint_every, step)
            logged = due(config.log_every, step) or due(config.eval_every, step) or step == last
            if saving or logged:
                _check_finite(unchecked, params, saving=saving, last_saved=last_saved, workdir=workdir,
                              history=history)
                unchecked = []
            if logged:
                means = {k: float(np.mean([float(m[k]) for m in window])) for k in window[0]}
                record = {"step": step, "epoch": (step - 1) // per_epoch, **means,
                          "loss_max": max(float(m["loss"]) for m in window),
                          "learning_rate": float(schedule(step - 1)),
                          "seconds": time.perf_counter() - started}
                window = []
                if due(config.eval_every, step) and dataset.split_size("val"):
                    record.update(_validate(nnx.merge(graphdef, params, rest), dataset, config, eval_step))
                history.append(record)
                bar.set_postfix(loss=f"{record['loss']:.3f}", acc=f"{record['accuracy']:.3f}", refresh=False)
            bar.update(1)
            if saving:
                checkpoints.save(step, {"params": params, "opt_state": opt_state}, history)
                last_saved = step
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
