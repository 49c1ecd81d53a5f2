"""Named configurations for every model family; ``get_preset`` is the one way to look one up."""

from __future__ import annotations

import dataclasses

from moe_course.configs.limoe import LIMOE_PRESETS, LIMoEConfig
from moe_course.configs.mod import MOD_PRESETS, MoDConfig
from moe_course.configs.soft_moe import SOFT_MOE_PRESETS, SoftMoEConfig
from moe_course.configs.vit import VIT_PRESETS, ViTConfig
from moe_course.configs.vmoe import VMOE_PRESETS, VMoEConfig

PRESETS = {"vit": VIT_PRESETS, "vmoe": VMOE_PRESETS, "soft-moe": SOFT_MOE_PRESETS, "mod": MOD_PRESETS,
           "limoe": LIMOE_PRESETS}
CONFIG_TYPES = {"vit": ViTConfig, "vmoe": VMoEConfig, "soft-moe": SoftMoEConfig, "mod": MoDConfig,
                "limoe": LIMoEConfig}


def config_to_dict(config) -> dict:
    """A model config as a JSON-ready dict with its family, e.g. {"family": "vit", "width": 64, ...}."""
    family = next((f for f, t in CONFIG_TYPES.items() if type(config) is t), None)
    if family is None:
        raise ValueError(f"no model family for config type {type(config).__name__}")
    return {"family": family, **dataclasses.asdict(config)}


def config_from_dict(record: dict):
    """Inverse of ``config_to_dict``; raises ValueError for an unknown family or field."""
    record = dict(record)
    family = record.pop("family", None)
    if family not in CONFIG_TYPES:
        raise ValueError(f"family={family!r} is not allowed; use one of {', '.join(CONFIG_TYPES)}")
    cls = CONFIG_TYPES[family]
    fields = {f.name: f.type for f in dataclasses.fields(cls)}
    unknown = sorted(set(record) - set(fields))
    if unknown:
        raise ValueError(f"unknown {cls.__name__} field(s) {unknown}")
    record = {k: tuple(v) if isinstance(v, list) else v for k, v in record.items()}
    return cls(**record).validate()


def get_preset(family: str, name: str):
    """The preset ``name`` of model ``family`` (case-insensitive). Raises ValueError listing the allowed names."""
    if family not in PRESETS:
        raise ValueError(f"model={family!r} is not allowed; use one of {', '.join(PRESETS)}")
    presets = PRESETS[family]
    key = name.lower()
    if key not in presets:
        raise ValueError(f"preset={name!r} is not a {family} preset; allowed: {', '.join(presets)}")
    return presets[key]


__all__ = ["CONFIG_TYPES", "LIMOE_PRESETS", "LIMoEConfig", "MOD_PRESETS", "MoDConfig", "PRESETS", "SOFT_MOE_PRESETS", "SoftMoEConfig", "VIT_PRESETS",
           "VMOE_PRESETS", "VMoEConfig", "ViTConfig", "config_from_dict", "config_to_dict", "get_preset"]
