"""The Mixture-of-Depths ViT (A-MoD, Gadhikar et al. 2024) and its adaptation from a pretrained dense ViT."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from moe_course.configs.mod import MoDConfig, mod_config_from_vit
from moe_course.layers.mod import MoDBlock
from moe_course.models.output import ModelOutput
from moe_course.models.vit import ViT, count_params, precision


class MoDViT(ViT):
    """A ViT whose blocks ``config.mod_blocks()`` are MoD blocks processing ``round(C * P)`` tokens per image.

    Call: images (batch, S, S, C) -> ModelOutput with logits, aux_loss 0, routing = one ``MoDRecord`` per MoD
    block (block order) and, with ``return_attention``, one full (batch, heads, tokens, tokens) map per block
    (zeros for the tokens an MoD block skipped). The block before an attention-routed MoD block computes its
    maps explicitly (the fused attention path keeps them hidden). The class token, if any, is always processed.
    Parameter names equal the dense ViT's, with an MoD block's encoder block under ``blocks[i].block`` (and the
    standard router under ``blocks[i].router``). Raises ValueError (from MoDConfig.validate) for a bad config.
    """

    def __init__(self, config: MoDConfig, *, rngs: nnx.Rngs):
        super().__init__(config, rngs=rngs)

    def make_block(self, block: int, rngs: nnx.Rngs) -> nnx.Module:
        c = self.config
        if block not in c.mod_blocks():
            return super().make_block(block, rngs)
        return MoDBlock(c.width, c.heads, c.mlp_dim, capacity=c.capacity, router=c.router,
                        keep_first=c.pool == "cls", num_tokens=c.num_tokens, dropout=c.dropout, gelu=c.gelu,
                        **precision(c), rngs=rngs)

    def __call__(self, images: jax.Array, *, deterministic: bool = True, rngs: nnx.Rngs | None = None,
                 return_attention: bool = False) -> ModelOutput:
        c = self.config
        routed_on_maps = {i - 1 for i in c.mod_blocks()} if c.router == "attention" else set()
        x = self.embed(images)
        maps, records, previous = [], [], None
        for i, block in enumerate(self.blocks):
            want_maps = return_attention or i in routed_on_maps
            if isinstance(block, MoDBlock):
                x, weights, record = block(x, previous_attention=previous, deterministic=deterministic, rngs=rngs,
                                           return_attention=want_maps)
                records.append(record)
            else:
                x, weights, _ = block(x, deterministic=deterministic, rngs=rngs, return_attention=want_maps)
            maps.append(weights)
            previous = weights
        logits = self.head(self.pool(self.norm(x)))
        return ModelOutput(logits=logits, aux_loss=jnp.zeros((), jnp.float32),
                           attention=tuple(maps) if return_attention else (), routing=tuple(records))


def mod_from_vit(vit: ViT, *, seed: int = 0, **mod_fields) -> MoDViT:
    """Adapt a (pretrained) dense ViT into a MoD ViT without training (A-MoD Sec. 4, Table 3).

    vit: a dense ``ViT``. mod_fields: capacity, router, mod_placement, mod_last_n (see ``MoDConfig``). Every
    weight of the dense model is copied bit-identical into the MoD model: blocks that become MoD blocks keep
    their attention and MLP; only a standard router is new (``MoDBlock``'s fresh initialisation from ``seed``).
    Raises ValueError when ``vit`` is not a dense ViT or a field is invalid.
    """
    if type(vit) is not ViT:
        raise ValueError(f"init model is a {type(vit).__name__}; MoD adapts a dense ViT (moe_course.models.ViT)")
    config = mod_config_from_vit(vit.config, **mod_fields)
    model = MoDViT(config, rngs=nnx.Rngs(seed))
    dense_state = nnx.state(vit, nnx.Param)
    for i in config.mod_blocks():  # the dense block's parameters move under blocks[i].block
        dense_state["blocks"][i] = {"block": dense_state["blocks"][i]}
        if config.router == "standard":
            dense_state["blocks"][i]["router"] = nnx.state(model.blocks[i].router, nnx.Param)
    nnx.update(model, dense_state)
    return model


def mod_param_count(config: MoDConfig) -> int:
    """Parameter count of ``MoDViT(config)`` without allocating it (shapes only)."""
    return count_params(lambda: MoDViT(config.validate(), rngs=nnx.Rngs(0)))
