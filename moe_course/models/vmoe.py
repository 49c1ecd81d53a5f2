"""V-MoE (Riquelme et al. 2021): a ViT whose MLP in the blocks ``config.moe_blocks()`` is a sparse MoE layer."""

from __future__ import annotations

import contextlib
from typing import Iterator

import jax
from flax import nnx

from moe_course.configs.vmoe import VMoEConfig
from moe_course.layers.moe import SparseMoE
from moe_course.models.vit import ViT, count_params, precision

ROUTING_SETTINGS = ("k", "capacity_ratio", "allocation", "priority", "skip_keep_fraction", "dispatch",
                    "combine_weights")


def sparse_moe_settings(config: VMoEConfig, block: int) -> dict:
    """The keyword arguments of the SparseMoE layer of block ``block`` (JAX or its PyTorch twin) from a config."""
    c = config
    return dict(k=c.k, capacity_ratio=c.capacity_ratio, group_size=c.group_size, allocation=c.allocation,
                priority=c.priority, skip_keep_fraction=c.skip_keep_fraction, router_order=c.router_order,
                noise_std=c.noise_std, expert_dropout=c.expert_dropout, aux_loss_weight=c.aux_loss_weight,
                capacity_rounding=c.capacity_rounding,
                capacity_multiple_of=c.capacity_multiple_of, combine_weights=c.combine_weights, dispatch=c.dispatch,
                check_finite=c.check_finite,
                layer_name=f"block {block} MoE", gelu=c.gelu)


class VMoE(ViT):
    """Call: images (batch, S, S, C) -> ModelOutput with logits, aux_loss (mean, or with
    ``config.aux_loss_reduction="sum"`` the sum as google-research/vmoe does, over the MoE layers of
    weight * L_aux; App. A.2) and routing (one RoutingRecord per MoE layer, in block order). ``batch`` must be
    a multiple of ``config.group_size``. Raises ValueError (from VMoEConfig.validate) for an invalid config.
    """

    def __init__(self, config: VMoEConfig, *, rngs: nnx.Rngs):
        super().__init__(config, rngs=rngs)

    def reduce_aux_losses(self, losses: list[jax.Array]) -> jax.Array:
        total = sum(losses)
        return total / len(losses) if self.config.aux_loss_reduction == "mean" else total

    def make_mlp(self, block: int, rngs: nnx.Rngs) -> nnx.Module | None:
        c = self.config
        if block not in c.moe_blocks():
            return None
        return SparseMoE(c.width, c.mlp_dim, c.num_experts, **sparse_moe_settings(c, block), **precision(c),
                         rngs=rngs)

    def moe_layers(self) -> list[SparseMoE]:
        """The SparseMoE layers, in block order (``config.moe_blocks()``)."""
        return [block.mlp for block in self.blocks if isinstance(block.mlp, SparseMoE)]


def with_routing(model: VMoE, **settings) -> VMoE:
    """Change the routing of every MoE layer of a (trained) V-MoE in place and return it (V-MoE Sec. 4, App. E.4).

    settings: any of k, capacity_ratio, allocation, priority, skip_keep_fraction, dispatch, combine_weights. The
    model's config is updated too, and validated first: an unknown setting or a bad value raises ValueError and
    changes nothing. The next call re-traces with the new routing; the weights are untouched.
    """
    unknown = sorted(set(settings) - set(ROUTING_SETTINGS))
    if unknown:
        raise ValueError(f"routing setting(s) {unknown} cannot be changed; allowed: {', '.join(ROUTING_SETTINGS)}")
    model.config = model.config.replace(**settings)
    for layer in model.moe_layers():
        for name, value in settings.items():
            setattr(layer, name, value)
    return model


@contextlib.contextmanager
def temporary_routing(model: VMoE, **settings) -> Iterator[VMoE]:
    """``with temporary_routing(model, capacity_ratio=0.5): ...`` -- ``with_routing`` for the block only.

    The settings the model had before are restored when the block ends, also after an error. Raises ValueError
    as ``with_routing`` does, before anything is changed.
    """
    previous = {name: getattr(model.config, name, None) for name in settings}
    with_routing(model, **settings)
    try:
        yield model
    finally:
        with_routing(model, **previous)


def vmoe_param_count(config: VMoEConfig) -> int:
    """Parameter count of ``VMoE(config)`` without allocating it."""
    return count_params(lambda: VMoE(config.validate(), rngs=nnx.Rngs(0)))
