"""Sparse upcycling for the PyTorch twins: a twin dense ViT -> its twin V-MoE, equal to ``moe_course.models.upcycle``.

The parameter surgery is written once, in the JAX original (``moe_course.models.upcycling``); the twin goes through
``convert.from_torch`` / ``to_torch``, so the two frameworks give the same parameters, the router included (drawn
from the same seed).
"""

from __future__ import annotations

import torch

from moe_course.configs.vmoe import VMoEConfig
from moe_course.models.upcycling import upcycle as upcycle_nnx


def upcycle(dense: torch.nn.Module, config: VMoEConfig, *, seed: int = 0) -> torch.nn.Module:
    """The twin V-MoE of ``config`` upcycled from the twin dense ViT ``dense`` (``moe_course.torch.models.ViT``):
    each expert of an MoE block a copy of that block's MLP, the router of ``moe_course.models.upcycle(...,
    seed=seed)``, every other weight copied; float32, CPU, eval mode. Raises ValueError as the JAX ``upcycle``
    does (a twin that is not a dense ViT, a config that does not fit), before any parameter is made."""
    from moe_course.torch.convert import from_torch, to_torch
    from moe_course.torch.models.vit import ViT

    if type(dense) is not ViT:
        raise ValueError(f"model is a {type(dense).__name__}; upcycling starts from a dense ViT twin "
                         f"(moe_course.torch.models.ViT)")
    return to_torch(upcycle_nnx(from_torch(dense), config, seed=seed))
