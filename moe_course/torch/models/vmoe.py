"""PyTorch twin of ``moe_course.models.vmoe``: a ViT whose MLP in ``config.moe_blocks()`` is a sparse MoE layer."""

from __future__ import annotations

import torch

from moe_course.configs.vmoe import VMoEConfig
from moe_course.models.vmoe import sparse_moe_settings
from moe_course.torch.layers.moe import SparseMoE
from moe_course.torch.models.vit import ViT


class VMoE(ViT):
    """The twin of ``moe_course.models.VMoE`` (V-MoE, Riquelme et al. 2021): forward(images NCHW) ->
    ModelOutput with logits, aux_loss (mean or sum over the MoE layers, ``config.aux_loss_reduction``) and one
    RoutingRecord per MoE layer. ``batch`` must be a multiple of ``config.group_size``. Change the routing of a
    trained model with ``with_routing`` (k, capacity_ratio, allocation, ...), as in JAX."""

    def __init__(self, config: VMoEConfig):
        super().__init__(config)

    def reduce_aux_losses(self, losses: list[torch.Tensor]) -> torch.Tensor:
        total = sum(losses)
        return total / len(losses) if self.config.aux_loss_reduction == "mean" else total

    def make_mlp(self, block: int) -> torch.nn.Module | None:
        c = self.config
        if block not in c.moe_blocks():
            return None
        return SparseMoE(c.width, c.mlp_dim, c.num_experts, **sparse_moe_settings(c, block))

    def moe_layers(self) -> list[SparseMoE]:
        """The SparseMoE layers, in block order (``config.moe_blocks()``)."""
        return [block.mlp for block in self.blocks if isinstance(block.mlp, SparseMoE)]
