"""PyTorch twins of ``moe_course.models``, built from the same named configs (``moe_course.configs``)."""

from __future__ import annotations

# with_routing / temporary_routing only set config fields and layer attributes: the JAX functions serve both.
from moe_course.models.vmoe import temporary_routing, with_routing
from moe_course.torch.models.build import build_model
from moe_course.torch.models.mod import MoDViT
from moe_course.torch.models.soft_moe import SoftMoEViT
from moe_course.torch.models.upcycling import upcycle
from moe_course.torch.models.vit import ViT
from moe_course.torch.models.vmoe import VMoE

__all__ = ["MoDViT", "SoftMoEViT", "VMoE", "ViT", "build_model", "temporary_routing", "upcycle", "with_routing"]
