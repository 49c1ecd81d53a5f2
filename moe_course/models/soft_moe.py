"""The Soft MoE ViT (Puigcerver et al.) and its same-backbone sparse baselines, chosen by ``config.router``."""

from __future__ import annotations

from flax import nnx

from moe_course.configs.soft_moe import SoftMoEConfig
from moe_course.layers.soft_moe import SoftMoE
from moe_course.models.vit import count_params, precision
from moe_course.models.vmoe import VMoE


class SoftMoEViT(VMoE):
    """A ViT whose MLP in the blocks ``config.moe_blocks()`` is a Soft MoE layer (router="soft") or V-MoE's
    SparseMoE (router="sparse": Tokens Choice or Experts Choice, by ``config.allocation``).

    Call: images (batch, S, S, C) -> ModelOutput; ``routing`` holds one SoftRoutingRecord per Soft MoE layer
    (or one RoutingRecord per SparseMoE layer), in block order; aux_loss is 0 for the soft router.
    Raises ValueError (from SoftMoEConfig.validate) for an invalid config, before any parameter is made.
    """

    def __init__(self, config: SoftMoEConfig, *, rngs: nnx.Rngs):
        super().__init__(config, rngs=rngs)

    def make_mlp(self, block: int, rngs: nnx.Rngs) -> nnx.Module | None:
        c = self.config
        if c.router == "sparse" or block not in c.moe_blocks():
            return super().make_mlp(block, rngs)
        return SoftMoE(c.width, c.mlp_dim, c.num_experts, slots_per_expert=c.slots_per_expert,
                       expert_dropout=c.expert_dropout, gelu=c.gelu, **precision(c), rngs=rngs)

    def moe_layers(self) -> list:
        """The SoftMoE layers in block order (the SparseMoE layers when ``config.router == "sparse"``)."""
        return [block.mlp for block in self.blocks if isinstance(block.mlp, SoftMoE)] or super().moe_layers()


def soft_moe_param_count(config: SoftMoEConfig) -> int:
    """Parameter count of ``SoftMoEViT(config)`` without allocating it (shapes only, ``nnx.eval_shape``)."""
    return count_params(lambda: SoftMoEViT(config.validate(), rngs=nnx.Rngs(0)))
