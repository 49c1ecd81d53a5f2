"""Weights between the Flax NNX models and PyTorch state dicts, both ways.

The names and layouts of each kind of layer are ``moe_course.models.layouts``' table (PyTorch ``weight`` (out, in)
against our ``kernel`` (in, out), OIHW against HWIO, LayerNorm ``weight`` against ``scale``).

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
from moe_course.models.layouts import (
    KIND_PARAMS,
    param_at,
    parameter_entries,
    to_nnx_layout,
    to_torch_layout,
    torch_layout_shape,
)

if TYPE_CHECKING:  # pragma: no cover
    import torch


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
    from moe_course.torch.models.build import build_model

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
