"""The twin a config describes: ``build_model(config)`` (ViTConfig -> ViT, VMoEConfig -> VMoE, ...)."""

from __future__ import annotations

import torch

from moe_course.configs.mod import MoDConfig
from moe_course.configs.soft_moe import SoftMoEConfig
from moe_course.configs.vit import ViTConfig
from moe_course.configs.vmoe import VMoEConfig
from moe_course.torch.models.mod import MoDViT
from moe_course.torch.models.soft_moe import SoftMoEViT
from moe_course.torch.models.vit import ViT
from moe_course.torch.models.vmoe import VMoE

_MODEL_FOR_CONFIG = {ViTConfig: ViT, VMoEConfig: VMoE, SoftMoEConfig: SoftMoEViT, MoDConfig: MoDViT}


def build_model(config) -> torch.nn.Module:
    """The PyTorch model a config describes (ViTConfig -> ViT, ...). Raises ValueError for an unknown config type."""
    cls = _MODEL_FOR_CONFIG.get(type(config))
    if cls is None:
        raise ValueError(f"no model for config type {type(config).__name__}; known: "
                         f"{[c.__name__ for c in _MODEL_FOR_CONFIG]}")
    return cls(config)
