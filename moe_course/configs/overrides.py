"""``--set SECTION.FIELD=VALUE``: any field of a run's model config or train config from the command line.

A setting names its section (``model``: the preset's ViTConfig / VMoEConfig / ... ; ``train``: TrainConfig), a
field of that dataclass and a value written as the field's type reads it: ``int`` and ``float`` as numbers,
``bool`` as true / false, ``str`` as it stands, ``none`` for an optional field, a tuple as comma-separated items
(``train.randaugment=2,10``; for a LIMoE run ``model.text_aux_losses=`` is the empty tuple). The typed changes go through the
config's own ``replace``, so a value the config does not allow is refused with the config's own message. As
big_vision's ``--config file.py:arg`` overrides and MaxText's ``key=value`` do, every field is reachable without
editing Python.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing

SECTIONS = ("model", "train")
_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")


def parse_settings(items: list[str] | None) -> dict[str, dict[str, str]]:
    """``{"model": {field: text}, "train": {field: text}}`` from ``--set`` items (syntax only; the values are typed
    by ``typed_changes``). Raises ValueError naming the item: no "=", an unknown section, an empty field, or a
    field given twice."""
    settings: dict[str, dict[str, str]] = {section: {} for section in SECTIONS}
    for item in items or []:
        key, equals, text = item.partition("=")
        section, dot, field = key.strip().partition(".")
        if not equals or not dot or not field:
            raise ValueError(f"--set {item!r} is not allowed; write SECTION.FIELD=VALUE, e.g. "
                             f"model.num_experts=32 or train.learning_rate=1e-3")
        if section not in SECTIONS:
            raise ValueError(f"--set {item!r}: section {section!r} is not allowed; use one of {list(SECTIONS)}")
        if field in settings[section]:
            raise ValueError(f"--set {section}.{field} is given twice ({settings[section][field]!r} and {text!r})")
        settings[section][field] = text
    return settings


def typed_changes(config_type: type, texts: dict[str, str], section: str) -> dict:
    """The ``replace`` keywords of ``texts`` ({field: text}) for the dataclass ``config_type``, each text read as
    its field's annotated type. Raises ValueError naming ``--set SECTION.FIELD``, the text and what the field
    takes, or the fields ``config_type`` has when one is unknown."""
    hints = _hints(config_type)
    changes = {}
    for field, text in texts.items():
        if field not in hints:
            raise ValueError(f"--set {section}.{field}: {config_type.__name__} has no field {field!r}; its fields: "
                             f"{', '.join(sorted(hints))}")
        try:
            changes[field] = _read(text.strip(), hints[field])
        except ValueError as err:
            raise ValueError(f"--set {section}.{field}={text!r} is not allowed: {err}") from None
    return changes


@functools.cache
def _hints(config_type: type) -> dict[str, object]:
    names = {f.name for f in dataclasses.fields(config_type)}
    return {name: hint for name, hint in typing.get_type_hints(config_type).items() if name in names}


def _read(text: str, hint):
    """``text`` as the type ``hint`` (bool, int, float, str, X | None, tuple[X, ...], tuple[X, Y])."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if type(None) in options and text.lower() == "none":
            return None
        (inner,) = [option for option in options if option is not type(None)]
        return _read(text, inner)
    if typing.get_origin(hint) is tuple:
        items = [part.strip() for part in text.split(",")] if text else []
        args = typing.get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_read(part, args[0]) for part in items)
        if len(items) != len(args):
            raise ValueError(f"the field takes {len(args)} comma-separated values ({', '.join(a.__name__ for a in args)})")
        return tuple(_read(part, arg) for part, arg in zip(items, args))
    if hint is bool:
        if text.lower() in _TRUE + _FALSE:
            return text.lower() in _TRUE
        raise ValueError("the field takes true or false")
    if hint is int:
        try:
            return int(text)
        except ValueError:
            raise ValueError("the field takes an integer") from None
    if hint is float:
        try:
            return float(text)
        except ValueError:
            raise ValueError("the field takes a number") from None
    if hint is str:
        return text
    raise ValueError(f"a field of type {hint} cannot be set from the command line")
