"""PyTorch twin of ``moe_course.models.mod``: the Mixture-of-Depths ViT (A-MoD, Gadhikar et al. 2024)."""

from __future__ import annotations

import torch

from moe_course.configs.mod import MoDConfig
from moe_course.models.output import ModelOutput
from moe_course.torch.layers.mod import MoDBlock
from moe_course.torch.models.vit import ViT


class MoDViT(ViT):
    """The twin of ``moe_course.models.MoDViT``: blocks ``config.mod_blocks()`` are MoD blocks processing
    ``round(C * P)`` tokens per image. forward(images NCHW) -> ModelOutput with logits, aux_loss 0, one
    MoDRecord per MoD block and, with ``return_attention``, one full map per block (zeros for skipped
    tokens). The block before an attention-routed MoD block computes its maps explicitly."""

    def __init__(self, config: MoDConfig):
        super().__init__(config)

    def make_block(self, block: int) -> torch.nn.Module:
        c = self.config
        if block not in c.mod_blocks():
            return super().make_block(block)
        return MoDBlock(c.width, c.heads, c.mlp_dim, capacity=c.capacity, router=c.router,
                        keep_first=c.pool == "cls", num_tokens=c.num_tokens, dropout=c.dropout, gelu=c.gelu)

    def forward(self, images: torch.Tensor, *, generator: torch.Generator | None = None,
                return_attention: bool = False) -> ModelOutput:
        """images: (batch, channels, height, width) -> ModelOutput: logits (batch, classes), a zero aux loss,
        attention weights per block (if asked) and one MoDRecord per MoD block."""
        c = self.config
        routed_on_maps = {i - 1 for i in c.mod_blocks()} if c.router == "attention" else set()
        x = self.embed(images)
        maps, records, previous = [], [], None
        for i, block in enumerate(self.blocks):
            want_maps = return_attention or i in routed_on_maps
            if isinstance(block, MoDBlock):
                x, weights, record = block(x, previous_attention=previous, generator=generator,
                                           return_attention=want_maps)
                records.append(record)
            else:
                x, weights, _ = block(x, generator=generator, return_attention=want_maps)
            maps.append(weights)
            previous = weights
        logits = self.final_logits(x)
        return ModelOutput(logits=logits, aux_loss=torch.zeros(()),
                           attention=tuple(maps) if return_attention else (), routing=tuple(records))
