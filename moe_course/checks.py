"""Shared validation for the frozen config dataclasses: every error names the field, its value and what is allowed."""

from __future__ import annotations

import dataclasses
from typing import Iterable, TypeVar

Config = TypeVar("Config")


def replace_validated(config: Config, changes: dict) -> Config:
    """``dataclasses.replace(config, **changes).validate()``; an unknown field raises ValueError listing the known ones."""
    allowed = {f.name for f in dataclasses.fields(config)}
    unknown = sorted(set(changes) - allowed)
    if unknown:
        raise ValueError(f"unknown {type(config).__name__} field(s) {unknown}; allowed: {sorted(allowed)}")
    return dataclasses.replace(config, **changes).validate()


def check_integers(config, fields: Iterable[str], *, minimum: int) -> None:
    """Raise ValueError unless each named field is an int (not a bool) >= ``minimum``."""
    allowed = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
    for field in fields:
        value = getattr(config, field)
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise ValueError(f"{field}={value!r} is not allowed; use {allowed}")
