"""What the readers of the reference checkpoints share: parameters by '/'-joined name, the ViT parameters
every Flax ViT names alike, filling our model by name with the first misfit named, and resized position
embeddings.

big_vision and vmoe both build their ViTs from ``flax.linen`` modules, so a checkpoint is a nested dict of
arrays whose path is the module names, e.g. ``Transformer/encoderblock_0/MlpBlock_0/Dense_0/kernel``. The
layouts are Flax's, which are ours (``kernel`` (in, out), convolution HWIO, LayerNorm ``scale``), except for
attention: ``flax.linen.MultiHeadDotProductAttention`` keeps the heads as their own axis -- query/key/value
kernels (width, heads, head_dim), biases (heads, head_dim), the output kernel (heads, head_dim, width) -- and
ours flattens them to (width, width) with the heads outer, which is a plain reshape.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Mapping

import jax.numpy as jnp
import numpy as np
import scipy.ndimage
from flax import nnx

from moe_course.models.layouts import KIND_PARAMS, param_at

Plan = list[tuple[str, str, Callable[[np.ndarray], np.ndarray]]]


def flatten(tree: Mapping, prefix: str = "") -> dict[str, np.ndarray]:
    """A nested dict of arrays -> {"a/b/c": array}."""
    flat = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, name + "/"))
        else:
            flat[name] = value
    return flat


def seeded_parameters(shapes: Mapping[str, tuple[int, ...]], seed: int = 0) -> dict[str, np.ndarray]:
    """Random float32 weights that depend only on (seed, name, shape): every array is drawn from its own
    generator, seeded by ``seed`` and the CRC-32 of its name, so two programs that know the names and shapes
    make the same weights without storing them (the paper-size reference fixtures). LayerNorm scales
    (names ending in "scale") are 1 + N(0, 0.05^2); everything else N(0, 0.05^2)."""
    out = {}
    for name, shape in shapes.items():
        rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
        draw = 0.05 * rng.standard_normal(tuple(shape), dtype=np.float32)
        out[name] = draw + np.float32(1) if name.endswith("scale") else draw
    return out


def keep(array: np.ndarray) -> np.ndarray:
    """The layout change of a parameter stored as ours: none."""
    return array


def merge_heads(array: np.ndarray) -> np.ndarray:
    """Flax attention's per-head axes -> ours: a query/key/value kernel (width, heads, head_dim) -> (width,
    width), a bias (heads, head_dim) -> (width,)."""
    return array.reshape(array.shape[0], -1) if array.ndim == 3 else array.reshape(-1)


def merge_out_heads(array: np.ndarray) -> np.ndarray:
    """The attention output kernel (heads, head_dim, width) -> (width, width)."""
    return array.reshape(-1, array.shape[-1])


def attention_plan(ours: str, theirs: str) -> Plan:
    """Our ``MultiHeadAttention`` at ``ours`` from a Flax ``MultiHeadDotProductAttention`` at ``theirs``."""
    plan = []
    for projection in ("query", "key", "value"):
        plan += [(f"{ours}.{projection}.kernel", f"{theirs}/{projection}/kernel", merge_heads),
                 (f"{ours}.{projection}.bias", f"{theirs}/{projection}/bias", merge_heads)]
    return plan + [(f"{ours}.out.kernel", f"{theirs}/out/kernel", merge_out_heads),
                   (f"{ours}.out.bias", f"{theirs}/out/bias", keep)]


def module_plan(ours: str, theirs: str, kind: str) -> Plan:
    """A Dense ("linear": kernel, bias), Conv ("conv": the same) or LayerNorm ("norm": scale, bias) at ``theirs``
    -> ``ours``: flax.linen names and lays out each parameter as we do (``moe_course.models.layouts``)."""
    return [(f"{ours}.{name}", f"{theirs}/{name}", keep) for name, _, _ in KIND_PARAMS[kind]]


def encoder_block_plan(block: int, theirs: str, *, attention: str, mlp: str | None) -> Plan:
    """Block ``block`` of our ViT from a Flax pre-LN encoder block at ``theirs``: LayerNorm_0, the attention
    module named ``attention``, LayerNorm_1, and (unless ``mlp`` is None, e.g. an MoE block the caller maps)
    a dense MLP named ``mlp`` with Dense_0 and Dense_1."""
    ours = f"blocks.{block}"
    plan = (module_plan(f"{ours}.norm1", f"{theirs}/LayerNorm_0", "norm")
            + attention_plan(f"{ours}.attn", f"{theirs}/{attention}")
            + module_plan(f"{ours}.norm2", f"{theirs}/LayerNorm_1", "norm"))
    if mlp is not None:
        plan += (module_plan(f"{ours}.mlp.fc1", f"{theirs}/{mlp}/Dense_0", "linear")
                 + module_plan(f"{ours}.mlp.fc2", f"{theirs}/{mlp}/Dense_1", "linear"))
    return plan


def heads_of(arrays: Mapping[str, np.ndarray], query_kernel: str) -> int:
    """The attention heads a Flax checkpoint was trained with: axis 1 of a query kernel (width, heads, head_dim)."""
    shape = np.shape(arrays[query_kernel])
    if len(shape) != 3:
        raise ValueError(f"{query_kernel!r} has shape {shape}; a Flax attention query kernel is "
                         f"(width, heads, head_dim)")
    return int(shape[1])


def grid_side(tokens: int, what: str) -> int:
    """The side of a square grid of ``tokens`` patches; ValueError naming ``what`` when it is not square."""
    side = math.isqrt(tokens)
    if side * side != tokens:
        raise ValueError(f"{what} holds {tokens} patch positions, not a square grid")
    return side


def resize_position_embeddings(posemb: np.ndarray, patches: int, class_token: bool) -> np.ndarray:
    """Position embeddings (1, n, width) of a reference checkpoint -> ours, (1, patches [+ 1], width).

    n is either a square grid of patches (big_vision today: the class token, if any, has no position
    embedding) or a grid plus one leading class-token entry (the original ViT, vmoe, old big_vision). The
    grid is resized to ``patches`` positions (a square) by bilinear interpolation over the 2-D grid
    (``scipy.ndimage.zoom``, order 1), as big_vision's ``resample_posemb`` does for fine-tuning at another
    resolution; the class-token entry is kept as is. class_token: our model has a class token, whose entry
    comes first -- the checkpoint's, or zeros when it had none (the same sum). Without a class token the
    checkpoint's class entry is dropped. Raises ValueError when neither layout fits n, or ``patches`` is
    not a square.
    """
    posemb = np.asarray(posemb, np.float32)
    n = posemb.shape[1]
    if math.isqrt(n) ** 2 == n:
        head, grid = np.zeros_like(posemb[:, :1]), posemb
    elif math.isqrt(n - 1) ** 2 == n - 1:
        head, grid = posemb[:, :1], posemb[:, 1:]
    else:
        raise ValueError(f"position embeddings of shape {posemb.shape}: {n} is neither a square grid of patches "
                         f"nor one plus a square")
    old, new = grid_side(grid.shape[1], "the checkpoint"), grid_side(patches, "our model")
    if old != new:
        square = grid.reshape(old, old, -1)
        grid = scipy.ndimage.zoom(square, (new / old, new / old, 1), order=1).reshape(1, new * new, -1)
    return np.concatenate([head, grid], axis=1) if class_token else grid


def fill(model: nnx.Module, arrays: Mapping[str, np.ndarray], plan: Plan, *, source: str) -> nnx.Module:
    """Copy ``arrays`` (name -> array) into ``model`` by ``plan`` [(our dotted parameter path, their name,
    layout change)], and return ``model``.

    Every entry is checked before anything is written, in plan order, and the first that does not fit raises
    ValueError naming it: a name the checkpoint lacks (missing), an array whose shape (after the layout
    change) is not our parameter's (shape mismatch), and then the first checkpoint name no entry used
    (unexpected), each with how many more there are. ``source`` names the checkpoint in the message.
    Values are cast to each parameter's dtype.
    """
    values, used = [], set()
    for ours, theirs, convert in plan:
        if theirs not in arrays:
            missing = sum(name not in arrays for _, name, _ in plan)
            raise ValueError(f"{source}: parameter {theirs!r} is missing (our {ours} needs it); "
                             f"{missing} of the {len(plan)} expected parameters are missing")
        array = np.asarray(convert(np.asarray(arrays[theirs])))
        want = tuple(param_at(model, ours).shape)
        if array.shape != want:
            stored = tuple(np.shape(arrays[theirs]))
            changed = f" ({array.shape} in our layout)" if array.shape != stored else ""
            raise ValueError(f"{source}: parameter {theirs!r} has shape {stored}{changed}, but our {ours} needs {want}")
        values.append((ours, array))
        used.add(theirs)
    unexpected = [name for name in arrays if name not in used]
    if unexpected:
        raise ValueError(f"{source}: unexpected parameter {unexpected[0]!r} of shape "
                         f"{tuple(np.shape(arrays[unexpected[0]]))}: our model has no place for it "
                         f"({len(unexpected)} unexpected in all)")
    for ours, array in values:
        param = param_at(model, ours)
        param.set_value(jnp.asarray(array, dtype=param.dtype))
    return model
