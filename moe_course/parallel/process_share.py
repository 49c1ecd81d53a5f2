"""Each process's share of a global batch: the rows its own devices hold, and the global array built from them.

On a mesh spanning P processes (``jax.distributed``) the batch is split over every device, so the devices of
process p hold one contiguous block of rows of each global batch (p*B/P .. (p+1)*B/P - 1 on the meshes
``make_mesh`` builds, whose devices come in process order). A process reads, decodes and augments only those
rows (``data.pipeline.train_pipeline(rows=...)``) and hands them to
``jax.make_array_from_process_local_data``, which assembles the global ``(B, ...)`` array on the mesh without
any process ever holding the rest -- as big_vision (``big_vision/utils.py``, ``make_fsarray_from_local_slice``)
and MaxText (``src/MaxText/multihost_dataloading.py``) feed a pod. Batch s still lists the same examples in the same order whatever P,
so the sequence of global batches is the single-process one.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh

from moe_course.parallel.sharding import batch_sharding


def check_process_split(name: str, value: int, group_size: int, processes: int) -> None:
    """Raise ValueError naming ``name`` unless ``value`` (a global batch size) is a multiple of
    ``processes`` x ``group_size``: each process must read whole routing groups of its own images."""
    unit = processes * group_size
    if value % unit:
        raise ValueError(f"{name}={value} does not split over {processes} processes: it must be a multiple of "
                         f"processes x group_size = {processes} x {group_size} = {unit}")


def process_rows(mesh: Mesh, batch_size: int) -> tuple[int, int]:
    """(start, stop): the rows of a global batch of ``batch_size`` that this process's devices hold on ``mesh``
    (``batch_sharding``), read from the sharding itself. One process: (0, batch_size).

    Raises ValueError naming ``mesh`` when this process's rows are not one contiguous block (a mesh whose
    devices are not in process order), since a process then could not read one slice of the batch order.
    """
    index_map = batch_sharding(mesh, 1).addressable_devices_indices_map((batch_size,))
    blocks = sorted({index[0].indices(batch_size)[:2] for index in index_map.values()})
    start, stop = blocks[0][0], blocks[-1][1]
    if sum(b - a for a, b in blocks) != stop - start:
        raise ValueError(f"mesh: the devices of process {jax.process_index()} hold rows {blocks} of the batch, "
                         "not one contiguous block; build the mesh over jax.devices() in their order")
    return start, stop


def assemble_batch(local: dict[str, np.ndarray], mesh: Mesh, batch_size: int) -> dict[str, jax.Array]:
    """This process's rows (``process_rows``) of every field -> the global batch arrays ``(batch_size, ...)``
    laid out by ``batch_sharding`` (``jax.make_array_from_process_local_data``). Every process calls it with
    its own rows of the same step. One process with the whole batch: the same as ``shard_batch``."""
    out = {}
    for name, value in local.items():
        value = np.asarray(value)
        out[name] = jax.make_array_from_process_local_data(batch_sharding(mesh, value.ndim), value,
                                                           (batch_size, *value.shape[1:]))
    return out
