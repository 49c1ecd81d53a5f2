"""Helpers shared by the JAX/PyTorch equality tests: conversions and the tolerances the issue fixes."""

from __future__ import annotations

import numpy as np

OUT_ATOL = 1e-5  # routing decisions exact; outputs and aux losses to 1e-5 (float32)
GRAD_ATOL = 1e-4  # gradients to 1e-4 ...
# ... plus 8 float32 ulps relative: a few gradient entries are large (through a near-zero token the L2
# normalisation's 1/|x| reaches ~400, where one ulp is already 3e-5).
GRAD_RTOL = 1e-6


def to_torch(array, dtype=None):
    """A JAX/NumPy array as a torch tensor (a copy, float32 unless the array is integer or bool)."""
    import torch

    array = np.array(array)
    tensor = torch.from_numpy(array)
    return tensor.to(dtype) if dtype is not None else tensor


def to_numpy(value) -> np.ndarray:
    """A torch tensor (detached) or a JAX array as a NumPy array."""
    if hasattr(value, "detach"):
        return value.detach().cpu().numpy()
    return np.asarray(value)


def assert_same(jax_value, torch_value, *, atol: float = OUT_ATOL, rtol: float = 0.0, exact: bool = False,
                name: str = "") -> None:
    """Equal shapes and values: bit-equal with ``exact`` (indices, decisions), else within ``atol + rtol * |x|``
    (NaNs must sit in the same places)."""
    a, b = to_numpy(jax_value), to_numpy(torch_value)
    assert a.shape == b.shape, f"{name}: shapes {a.shape} (JAX) and {b.shape} (PyTorch) differ"
    if exact:
        np.testing.assert_array_equal(a, b, err_msg=name)
    else:
        np.testing.assert_allclose(a, b, atol=atol, rtol=rtol, equal_nan=True, err_msg=name)


def assert_same_error(call, jax_module, torch_module) -> None:
    """``call(module, to_array)`` raises ValueError with the same message for the JAX module (arrays from
    ``jnp.asarray``) and its PyTorch twin (arrays from ``to_torch``)."""
    import jax.numpy as jnp
    import pytest

    with pytest.raises(ValueError) as ours:
        call(jax_module, jnp.asarray)
    with pytest.raises(ValueError) as twin:
        call(torch_module, to_torch)
    assert str(twin.value) == str(ours.value)


def assert_same_grad(jax_grad, torch_grad, *, name: str = "") -> None:
    """Gradients equal within GRAD_ATOL + GRAD_RTOL * |gradient|."""
    assert torch_grad is not None, f"{name}: no PyTorch gradient"
    assert_same(jax_grad, torch_grad, atol=GRAD_ATOL, rtol=GRAD_RTOL, name=name)


def randomize_nnx(module, seed: int = 0) -> None:
    """Every parameter of an NNX module random (no zero head, no unit LayerNorm scale), in place: matrices
    ~ N(0, 1/fan_in), vectors and scalars 1 + 0.2 N(0, 1) for LayerNorm scales and the Soft MoE scale,
    0.1 N(0, 1) otherwise; position embeddings and class token 0.5 N(0, 1)."""
    import jax.numpy as jnp
    from flax import nnx

    from moe_course.torch.convert import param_at, parameter_entries

    rng = np.random.default_rng(seed)
    for ours, _, _ in parameter_entries(module):
        param = param_at(module, ours)
        shape = tuple(param.shape)
        if "pos_embed" in ours or "cls_token" in ours:
            value = 0.5 * rng.normal(size=shape)
        elif len(shape) >= 2:
            value = rng.normal(size=shape) / np.sqrt(shape[-2] if "experts" in ours or "phi" in ours
                                                     else np.prod(shape[:-1]))
        elif ours.endswith("scale"):
            value = 1 + 0.2 * rng.normal(size=shape)
        else:
            value = 0.1 * rng.normal(size=shape)
        param.set_value(jnp.asarray(value, jnp.float32))
    assert isinstance(module, nnx.Module)


def assert_param_grads(jax_module, jax_grads, torch_module) -> None:
    """The gradient of every parameter equal in both frameworks (the JAX one mapped to PyTorch's layout)."""
    from flax import nnx

    from moe_course.torch.convert import param_at, parameter_entries, to_torch_layout

    holder = nnx.clone(jax_module)
    nnx.update(holder, jax_grads)
    torch_params = dict(torch_module.named_parameters())
    for ours, theirs, how in parameter_entries(jax_module):
        assert_same_grad(to_torch_layout(np.asarray(param_at(holder, ours)[...]), how), torch_params[theirs].grad,
                         name=f"d/d{theirs}")
