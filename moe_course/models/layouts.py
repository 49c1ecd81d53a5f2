"""The one table of how each kind of layer names and lays out its parameters, for every format the course reads
or writes: ours (Flax NNX), flax.linen checkpoints (big_vision, vmoe: ``moe_course.reference``), and PyTorch (the
twins and transformers' ViT: ``moe_course.torch.convert``, ``moe_course.torch.convert_vit``).

=====================  ==============================================  =====================================
weight                 PyTorch                                         Flax NNX (ours) = flax.linen
=====================  ==============================================  =====================================
convolution            ``weight`` (out, in, p, p)  OIHW                ``kernel`` (p, p, in, out)  HWIO
linear layers          ``weight`` (out, in); ``bias`` (out,)           ``kernel`` (in, out); ``bias`` (out,)
LayerNorm              ``weight`` (width,), ``bias``                   ``scale`` (width,), ``bias``
anything else          the same name and layout (position embeddings, class token, expert kernels
                       (E, in, out), Soft MoE ``phi`` (width, slots) and ``scale`` ())
=====================  ==============================================  =====================================

flax.linen names and lays out these kinds as we do (its attention keeps the heads as an axis of their own: the
reshapes are in ``moe_course.reference.names``). What differs between the formats is where a module sits (its
path: ``blocks.3.mlp.fc1`` here, ``Transformer/encoderblock_3/MlpBlock_0/Dense_0`` in big_vision,
``vit.encoder.layer.3.intermediate.dense`` in transformers); each reader keeps that table of module paths and
takes the parameter names and layouts of each module from here. Needs neither PyTorch nor a checkpoint format.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from flax import nnx

# (our parameter name, PyTorch parameter name, transform) for each kind of module.
KIND_PARAMS = {
    "linear": (("kernel", "weight", "linear"), ("bias", "bias", "plain")),
    "norm": (("scale", "weight", "plain"), ("bias", "bias", "plain")),
    "conv": (("kernel", "weight", "conv"), ("bias", "bias", "plain")),
}
_KIND_OF_MODULE = ((nnx.Linear, "linear"), (nnx.LayerNorm, "norm"), (nnx.Conv, "conv"))


def to_nnx_layout(array: np.ndarray, how: str) -> np.ndarray:
    """A PyTorch-layout array in the NNX layout: "conv" OIHW -> HWIO, "linear" (out, in) -> (in, out), "plain"."""
    if how == "conv":
        return array.transpose(2, 3, 1, 0)
    if how == "linear":
        return array.T
    return array


def to_torch_layout(array: np.ndarray, how: str) -> np.ndarray:
    """An NNX-layout array in PyTorch's layout (the inverse of ``to_nnx_layout``)."""
    if how == "conv":
        return array.transpose(3, 2, 0, 1)
    if how == "linear":
        return array.T
    return array


def torch_layout_shape(shape: tuple[int, ...], how: str) -> tuple[int, ...]:
    """The PyTorch-layout shape of an NNX parameter of ``shape``."""
    return tuple(to_torch_layout(np.empty(shape, dtype=np.int8), how).shape)


def param_at(model: nnx.Module, path: str) -> nnx.Param:
    """The parameter at a dotted path, e.g. "blocks.1.attn.query.kernel" (numbers index lists)."""
    obj: Any = model
    for part in path.split("."):
        obj = obj[int(part)] if part.isdigit() else getattr(obj, part)
    return obj


def parameter_entries(model: nnx.Module) -> list[tuple[str, str, str]]:
    """(NNX parameter path, PyTorch state-dict key, transform) for every parameter of ``model``, in the order
    ``nnx.iter_graph`` visits them. The owning module's kind decides the PyTorch name and layout (see the
    module docstring); parameters of other modules keep their names."""
    modules = {path: node for path, node in nnx.iter_graph(model) if isinstance(node, nnx.Module)}
    entries = []
    for path, node in nnx.iter_graph(model):
        if not isinstance(node, nnx.Param):
            continue
        owner, name = modules[path[:-1]], path[-1]
        prefix = ".".join(map(str, path[:-1]))
        kind = next((kind for cls, kind in _KIND_OF_MODULE if isinstance(owner, cls)), None)
        torch_name, how = name, "plain"
        if kind is not None:
            torch_name, how = next((theirs, how) for ours, theirs, how in KIND_PARAMS[kind] if ours == name)
        entries.append((".".join(map(str, path)), f"{prefix}.{torch_name}" if prefix else torch_name, how))
    return entries
