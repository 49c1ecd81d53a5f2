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


def assert_same_grad(jax_grad, torch_grad, *, name: str = "") -> None:
    """Gradients equal within GRAD_ATOL + GRAD_RTOL * |gradient|."""
    assert torch_grad is not None, f"{name}: no PyTorch gradient"
    assert_same(jax_grad, torch_grad, atol=GRAD_ATOL, rtol=GRAD_RTOL, name=name)
