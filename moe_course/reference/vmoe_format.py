"""Read google-research/vmoe's own checkpoint format (``vmoe/checkpoints/partitioned.py``) without vmoe.

A vmoe checkpoint is a prefix with an index file ``PREFIX.index`` and data shards
``PREFIX.data-00000-of-0000N``, all msgpack (the ``msgpack`` package flax uses). The index holds
``{"version", "shard_count", "index"}``, where "index" is the saved tree (nested dicts) with one record per
array: its global shape and dtype, the global slices it was cut into and the shard holding each. A shard
holds, for each array it stores a piece of -- numbered by the array's position in the tree's flattening,
dict keys sorted, as ``jax.tree_util.tree_flatten`` orders them -- the pieces' data (flat, possibly in
several sub-chunks) and their global slices. vmoe encodes its own types as msgpack extension types: 1 an
ndarray ``(shape, dtype name, bytes)``, 4 a shape record ``(shape, dtype name, weak_type, {})``, 5 a slice
``(start, stop, step)``, 6 an n-d slice (a tuple of packed slices), 8 an index record
``(packed shape record, packed n-d slices, shard numbers)``. Both index versions (vmoe's "V1" of 2022-06-22
and the older one without a version) lay the tree out this way.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import ml_dtypes
import msgpack
import numpy as np

_NDARRAY, _SHAPED, _SLICE, _SLICE_ND, _INDEX = 1, 4, 5, 6, 8
_CHUNKS_KEY = "__msgpack_array_chunk_a87ca2__"  # vmoe marks the dict of array pieces in a shard with it


def _dtype(name: bytes | str) -> np.dtype:
    name = name.decode() if isinstance(name, bytes) else name
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def _slice_nd(data: bytes) -> tuple[slice, ...]:
    return tuple(slice(*msgpack.unpackb(part, raw=True)) for part in msgpack.unpackb(data, raw=True))


def _ext(code: int, data: bytes):
    if code == _NDARRAY:
        shape, dtype, buffer = msgpack.unpackb(data, raw=True)
        return np.frombuffer(buffer, dtype=_dtype(dtype)).reshape(shape)
    if code == _SLICE:
        return slice(*msgpack.unpackb(data, raw=True))
    if code == _SLICE_ND:
        return _slice_nd(data)
    if code == _SHAPED:
        shape, dtype, _, _ = msgpack.unpackb(data, raw=True)
        return tuple(shape), _dtype(dtype)
    if code == _INDEX:
        shaped, slices, shards = msgpack.unpackb(data, raw=True)
        return {"shape_dtype": _ext(_SHAPED, shaped), "slices": [_slice_nd(s) for s in slices],
                "shards": list(shards)}
    raise ValueError(f"msgpack extension type {code} is not one vmoe writes into checkpoints")


def _unpack(path: str) -> dict:
    with open(path, "rb") as f:
        data = f.read()
    try:
        return msgpack.unpackb(data, ext_hook=_ext, raw=False, strict_map_key=False)
    except (ValueError, TypeError, msgpack.exceptions.UnpackException) as err:  # truncated or foreign bytes
        raise ValueError(f"{path}: not a vmoe checkpoint file ({type(err).__name__}: {err})") from err


def _sorted_leaves(tree: Mapping, prefix: str = "") -> list[tuple[str, dict]]:
    """(name, index record) in jax.tree_util's order: dict keys sorted at every level."""
    leaves = []
    for key in sorted(tree):
        value, name = tree[key], f"{prefix}{key}"
        is_record = isinstance(value, Mapping) and "shape_dtype" in value
        leaves += [(name, value)] if is_record else _sorted_leaves(value, name + "/")
    return leaves


def read_vmoe_checkpoint(prefix: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every array of the vmoe checkpoint at ``prefix`` (the path without ``.index``) by its '/'-joined name
    in the saved tree (e.g. ``params/Encoder/encoderblock_1/Moe/Mlp/Dense_0/kernel`` when a whole training
    state was saved), as NumPy arrays of the stored dtype (bfloat16 through ``ml_dtypes``).

    Raises FileNotFoundError naming the index or a shard that is not there, and ValueError naming the file when
    it is not msgpack (truncated, or another format) or when an array's pieces do not cover it (a shard of
    another checkpoint).
    """
    prefix = os.fspath(prefix)
    if not os.path.exists(prefix + ".index"):
        raise FileNotFoundError(f"{prefix}.index: no vmoe checkpoint index there (pass the prefix, without "
                                f"'.index' or '.data-...')")
    index = _unpack(prefix + ".index")
    leaves = _sorted_leaves(index["index"])
    arrays = [np.zeros(record["shape_dtype"][0], record["shape_dtype"][1]) for _, record in leaves]
    filled = [0] * len(leaves)
    count = index["shard_count"]
    for shard in sorted({s for _, record in leaves for s in record["shards"]}):
        path = f"{prefix}.data-{shard:05d}-of-{count:05d}"
        if not os.path.exists(path):
            raise FileNotFoundError(f"{path}: a data shard of the checkpoint is missing")
        for key, pieces in _unpack(path).items():
            if key == _CHUNKS_KEY:
                continue
            leaf = int(key)
            for subchunks, where in pieces:
                shape = tuple(s.stop - s.start for s in where)
                arrays[leaf][where] = np.concatenate([np.ravel(c) for c in subchunks]).reshape(shape)
                filled[leaf] += int(np.prod(shape))
    for (name, _), array, count_filled in zip(leaves, arrays, filled):
        if count_filled != array.size:
            raise ValueError(f"{prefix}: array {name!r} of shape {array.shape} got {count_filled} of its "
                             f"{array.size} values from the shards")
    return {name: array for (name, _), array in zip(leaves, arrays)}
