"""PyTorch twin of ``moe_course.layers.soft_moe``: the Soft MoE layer (Puigcerver et al., Eq. 1-3)."""

from __future__ import annotations

import torch

from moe_course.checks import check_integers
from moe_course.layers.moe import MoEOutput
from moe_course.layers.soft_moe import SoftRoutingRecord
from moe_course.torch.layers.experts import Experts
from moe_course.torch.layers.init import lecun_normal_
from moe_course.torch.precision import float32_region
from moe_course.torch.routing import apply_soft_experts, soft_routing

__all__ = ["SoftMoE", "SoftRoutingRecord"]


class SoftMoE(torch.nn.Module):
    """Soft MoE(X) = C f(D^T X) per image (Eq. 1-3): the twin of ``moe_course.layers.SoftMoE``.

    forward: x (batch, tokens, width) -> MoEOutput(output (batch, tokens, width), aux_loss 0,
    ``SoftRoutingRecord`` of D and C). Parameters: phi (width, num_experts * slots_per_expert), LeCun-normal
    with fan-in num_experts * width as vmoe's ``mu`` (see the JAX original); scale () = 1; experts as ``Experts``. Raises ValueError naming num_experts, slots_per_expert, width or
    hidden when one is not a positive integer.
    """

    def __init__(self, width: int, hidden: int, num_experts: int, *, slots_per_expert: int = 1,
                 expert_dropout: float = 0.0, gelu: str = "exact"):
        super().__init__()
        self.num_experts, self.slots_per_expert, self.width, self.hidden = num_experts, slots_per_expert, width, hidden
        check_integers(self, ("num_experts", "slots_per_expert", "width", "hidden"), minimum=1)
        self.phi = torch.nn.Parameter(lecun_normal_(torch.empty(width, num_experts * slots_per_expert),
                                                       num_experts * width))
        self.scale = torch.nn.Parameter(torch.ones(()))
        self.experts = Experts(num_experts, width, hidden, dropout=expert_dropout, gelu=gelu)

    def forward(self, x: torch.Tensor, *, generator: torch.Generator | None = None) -> MoEOutput:
        """x: (batch, tokens, width) -> MoEOutput (output of x's shape, zero aux loss, SoftRoutingRecord);
        Soft MoE Eq. 1-3 per image."""
        with float32_region(x):  # logits, dispatch and combine softmaxes in float32 under autocast
            routing = soft_routing(x, self.phi, self.scale)
        y = apply_soft_experts(x, routing, self.experts, self.num_experts)
        record = SoftRoutingRecord(routing.dispatch_weights, routing.combine_weights)
        return MoEOutput(y.to(x.dtype), x.new_zeros((), dtype=torch.float32), record)
