"""The training input pipeline on Grain: whole batches built in worker processes, in step order, as uint8.

Grain (google/grain, the JAX ecosystem's data loader, used by MaxText) runs it: ``grain.MapDataset.range``
over the global batch steps, ``map`` to the batch of each step (``TrainBatch``), and ``mp_prefetch`` over
``workers`` processes (``grain.MultiprocessingOptions``). Worker i of n builds steps i, i+n, i+2n, ... and Grain
interleaves them back in step order (batches of 8 MiB or more cross to the main process through shared
memory). Small batches (the digits' 128 KiB) travel several consecutive steps to one Grain element
(``steps_per_element``): each element costs the main process a fraction of a millisecond to receive, which at
thousands of small batches a second would otherwise take the core a second worker needs. Elements stay under
512 KiB: a CIFAR batch of 128 (384 KiB) travels alone, because two in one element cost a worker twice the CPU
per batch and a third of the rate (benchmarks/README.md).

Batch s lists the examples of the s-th slice of the shuffled epoch orders (``base.batch_indices``) and the
dataset builds them with randomness of their own, a function of (seed, epoch, index): the digits' fresh
canvases, the image folders' Inception crops and flips. So batch s depends only on (seed, s), whatever the
number of workers, and the pipeline's whole state is the next step: a checkpoint of step s resumes by starting
the pipeline at s (``train_pipeline(start_step=s)``), which gives the batches the uninterrupted run saw.

On a pod each process builds only its rows of every global batch (``rows``, from ``parallel.process_rows``): the
same examples with the same randomness as the rows of the one-process batch, so the global batches do not
depend on the number of processes either.
"""

from __future__ import annotations

import collections
import os
import threading

import numpy as np

from moe_course.data.base import ImageDataset, batch_indices, check_split, epoch_order, steps_per_epoch, training_batch


SHARED_MEMORY_FROM = 8 * 2**20  # bytes: arrays at least this large reach the main process through shared memory
ELEMENT_BYTES = 2**19  # with workers, consecutive batches smaller than this travel together, up to MAX_STEPS_PER_ELEMENT
MAX_STEPS_PER_ELEMENT = 16


def default_workers() -> int:
    """The CPU cores this process may run on (``os.sched_getaffinity``; ``os.cpu_count`` where that is missing)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def check_workers(workers) -> int:
    """``workers`` as an int; ValueError naming data_workers unless it is an integer >= 0."""
    if isinstance(workers, bool) or not isinstance(workers, (int, np.integer)) or workers < 0:
        raise ValueError(f"data_workers={workers!r} is not allowed; use an integer >= 0 (0: build the batches "
                         f"in the training process; default: the {default_workers()} cores it may use)")
    return int(workers)


class TrainBatch:
    """``TrainBatch(dataset, batch_size, seed, rows)(s)``: training batch ``s`` (0-based global step) -- what each
    worker process holds (a pickled copy of the dataset) and calls. Image uint8 where the dataset's class has
    ``get_uint8`` (``base.training_batch``). ``rows`` (start, stop): only those rows of the global batch are read
    and decoded (one process's share on a pod, ``parallel.process_rows``); None: all ``batch_size``."""

    def __init__(self, dataset: ImageDataset, batch_size: int, seed: int, rows: tuple[int, int] | None = None):
        self.dataset, self.batch_size, self.seed = dataset, batch_size, seed
        self.rows = (0, batch_size) if rows is None else rows
        self._order: tuple[int, np.ndarray] | None = None  # (epoch, its order): one permutation per epoch

    def __call__(self, step) -> dict[str, np.ndarray]:
        n = self.dataset.split_size("train")
        epoch = int(step) // (n // self.batch_size)
        if self._order is None or self._order[0] != epoch:
            self._order = (epoch, epoch_order(n, seed=self.seed, epoch=epoch))
        _, indices = batch_indices(n, self.batch_size, seed=self.seed, step=int(step), order=self._order[1])
        return training_batch(self.dataset, indices[self.rows[0]:self.rows[1]], epoch=epoch)


class TrainBatches:
    """``TrainBatches(batch, count, stop)(s)``: the batches of steps s .. min(s + count, stop) - 1 as a list, an
    exception raised while building one in its place (``Unchunked`` raises it when its step comes)."""

    def __init__(self, batch: TrainBatch, count: int, stop: int):
        self.batch, self.count, self.stop = batch, count, stop

    def __call__(self, first) -> list:
        out = []
        for step in range(int(first), min(int(first) + self.count, self.stop)):
            try:
                out.append(self.batch(step))
            except Exception as exc:  # noqa: BLE001 -- raised in step order by Unchunked
                out.append(exc)
                break
        return out


class Unchunked:
    """The batches of an iterator over ``TrainBatches`` lists, one at a time, in step order; ``close()`` ends the
    underlying Grain iterator. ``images``: the images of every batch received from the builders so far (those
    decoded for this process, by its thread or its workers)."""

    def __init__(self, chunks):
        self._chunks, self._ready = chunks, collections.deque()
        self.images = 0

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        while not self._ready:
            chunk = next(self._chunks)
            self.images += sum(len(b["image"]) for b in chunk if isinstance(b, dict) and "image" in b)
            self._ready.extend(chunk)
        batch = self._ready.popleft()
        if isinstance(batch, Exception):
            raise batch
        return batch

    def close(self) -> None:
        """Drop the batches received but not handed out, and close the Grain iterator (its workers)."""
        self._ready.clear()
        close = getattr(self._chunks, "close", None)
        if close is not None:
            close()


def steps_per_element(dataset: ImageDataset, batch_size: int, workers: int) -> int:
    """Consecutive training batches per Grain element: 1 without workers or for batches of ``ELEMENT_BYTES`` or
    more (uint8 images), else as many as fit in ``ELEMENT_BYTES``, at most ``MAX_STEPS_PER_ELEMENT``."""
    if not workers:
        return 1
    batch_bytes = batch_size * int(np.prod(dataset.image_shape))
    return int(min(MAX_STEPS_PER_ELEMENT, max(1, ELEMENT_BYTES // max(batch_bytes, 1))))


def _exit_with_parent(index: int, count: int) -> None:
    """Worker start-up (``worker_init_fn``): end this worker as soon as the training process is gone, also when
    it was killed (SIGKILL runs no clean-up); otherwise the worker would wait forever to hand over a batch."""
    import multiprocessing
    from multiprocessing.connection import wait

    parent = multiprocessing.parent_process()
    if parent is not None:
        threading.Thread(target=lambda: (wait([parent.sentinel]), os._exit(1)), daemon=True).start()


def train_pipeline(dataset: ImageDataset, batch_size: int, *, seed: int, start_step: int = 0,
                   stop_step: int | None = None, workers: int = 0, buffer: int = 2,
                   rows: tuple[int, int] | None = None):
    """An iterator over the training batches ``start_step`` .. ``stop_step - 1`` (0-based; None: endless) of
    ``dataset``, built by Grain: in ``workers`` processes, or with 0 in one background thread of this process.

    Batch s is ``TrainBatch(dataset, batch_size, seed)(s)``: the same batches ``base.train_batches`` lists, with
    "image" (batch_size, H, W, C) uint8 (float32 for a dataset class without ``get_uint8``) and the dataset's
    other fields. ``rows`` (start, stop): build only those rows of every global batch (this process's share on
    a pod, ``parallel.process_rows``): batch s is then rows start..stop-1 of the one-process batch s, whatever
    the number of workers; the iterator's ``images`` counts the images built. ``buffer``: elements each worker
    (or the thread) keeps ready. End it with ``close_pipeline``
    once its batches are dropped, to end the workers and free their shared memory. An error raised while
    building a batch (e.g. ``DataError`` naming a corrupt file) is raised by ``next`` on the iterator, in step
    order, also from a worker. Raises ValueError for ``workers`` < 0, ``batch_size`` larger than the training
    split, or an empty training split.
    """
    import grain

    workers = check_workers(workers)
    check_split(dataset, "train")
    steps_per_epoch(dataset, batch_size)
    stop = stop_step if stop_step is not None else 2**62
    if not 0 <= start_step <= stop:
        raise ValueError(f"start_step={start_step} is not allowed; use 0 <= start_step <= stop_step={stop}")
    if rows is not None and not 0 <= rows[0] < rows[1] <= batch_size:
        raise ValueError(f"rows={rows!r} is not allowed; use (start, stop) with 0 <= start < stop <= "
                         f"batch_size={batch_size}")
    local = batch_size if rows is None else rows[1] - rows[0]
    chunk = steps_per_element(dataset, local, workers)
    steps = grain.MapDataset.range(start_step, stop, chunk).map(
        TrainBatches(TrainBatch(dataset, batch_size, seed, rows), chunk, stop))
    # In the workers a batch is built in the worker's own loop (the process buffer holds the ready ones); without
    # workers one thread builds them ahead while the training step runs.
    steps = steps.to_iter_dataset(grain.ReadOptions(num_threads=0 if workers else 1, prefetch_buffer_size=buffer))
    if workers:
        from absl import flags
        from grain.experimental import DatasetOptions, WithOptionsIterDataset

        # Small batches (the digits, CIFAR) cross as one pickle; large ones (224 px images) through shared memory.
        steps = WithOptionsIterDataset(steps, DatasetOptions(min_shm_size=SHARED_MEMORY_FROM))

        if not flags.FLAGS.is_parsed():  # grain 0.2.18 reads an absl flag in mp_prefetch (google/grain#1355)
            flags.FLAGS.mark_as_parsed()
        steps = steps.mp_prefetch(grain.MultiprocessingOptions(num_workers=workers, per_worker_buffer_size=buffer),
                                  worker_init_fn=_exit_with_parent)
    return Unchunked(iter(steps))


def close_pipeline(iterator) -> None:
    """End a ``train_pipeline`` iterator: stop its workers, and wait until the shared memory of the batches
    already dropped is released. Grain releases it in a background thread; a process that exits before that
    thread ran leaves the segments to Python's resource tracker, which warns about them at exit."""
    close = getattr(iterator, "close", None)
    if close is not None:
        close()
    from grain._src.python.ipc.shared_memory_array import SharedMemoryArray  # no public hook for this

    pool = getattr(SharedMemoryArray, "_del_thread_pool", None)
    if pool is not None:
        SharedMemoryArray._disable_async_del()  # the next pipeline starts a fresh pool
        pool.close()
        pool.join()
