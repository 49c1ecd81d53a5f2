"""PyTorch twin of ``moe_course.models.soft_moe``: the Soft MoE ViT and its same-backbone sparse baselines."""

from __future__ import annotations

import torch

from moe_course.configs.soft_moe import SoftMoEConfig
from moe_course.torch.layers.soft_moe import SoftMoE
from moe_course.torch.models.vmoe import VMoE


class SoftMoEViT(VMoE):
    """The twin of ``moe_course.models.SoftMoEViT``: the MLP in ``config.moe_blocks()`` is a Soft MoE layer
    (router="soft") or V-MoE's SparseMoE (router="sparse"). forward(images NCHW) -> ModelOutput with one
    SoftRoutingRecord (or RoutingRecord) per MoE layer; aux_loss 0 for the soft router."""

    def __init__(self, config: SoftMoEConfig):
        super().__init__(config)

    def make_mlp(self, block: int) -> torch.nn.Module | None:
        c = self.config
        if c.router == "sparse" or block not in c.moe_blocks():
            return super().make_mlp(block)
        return SoftMoE(c.width, c.mlp_dim, c.num_experts, slots_per_expert=c.slots_per_expert,
                       expert_dropout=c.expert_dropout, gelu=c.gelu)

    def moe_layers(self) -> list:
        """The SoftMoE layers in block order (the SparseMoE layers when ``config.router == "sparse"``)."""
        return [block.mlp for block in self.blocks if isinstance(block.mlp, SoftMoE)] or super().moe_layers()
