"""Argument checks shared by the routing functions: every error names the argument, its value and what is allowed.

These run on Python values and array shapes only, so they also work under ``jax.jit`` (where the values of
traced arrays are unknown) and fail before anything is compiled. The array checks also accept torch tensors
(recognised by their dtype, without importing torch), so the PyTorch twins in ``moe_course.torch.routing``
raise the same errors with the same messages.
"""

from __future__ import annotations

import math
import numbers

import jax.numpy as jnp


def check_int(name: str, value, *, minimum: int = 1, maximum: int | None = None) -> int:
    """Return ``value`` if it is a Python/NumPy integer (not a bool) in [minimum, maximum], else raise ValueError."""
    ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if ok and value >= minimum and (maximum is None or value <= maximum):
        return int(value)
    allowed = f"an integer >= {minimum}" if maximum is None else f"an integer in [{minimum}, {maximum}]"
    raise ValueError(f"{name}={value!r} is not allowed; use {allowed}")


def check_positive(name: str, value, *, allow_zero: bool = False) -> float:
    """Return float(value) if it is a finite real number > 0 (>= 0 with ``allow_zero``), else raise ValueError."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if ok and (value > 0 or (allow_zero and value == 0)):
        return float(value)
    allowed = "a finite number >= 0" if allow_zero else "a finite number > 0"
    raise ValueError(f"{name}={value!r} is not allowed; use {allowed}")


def check_choice(name: str, value, allowed: tuple[str, ...]) -> str:
    """Return ``value`` if it is one of ``allowed``, else raise ValueError listing them."""
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not allowed; use one of {', '.join(map(repr, allowed))}")
    return value


def check_ndim(name: str, array, ndim: int, layout: str) -> None:
    """Raise ValueError unless ``array`` has ``ndim`` axes; ``layout`` names them, e.g. "(groups, tokens, experts)"."""
    if jnp.ndim(array) != ndim:
        raise ValueError(f"{name} has shape {tuple(jnp.shape(array))}; it must have {ndim} axes {layout}")


def _torch_dtype(array):
    """The dtype of a torch tensor (a ``torch.dtype`` has ``is_floating_point``), else None."""
    dtype = getattr(array, "dtype", None)
    return dtype if hasattr(dtype, "is_floating_point") else None


def _dtype_name(array) -> str:
    dtype = _torch_dtype(array)
    return str(dtype).removeprefix("torch.") if dtype is not None else str(jnp.result_type(array))


def check_floating(name: str, array) -> None:
    """Raise ValueError unless ``array`` (a JAX/NumPy array or a torch tensor) has a floating dtype."""
    dtype = _torch_dtype(array)
    floating = dtype.is_floating_point if dtype is not None else jnp.issubdtype(jnp.result_type(array), jnp.floating)
    if not floating:
        raise ValueError(f"{name} has dtype {_dtype_name(array)}; use a floating dtype (e.g. float32)")


def check_integer_array(name: str, array) -> None:
    """Raise ValueError unless ``array`` (a JAX/NumPy array or a torch tensor) has an integer dtype."""
    dtype = _torch_dtype(array)
    if dtype is not None:
        integer = not (dtype.is_floating_point or dtype.is_complex) and _dtype_name(array) != "bool"
    else:
        integer = jnp.issubdtype(jnp.result_type(array), jnp.integer)
    if not integer:
        raise ValueError(f"{name} has dtype {_dtype_name(array)}; use an integer dtype (e.g. int32)")
