"""Shared validation for the frozen config dataclasses: every error names the field, its value and what is allowed."""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Iterable, TypeVar

Config = TypeVar("Config")


def replace_validated(config: Config, changes: dict) -> Config:
    """``dataclasses.replace(config, **changes).validate()``; an unknown field raises ValueError listing the known ones."""
    allowed = {f.name for f in dataclasses.fields(config)}
    unknown = sorted(set(changes) - allowed)
    if unknown:
        raise ValueError(f"unknown {type(config).__name__} field(s) {unknown}; allowed: {sorted(allowed)}")
    return dataclasses.replace(config, **changes).validate()


def check_integers(config, fields: Iterable[str], *, minimum: int, optional: bool = False) -> None:
    """Raise ValueError unless each named field is an int (not a bool) >= ``minimum`` (or None with ``optional``)."""
    allowed = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
    for field in fields:
        value = getattr(config, field)
        if optional and value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise ValueError(f"{field}={value!r} is not allowed; use {allowed}{' or None' if optional else ''}")


def check_number(config, field: str, *, minimum: float | None = None, maximum: float | None = None,
                 above_minimum: bool = False, below_maximum: bool = False, optional: bool = False) -> None:
    """Raise ValueError unless the field is a finite real number (not a bool) in the given range.

    ``above_minimum`` / ``below_maximum`` make that bound strict; ``optional`` also allows None. NaN and
    infinities are always refused (they would pass comparisons such as ``value >= 0`` silently or not at all).
    """
    value = getattr(config, field)
    if optional and value is None:
        return
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (minimum is None or (value > minimum if above_minimum else value >= minimum))
    ok = ok and (maximum is None or (value < maximum if below_maximum else value <= maximum))
    if not ok:
        bounds = []
        if minimum is not None:
            bounds.append(f"{'>' if above_minimum else '>='} {minimum}")
        if maximum is not None:
            bounds.append(f"{'<' if below_maximum else '<='} {maximum}")
        allowed = "a finite number" + (f" {' and '.join(bounds)}" if bounds else "")
        raise ValueError(f"{field}={value!r} is not allowed; use {allowed}{' or None' if optional else ''}")


def check_choices(config) -> None:
    """Raise ValueError unless every field named in the config's ``CHOICES`` {field: allowed values} holds one of them."""
    for field, allowed in type(config).CHOICES.items():
        value = getattr(config, field)
        if not isinstance(value, str) or value not in allowed:
            raise ValueError(f"{field}={value!r} is not allowed; use one of {', '.join(map(repr, allowed))}")


def check_text(config, field: str) -> None:
    """Raise ValueError unless the field is a non-empty string (a free-text field such as a config's name)."""
    value = getattr(config, field)
    if not isinstance(value, str) or not value:
        raise ValueError(f"{field}={value!r} is not allowed; use a non-empty string")


def check_flag(config, field: str) -> None:
    """Raise ValueError unless the field is a bool (True or False, not 0/1 or a string)."""
    value = getattr(config, field)
    if not isinstance(value, bool):
        raise ValueError(f"{field}={value!r} is not allowed; use True or False")
