"""The Soft MoE layer (Puigcerver et al., Eq. 1-3): soft router -> slots -> the same Experts as V-MoE -> combine."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from moe_course.checks import check_integers
from moe_course.layers.experts import Experts
from moe_course.layers.moe import MoEOutput
from moe_course.routing import apply_soft_experts, soft_routing


class SoftRoutingRecord(NamedTuple):
    """What one Soft MoE layer did with one batch: enough to draw every slot and every token's mixture.

    dispatch_weights: (batch, tokens, slots) float32, D per image; column j (over tokens) sums to 1 and
    shows which patches slot j averages (the paper's Fig. 10). combine_weights: (batch, tokens, slots)
    float32, C per image; row t (over slots) sums to 1. Slot j belongs to expert j // slots_per_expert.
    """

    dispatch_weights: jax.Array
    combine_weights: jax.Array


class SoftMoE(nnx.Module):
    """Soft MoE(X) = C f(D^T X) per image (Eq. 1-3), with ``num_experts`` experts of ``slots_per_expert`` slots.

    Call: x (batch, tokens, width) -> MoEOutput(output (batch, tokens, width) in x's dtype, aux_loss 0 (Soft MoE
    needs no balancing loss), routing ``SoftRoutingRecord``). One routing group per image, so an image's
    output does not depend on the other images of the batch. The experts are ``moe_course.layers.Experts``
    (the V-MoE expert MLPs); ``expert_dropout`` acts in them during training.
    Parameters: phi (width, num_experts * slots_per_expert), drawn as vmoe's ``mu``: lecun-normal over the shape
    (width, num_experts, slots_per_expert), so fan-in num_experts * width (std 1 / sqrt(num_experts * width)),
    then flattened -- not fan-in width, which would start each column sqrt(num_experts) times longer and, under
    Adam, turn its direction that much slower (SPEC section 4); scale () = 1.
    Precision: the logits, the dispatch softmax (over tokens) and the combine softmax (over slots) are float32
    whatever ``dtype`` says; the slots D^T X, the experts and the output C Y~ run in ``dtype`` (Flax's field;
    ``param_dtype`` for phi, scale and the experts' parameters).
    Raises ValueError naming num_experts, slots_per_expert, width or hidden when one is not a positive
    integer, and naming width when the tokens' width does not match phi -- at construction or tracing,
    before anything is compiled.
    """

    def __init__(self, width: int, hidden: int, num_experts: int, *, slots_per_expert: int = 1,
                 expert_dropout: float = 0.0, gelu: str = "exact", dtype=jnp.float32, param_dtype=jnp.float32,
                 rngs: nnx.Rngs):
        self.num_experts, self.slots_per_expert, self.width, self.hidden = num_experts, slots_per_expert, width, hidden
        check_integers(self, ("num_experts", "slots_per_expert", "width", "hidden"), minimum=1)
        init = nnx.initializers.lecun_normal(in_axis=-2, out_axis=-1)
        mu = init(rngs.params(), (width, num_experts, slots_per_expert), param_dtype)
        self.phi = nnx.Param(mu.reshape(width, num_experts * slots_per_expert))
        self.scale = nnx.Param(jnp.ones((), param_dtype))
        self.dtype = dtype
        self.experts = Experts(num_experts, width, hidden, dropout=expert_dropout, gelu=gelu, dtype=dtype,
                               param_dtype=param_dtype, rngs=rngs)

    def __call__(self, x: jax.Array, *, deterministic: bool = True, rngs: nnx.Rngs | None = None) -> MoEOutput:
        routing = soft_routing(x, self.phi[...], self.scale[...])
        expert_fn = lambda slots: self.experts(slots, deterministic=deterministic, rngs=rngs)
        y = apply_soft_experts(x.astype(self.dtype), routing, expert_fn, self.num_experts)
        record = SoftRoutingRecord(routing.dispatch_weights, routing.combine_weights)
        return MoEOutput(y.astype(x.dtype), jnp.zeros((), jnp.float32), record)
