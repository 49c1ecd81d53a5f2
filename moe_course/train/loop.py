"""One training loop for every model in the course: compiled step, progress bar, history, checkpoints, resume."""

from __future__ import annotations

import collections
import dataclasses
import gc
import math
import os
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh
from tqdm.auto import tqdm

from moe_course.configs import config_to_dict
from moe_course.data.base import ImageDataset, steps_per_epoch
from moe_course.data.pipeline import check_workers, close_pipeline, train_pipeline
from moe_course.models import build_model
from moe_course.parallel.process_share import assemble_batch, process_rows
from moe_course.parallel.sharding import put, put_tree, replicated
from moe_course.parallel.training import check_mesh_fits, init_training_state, shard_training_state
from moe_course.train.checkpoint import RunCheckpoints
from moe_course.train.config import TrainConfig
from moe_course.train.evaluate import evaluate
from moe_course.train.objectives import CONTRASTIVE, objective_for
from moe_course.train.optim import learning_rate_schedule, make_optimizer
from moe_course.train.steps import checks_enabled, make_eval_step, make_train_step
from moe_course.train.throughput import format_throughput, throughput_fields


@dataclass
class TrainResult:
    """model: the trained nnx model. history: one dict per logged step (step, loss, task_loss, aux_loss,
    accuracy and the objective's other metrics, each the mean over the steps since the previous record;
    loss_max, the largest single-step loss among them, so a spike is not averaged away; learning_rate,
    seconds since the run started; over the wall time since the previous record (``Throughput``):
    images_per_second, data_wait_fraction, tflops_per_second (achieved: the shared FLOP count x 3) and mfu (a
    fraction of the device's dense peak, None where unknown; ``throughput.throughput_fields``);
    val_accuracy/val_loss where evaluated).
    resumed_from: the checkpoint step the run started from, or None. seconds: wall time of this call.
    images_read: training images this process read and decoded (on a mesh of P processes, its 1/P of every
    global batch; the whole batches otherwise).
    """

    model: nnx.Module
    history: list[dict] = field(default_factory=list)
    resumed_from: int | None = None
    seconds: float = 0.0
    images_read: int = 0


class DeviceFeed:
    """The next batches already on their way to the device while the current step runs.

    ``next(feed)`` hands out the oldest of ``size`` batches placed by ``place`` (``jax.device_put``, or the global
    array of ``assemble_batch`` on a mesh; both return before the copy ends) and ``fill()`` takes the next host
    batch from ``batches`` and places it: call it after dispatching the step, so the host waits for data while
    the device computes. Only ``keys`` of each batch travel. ``waited``: seconds spent blocked on ``batches`` so far.
    """

    def __init__(self, batches: Iterator[dict], place: Callable[[dict], dict], keys: tuple[str, ...], size: int = 2):
        self._batches, self._place, self._keys, self._size = batches, place, keys, size
        self._ready: collections.deque = collections.deque()
        self._done = False
        self.waited = 0.0
        for _ in range(size):
            self.fill()

    def fill(self) -> None:
        """Place one more batch, unless ``size`` are ready or ``batches`` is exhausted. An error raised while
        the batch was built (e.g. DataError for a corrupt file) is raised when its step asks for it."""
        if self._done or len(self._ready) >= self._size:
            return
        started = time.perf_counter()
        try:
            batch = next(self._batches)
        except StopIteration:
            self._done = True
            return
        except Exception as exc:  # noqa: BLE001 -- handed to the step that needs this batch, in order
            self._ready.append(exc)
            self._done = True
            return
        finally:
            self.waited += time.perf_counter() - started
        self._ready.append(self._place({k: batch[k] for k in self._keys}))

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        if not self._ready:
            self.fill()
        if not self._ready:
            raise StopIteration
        batch = self._ready.popleft()
        if isinstance(batch, Exception):
            raise batch
        return batch


INPUT_BOUND = 0.10  # data_wait_fraction above which a run warns (once) that it waits for its input


class InputBoundWarning(UserWarning):
    """The training step waited for data more than ``INPUT_BOUND`` of the wall time."""


class Throughput:
    """Images per second and the share of wall time spent waiting for data, between history records.

    ``start()`` opens a window (after the first step, so compilation and worker start-up stay out of it);
    ``record(step, waited)`` closes it at ``step`` with ``waited`` = the feed's total wait so far and returns
    {"images_per_second", "data_wait_fraction"}; the next window starts at ``resume()``, so time spent
    validating between records is not counted. The one place throughput is computed: per-device TFLOP/s and
    MFU derive from ``images_per_second``.
    """

    def __init__(self, batch_size: int):
        self.batch_size = batch_size
        self._t0 = self._step0 = self._wait0 = None

    def start(self, step: int, waited: float) -> None:
        """Open a window now, after ``step``; ``waited``: the feed's total seconds of waiting so far."""
        self._t0, self._step0, self._wait0 = time.perf_counter(), step, waited

    def record(self, step: int, waited: float) -> dict[str, float]:
        """{"images_per_second": images of the steps since the window opened / its wall seconds,
        "data_wait_fraction": seconds waited for data in it / its wall seconds, in [0, 1]}; {} before a window."""
        if self._t0 is None or step <= self._step0:
            return {}
        seconds = max(time.perf_counter() - self._t0, 1e-9)
        return {"images_per_second": (step - self._step0) * self.batch_size / seconds,
                "data_wait_fraction": min(1.0, max(0.0, waited - self._wait0) / seconds)}

    def resume(self, step: int, waited: float) -> None:
        """Open the next window after a record (and its validation), as ``start``."""
        self.start(step, waited)


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


def _carried_opt_state(carried, fresh, shardings):
    """``carried`` checked against ``fresh`` (the run's optimizer's own initial state for the same parameters) and
    copied onto the devices as ``fresh`` lies (``shardings``: the optimizer state's NamedShardings on a mesh, or
    None). Raises OptimizerStateMismatch naming the first leaf whose tree place, shape or dtype differs."""
    from moe_course.models.upcycling import OptimizerStateMismatch

    carried_leaves, _ = jax.tree_util.tree_flatten_with_path(carried)
    fresh_leaves, fresh_tree = jax.tree_util.tree_flatten_with_path(fresh)
    hint = ("carry the state of an optimizer made like this run's (make_optimizer(config): the same optimizer, "
            "grad_clip, weight decay and mu_dtype as the dense run), or start the optimizer afresh")
    if _without_variable_metadata(carried) != _without_variable_metadata(fresh):
        carried_paths = [jax.tree_util.keystr(path) for path, _ in carried_leaves]
        fresh_paths = [jax.tree_util.keystr(path) for path, _ in fresh_leaves]
        first = next((f"{a} where the run's optimizer has {b}" for a, b in zip(carried_paths, fresh_paths) if a != b),
                     f"{len(carried_paths)} leaves where the run's optimizer has {len(fresh_paths)}"
                     if len(carried_paths) != len(fresh_paths) else "the same leaves under other node types")
        raise OptimizerStateMismatch(f"init_opt_state does not fit this run's optimizer: "
                                     f"it has {first}; {hint}")
    for (path, a), (_, b) in zip(carried_leaves, fresh_leaves):
        if (jnp.shape(a), jnp.result_type(a)) != (jnp.shape(b), jnp.result_type(b)):
            raise OptimizerStateMismatch(
                f"init_opt_state{jax.tree_util.keystr(path)} is {jnp.result_type(a)}{list(jnp.shape(a))} where this "
                f"run's optimizer keeps {jnp.result_type(b)}{list(jnp.shape(b))}; {hint}")
    # in fresh's tree, whose Params carry this run's metadata (on a mesh, use_mesh adds their sharding); copies,
    # because the step donates its state and the caller's arrays stay alive
    copied = jax.tree.unflatten(fresh_tree, [jnp.array(leaf) for _, leaf in carried_leaves])
    return copied if shardings is None else put_tree(copied, shardings)


def _without_variable_metadata(tree):
    """``tree``'s structure with each nnx Variable (a Param and its metadata, e.g. the sharding ``use_mesh``
    records) taken as a leaf: what an optimizer state's layout is, whatever its parameters' metadata."""
    return jax.tree_util.tree_structure(tree, is_leaf=lambda node: isinstance(node, nnx.Variable))


def _check_finite(losses: list[tuple[int, jax.Array]], params, *, saving: bool, last_saved: int | None,
                  workdir, history: list[dict]) -> None:
    """Raise TrainingDiverged at the first non-finite loss in ``losses``, or for non-finite params before a save."""
    values = jax.device_get([loss for _, loss in losses])  # one transfer for the whole window
    bad = next(((step, float(v)) for (step, _), v in zip(losses, values) if not math.isfinite(float(v))), None)
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


def _postfix(record: dict) -> dict[str, str]:
    """The progress bar's summary of a history record."""
    shown = {"loss": f"{record['loss']:.3f}", "acc": f"{record['accuracy']:.3f}"}
    if "images_per_second" in record:
        shown.update({"img/s": f"{record['images_per_second']:.0f}", "wait": f"{record['data_wait_fraction']:.0%}",
                      "TFLOP/s": f"{record['tflops_per_second']:.3g}"})
        if record.get("mfu") is not None:
            shown["MFU"] = f"{record['mfu']:.1%}"
    return shown


def _validate(model, dataset, config: TrainConfig, eval_step, mesh: Mesh | None) -> dict[str, float]:
    """The val-split entries of a history record: val_accuracy and val_loss for a classifier; for a contrastive
    model val_accuracy = zero-shot accuracy, and retrieval recall@1 both ways."""
    if eval_step is None:
        from moe_course.analysis.zero_shot import evaluate_contrastive

        val = evaluate_contrastive(model, dataset, "val", batch_size=config.eval_batch_size)
        record = {"val_i2t_recall@1": val["i2t_recall@1"], "val_t2i_recall@1": val["t2i_recall@1"]}
        return {**record, "val_accuracy": val["zero_shot_accuracy"]} if "zero_shot_accuracy" in val else record
    val = evaluate(model, dataset, "val", batch_size=config.eval_batch_size, eval_step=eval_step, mesh=mesh)
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
    data_workers: int = 0,
    init_opt_state=None,
) -> TrainResult:
    """Train ``build_model(model_config)`` on ``dataset``'s train split.

    With ``workdir``, checkpoints go there every ``config.checkpoint_every`` steps and at the end, and a run
    that finds checkpoints there resumes from the newest: parameters, optimizer state, data order and keys
    continue exactly as the uninterrupted run would. ``stop_after`` ends this call after that global step
    without a final checkpoint, as a crash there would (for tests and lessons). ``init_model``: start from this
    model's weights instead of a fresh initialisation (fine-tuning, e.g. an MoD ViT adapted from a pretrained
    ViT); its config must equal ``model_config``, and a checkpoint in ``workdir`` still takes precedence. Every config problem raises ValueError before any
    compilation. ``init_opt_state`` (with ``init_model`` only): start from this optimizer state instead of
    ``make_optimizer(config).init`` (a dense run's state carried into its upcycled V-MoE,
    ``models.upcycle(..., optimizer_state=...)``); it must be the state that optimizer keeps for
    ``init_model``'s parameters -- the same tree, shapes and dtypes -- or ``models.OptimizerStateMismatch`` (a
    ValueError) names the first leaf that differs, before any compilation. It is copied (the step donates its
    own); a checkpoint in ``workdir`` still takes precedence.

    ``mesh`` (``moe_course.parallel.make_mesh``): train sharded over its devices -- every device holds
    different images of each batch, the experts of every MoE layer are split over the ``expert`` axis and
    reached by all-to-all, everything else is replicated; several processes (``jax.distributed``) work the
    same way. The losses equal the one-device run's up to float rounding. The mesh is not part of the run's
    configuration: a checkpoint written on one mesh resumes on any other (or on none). ``init_model`` is then
    switched to the mesh in place. A batch size that does not split over the mesh (or over its processes)
    raises ValueError first. Each process reads and decodes only the rows of every batch its own devices hold
    (``parallel.process_rows``), validates the same way, and prints ``process p of P read N training images``
    at the end (with ``progress``, and always with several processes); several processes need a mesh.

    Input (``data.pipeline``): Grain builds the training batches in ``data_workers`` processes (0: one background
    thread of this process; ``moe-course train`` uses every core), as uint8 where the dataset gives it, and
    the next two batches are copied to the device while a step runs; the step scales the pixels there. Batch
    s depends only on (seed, s), whatever the number of workers, so a resumed run equals the uninterrupted one.
    Each history record carries images_per_second and data_wait_fraction (``Throughput``); the run warns once
    (``InputBoundWarning``) when the step waited for data more than ``INPUT_BOUND`` of the time.

    Divergence: the per-step losses are checked whenever metrics are logged and before every checkpoint, and
    the parameters before every checkpoint. A NaN or infinite value raises ``TrainingDiverged`` naming the
    first bad step and the last good checkpoint; no checkpoint is written from that step on, and the
    checkpoints on disk (with their histories) stay as they were.
    """
    model_config.validate()
    config.validate()
    check_workers(data_workers)
    check_compatible(model_config, dataset, config)
    if mesh is not None:
        check_mesh_fits(mesh, model_config, config)
    elif jax.process_count() > 1:
        raise ValueError(f"mesh=None in a run of {jax.process_count()} processes; pass a mesh over every process's "
                         "devices (parallel.make_mesh(), or --mesh with moe-course train)")
    per_epoch = steps_per_epoch(dataset, config.batch_size)
    started = time.perf_counter()

    if init_opt_state is not None and init_model is None:
        raise ValueError("init_opt_state is given without init_model; the optimizer state belongs to the model "
                         "whose parameters it tracks: pass both (models.upcycle(..., optimizer_state=...) "
                         "returns both)")
    if init_model is not None and getattr(init_model, "config", None) != model_config:
        raise ValueError(f"init_model has config {getattr(init_model, 'config', None)!r}; it must equal model_config")
    tx = make_optimizer(config)
    shardings = None
    if mesh is None:
        model = init_model if init_model is not None else build_model(model_config, rngs=nnx.Rngs(config.seed))
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)
        opt_state = tx.init(params)
    elif init_model is None:  # created sharded on the devices: no process holds the whole model
        graphdef, params, rest, opt_state, shardings = init_training_state(model_config, mesh, tx, seed=config.seed)
    else:
        graphdef, params, rest, opt_state, shardings = shard_training_state(init_model, mesh, tx)
    if init_model is not None:  # the step donates the parameters: the caller's model keeps its own arrays
        params = jax.tree.map(jnp.copy, params)
    if init_opt_state is not None:
        opt_state = _carried_opt_state(init_opt_state, opt_state, None if shardings is None else shardings[1])
    history: list[dict] = []
    start_step, resumed_from = 0, None
    checkpoints = None
    if workdir is not None:
        checkpoints = RunCheckpoints(workdir, keep=config.keep_checkpoints)
        checkpoints.check_run_config(
            {"model": config_to_dict(model_config), "train": config,
             "data": {"name": dataset.name, "shape": list(dataset.image_shape),
                      "randaugment": getattr(dataset, "randaugment", None)}},
            defaults={"model": config_to_dict(type(model_config)()), "train": dataclasses.asdict(TrainConfig()),
                      "data": {"randaugment": None}},  # runs recorded before the option had none
        )
        newest = checkpoints.restore_newest({"params": params, "opt_state": opt_state}, set_aside_damaged=True)
        if newest is not None:
            latest, state, history = newest
            params, opt_state = state["params"], state["opt_state"]
            start_step = resumed_from = latest
            print(f"Resuming from the checkpoint of step {latest} in {checkpoints.workdir}")

    checked = checks_enabled(model_config)
    objective = objective_for(model_config)
    train_step = make_train_step(graphdef, tx, checked=checked, objective=objective, shardings=shardings,
                                 mixup_p=config.mixup_p, num_classes=model_config.num_classes,
                                 randaugment=config.randaugment, donate=True)
    eval_step = make_eval_step(graphdef, checked=checked) if objective is not CONTRASTIVE else None
    schedule = learning_rate_schedule(config)
    base_key = jax.random.key(config.seed)
    last = config.steps if stop_after is None else min(stop_after, config.steps)
    # Every step the loop only dispatches work: metrics stay on the device until a record is logged.
    # On a mesh each process builds only the rows its own devices hold (parallel.process_share).
    rows = None if mesh is None else process_rows(mesh, config.batch_size)
    pipeline = train_pipeline(dataset, config.batch_size, seed=config.seed, start_step=start_step,
                              stop_step=max(last, start_step), workers=data_workers, rows=rows)
    put_batch = jax.device_put if mesh is None else (lambda batch: assemble_batch(batch, mesh, config.batch_size))
    batch = feed = None
    throughput = Throughput(config.batch_size)
    warned = False
    window: list[dict] = []
    unchecked: list[tuple[int, jax.Array]] = []  # (step, loss) since the last finiteness check
    last_saved = resumed_from
    # smoothing=0: the rate shown is steps done / time elapsed. The default moving average swings wildly when
    # steps arrive in bursts (asynchronous dispatch, or two runs trained side by side in threads).
    bar = tqdm(total=config.steps, initial=start_step, desc=f"train {model_config.name}", disable=not progress,
               unit="step", dynamic_ncols=True, smoothing=0)

    def due(every: int, step: int) -> bool:
        return step == config.steps or (every > 0 and step % every == 0)

    float(schedule(start_step))  # compiles the schedule's small programs here, not inside the first record's window
    try:
        feed = DeviceFeed(pipeline, put_batch, objective.batch_keys)
        for step in range(start_step + 1, last + 1):
            batch = next(feed)
            key = jax.random.fold_in(base_key, step)
            params, opt_state, metrics = train_step(
                params, rest, opt_state, batch, key if mesh is None else put(key, replicated(mesh)))
            feed.fill()  # the host waits for the next batch while the device runs this step
            if step == start_step + 1:
                throughput.start(step, feed.waited)
            window.append(metrics)
            unchecked.append((step, metrics["loss"]))
            saving = checkpoints is not None and due(config.checkpoint_every, step)
            logged = due(config.log_every, step) or due(config.eval_every, step) or step == last
            if saving or logged:
                _check_finite(unchecked, params, saving=saving, last_saved=last_saved, workdir=workdir,
                              history=history)
                unchecked = []
            if logged:
                host = jax.device_get(window)  # one transfer for the whole window
                means = {k: float(np.mean([float(m[k]) for m in host])) for k in host[0]}
                record = {"step": step, "epoch": (step - 1) // per_epoch, **means,
                          "loss_max": max(float(m["loss"]) for m in host),
                          "learning_rate": float(schedule(step - 1)),
                          "seconds": time.perf_counter() - started, **throughput.record(step, feed.waited)}
                if "images_per_second" in record:
                    record.update(throughput_fields(model_config, record["images_per_second"], model_config.dtype,
                                                    jax.devices()[0], num_devices=jax.device_count()))
                window = []
                if record.get("data_wait_fraction", 0.0) > INPUT_BOUND and not warned:
                    warned = True
                    warnings.warn(
                        f"input-bound: the training step waited for data {record['data_wait_fraction']:.0%} of the "
                        f"time up to step {step}. Batches are built in {data_workers or 'no'} worker processes; "
                        f"where this machine has cores to spare ({os.cpu_count()} in all), build them in more: "
                        f"train(..., data_workers=N) in Python or a notebook, --data-workers N with `moe-course "
                        f"train`. The run's results do not change with N.", InputBoundWarning, stacklevel=2)
                if due(config.eval_every, step) and dataset.split_size("val"):
                    record.update(_validate(nnx.merge(graphdef, params, rest), dataset, config, eval_step, mesh))
                history.append(record)
                bar.set_postfix(_postfix(record), refresh=False)
                throughput.resume(step, feed.waited)
            bar.update(1)
            if saving:
                checkpoints.save(step, {"params": params, "opt_state": opt_state}, history)
                last_saved = step
    finally:
        bar.close()
        # Batches from worker processes live in shared memory, freed when the last reference goes: drop ours now
        # (an exception's traceback keeps this frame alive), not at interpreter exit, which would leak them.
        batch = feed = None
        gc.collect()  # reference cycles (an exception and its frames) can hold such batches too
        images_read = pipeline.images
        close_pipeline(pipeline)
        pipeline = None
        if checkpoints is not None:
            checkpoints.close()
    seconds = time.perf_counter() - started
    if progress and last > start_step:  # also a static record: a saved notebook shows progress bars at 0%
        rate = next((r for r in reversed(history) if "images_per_second" in r), None)
        print(f"{model_config.name}: steps {start_step + 1}-{last} in {seconds:.0f} s, "
              f"{(last - start_step) / seconds:.1f} steps/s (compilation and validation included)"
              + (f"; last record: {format_throughput(rate['images_per_second'], rate)}" if rate else ""))
    if mesh is not None and (progress or jax.process_count() > 1):  # compared across hosts (docs/scale-out.md)
        print(f"process {jax.process_index()} of {jax.process_count()} read {images_read} training images", flush=True)
    return TrainResult(
        model=nnx.merge(graphdef, params, rest), history=history, resumed_from=resumed_from, seconds=seconds,
        images_read=images_read,
    )
