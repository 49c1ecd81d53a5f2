"""Weights between the Flax NNX models and PyTorch: the one place that knows how each kind of layer lays out
its parameters in either framework.

=====================  ==============================================  =====================================
weight                 PyTorch                                         Flax NNX (ours)
=====================  ==============================================  =====================================
convolution            ``weight`` (out, in, p, p)  OIHW                ``kernel`` (p, p, in, out)  HWIO
linear layers          ``weight`` (out, in); ``bias`` (out,)           ``kernel`` (in, out); ``bias`` (out,)
LayerNorm              ``weight`` (width,), ``bias``                   ``scale`` (width,), ``bias``
anything else          the same name and layout (position embeddings, class token, expert kernels
                       (E, in, out), Soft MoE ``phi`` (width, slots) and ``scale`` ())
=====================  ==============================================  =====================================

Two users: ``convert_vit`` (Hugging Face transformers' ViT, whose module names differ and are mapped there),
and the course's own PyTorch twins (``moe_course.torch.models``), whose modules carry exactly the NNX names
-- ``blocks.3.mlp.experts.fc1_kernel``, ``blocks.1.attn.query.weight`` -- so every model family (ViT, V-MoE,
Soft MoE ViT, MoD ViT) converts by walking the NNX parameter tree, with no per-family table: the kind of
layer that owns a parameter (``nnx.Linear``, ``nnx.LayerNorm``, ``nnx.Conv``, or another module) decides its
PyTorch name and layout.

Typical use::

    twin = to_torch(model)        # a trained NNX model -> the equal torch.nn.Module (eval mode)
    back = from_torch(twin)       # and back, e.g. after fine-tuning in PyTorch
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import jax
import numpy as np
from flax import nnx

from moe_course.models import build_model as build_nnx_model

if TYPE_CHECKING:  # pragma: no cover
    import torch

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


def as_numpy(key: str, value: Any) -> np.ndarray:
    """A torch tensor (any device, any float dtype incl. bfloat16) or array-like -> float32 NumPy array.
    Raises ValueError naming ``key`` for a tensor on torch's meta device (it holds no data)."""
    if hasattr(value, "detach"):  # torch.Tensor, without importing torch
        if getattr(value, "is_meta", False):
            raise ValueError(f"state_dict[{key!r}] is on torch's meta device and holds no data")
        value = value.detach().cpu()
        if value.is_floating_point():
            value = value.float()
        value = value.numpy()
    return np.asarray(value, dtype=np.float32)


def format_keys(keys: list[str], limit: int = 20) -> str:
    """At most ``limit`` keys, quoted, then how many more."""
    shown = ", ".join(repr(k) for k in keys[:limit])
    return shown + (f", ... ({len(keys) - limit} more)" if len(keys) > limit else "")


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


def torch_state_dict(model: nnx.Module) -> dict[str, "torch.Tensor"]:
    """The state dict of the PyTorch twin of ``model`` (``moe_course.torch.models``): CPU float32 tensors in
    PyTorch's layouts, copies not sharing memory with ``model``. Needs torch."""
    import torch

    return {theirs: torch.from_numpy(np.ascontiguousarray(to_torch_layout(np.array(param_at(model, ours)[...]), how)))
            for ours, theirs, how in parameter_entries(model)}


def load_torch_state_dict(model: nnx.Module, state_dict: Mapping[str, "torch.Tensor | np.ndarray"]) -> None:
    """Copy a PyTorch twin's state dict (``twin.state_dict()``) into the NNX ``model`` in place.

    Values: torch tensors or NumPy arrays in PyTorch's layouts, cast to each parameter's dtype. Raises
    ValueError, before changing anything, listing missing and unexpected keys, and naming every key whose
    shape differs from what ``model`` needs (expected and found shape, in PyTorch's layout).
    """
    entries = parameter_entries(model)
    expected = {theirs for _, theirs, _ in entries}
    missing = [theirs for _, theirs, _ in entries if theirs not in state_dict]
    unexpected = [k for k in state_dict if k not in expected]
    name = getattr(getattr(model, "config", None), "name", type(model).__name__)
    if missing or unexpected:
        problems = ([f"missing keys: {format_keys(missing)}"] if missing else []) + (
            [f"unexpected keys: {format_keys(unexpected)}"] if unexpected else [])
        raise ValueError(f"state dict does not match {type(model).__name__} {name!r}: " + "; ".join(problems))
    arrays, mismatched = [], []
    for ours, theirs, how in entries:
        param = param_at(model, ours)
        want, array = torch_layout_shape(tuple(param.shape), how), as_numpy(theirs, state_dict[theirs])
        if tuple(array.shape) != want:
            mismatched.append(f"{theirs!r}: expected shape {want}, found {tuple(array.shape)}")
        else:
            arrays.append((param, to_nnx_layout(array, how)))
    if mismatched:
        raise ValueError(f"shape mismatch between the state dict and {type(model).__name__} {name!r}: "
                         + "; ".join(mismatched))
    for param, array in arrays:
        param.set_value(jax.numpy.asarray(array, dtype=param.dtype))


def to_torch(model: nnx.Module) -> "torch.nn.Module":
    """The PyTorch twin of an NNX model (ViT, VMoE, SoftMoEViT or MoDViT), built from ``model.config`` (routing
    settings included) with every weight copied; float32, CPU, eval mode. Raises ValueError for a model
    without a known config. Needs torch."""
    from moe_course.torch.models import build_model

    twin = build_model(model.config)
    twin.load_state_dict(torch_state_dict(model), strict=True)
    return twin.eval()


def from_torch(twin: "torch.nn.Module") -> nnx.Module:
    """The NNX model equal to a PyTorch twin (the inverse of ``to_torch``): built abstractly from
    ``twin.config`` (no initialisation compute) and filled from ``twin.state_dict()``. Raises ValueError as
    ``load_torch_state_dict``."""
    model = nnx.eval_shape(lambda: build_nnx_model(twin.config, rngs=nnx.Rngs(0)))
    load_torch_state_dict(model, twin.state_dict())
    return model


__all__ = ["KIND_PARAMS", "as_numpy", "format_keys", "from_torch", "load_torch_state_dict", "param_at",
           "parameter_entries", "to_nnx_layout", "to_torch", "to_torch_layout", "torch_layout_shape",
           "torch_state_dict"]
