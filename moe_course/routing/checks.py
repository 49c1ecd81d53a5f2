"""Argument checks shared by the routing functions: every error names the argument, its value and what is allowed.

These run on Python values and array shapes only, so they also work under ``jax.jit`` (where the values of
traced arrays are unknown) and fail before anything is compiled.
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
        raise ValueError(f"{name} has shape {jnp.shape(array)}; it must have {ndim} axes {layout}")


def check_floating(name: str, array) -> None:
    """Raise ValueError unless ``array`` has a floating dtype."""
    if not jnp.issubdtype(jnp.result_type(array), jnp.floating):
        raise ValueError(f"{name} has dtype {jnp.result_type(array)}; use a floating dtype (e.g. float32)")


def check_integer_array(name: str, array) -> None:
    """Raise ValueError unless ``array`` has an integer dtype."""
    if not jnp.issubdtype(jnp.result_type(array), jnp.integer):
        raise ValueError(f"{name} has dtype {jnp.result_type(array)}; use an integer dtype (e.g. int32)")
