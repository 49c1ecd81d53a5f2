"""Models built from named configs; every model returns a ModelOutput."""

from __future__ import annotations

from flax import nnx

from moe_course.configs.limoe import LIMoEConfig
from moe_course.configs.mod import MoDConfig
from moe_course.configs.vit import ViTConfig
from moe_course.configs.soft_moe import SoftMoEConfig
from moe_course.configs.vmoe import VMoEConfig
from moe_course.models.limoe import LIMoE, ContrastiveOutput, limoe_param_count, pruned_experts
from moe_course.models.mod import MoDViT, mod_from_vit, mod_param_count
from moe_course.models.output import ModelOutput
from moe_course.models.vit import ViT, count_params, patchify, truncated_vit, vit_param_count
from moe_course.models.soft_moe import SoftMoEViT, soft_moe_param_count
from moe_course.models.upcycling import OptimizerStateMismatch, upcycle, upcycle_optimizer_state
from moe_course.models.vmoe import VMoE, temporary_routing, vmoe_param_count, with_routing

_MODEL_FOR_CONFIG = {ViTConfig: ViT, VMoEConfig: VMoE, SoftMoEConfig: SoftMoEViT, MoDConfig: MoDViT,
                     LIMoEConfig: LIMoE}


def build_model(config, *, rngs: nnx.Rngs) -> nnx.Module:
    """The model a config describes (ViTConfig -> ViT, ...). Raises ValueError for an unknown config type."""
    cls = _MODEL_FOR_CONFIG.get(type(config))
    if cls is None:
        raise ValueError(f"no model for config type {type(config).__name__}; known: {[c.__name__ for c in _MODEL_FOR_CONFIG]}")
    return cls(config, rngs=rngs)


def with_dtype(model: nnx.Module, dtype: str) -> nnx.Module:
    """A copy of ``model`` that computes in ``dtype`` ("float32" or "bfloat16", the config's ``dtype``) and holds
    the same parameters and state (``param_dtype`` unchanged), e.g. a float32 checkpoint evaluated in bfloat16.
    Raises ValueError (from the config's validation) for another dtype."""
    copy = nnx.eval_shape(lambda: build_model(model.config.replace(dtype=dtype), rngs=nnx.Rngs(0)))
    nnx.update(copy, nnx.state(model))
    return copy


__all__ = ["ContrastiveOutput", "LIMoE", "MoDViT", "ModelOutput", "OptimizerStateMismatch", "SoftMoEViT", "VMoE",
           "ViT", "build_model", "count_params", "limoe_param_count", "mod_from_vit", "mod_param_count",
           "patchify", "pruned_experts", "soft_moe_param_count", "temporary_routing", "truncated_vit", "upcycle",
           "upcycle_optimizer_state", "vit_param_count", "vmoe_param_count", "with_dtype", "with_routing"]
