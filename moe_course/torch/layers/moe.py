"""PyTorch twin of ``moe_course.layers.moe``: V-MoE's sparse MoE layer, router -> capacity allocation ->
dispatch -> experts -> combine, built from the twin routing functions."""

from __future__ import annotations

import torch

from moe_course.layers.moe import (MoEOutput, RoutingRecord, check_group_size, nonfinite_message, route,
                                   vmoe_aux_loss)
from moe_course.torch import routing
from moe_course.torch.layers.experts import Experts
from moe_course.torch.layers.init import linear
from moe_course.torch.precision import float32_region
from moe_course.torch.routing import apply_experts, nonfinite_tokens

__all__ = ["MoEOutput", "RoutingRecord", "SparseMoE"]


class SparseMoE(torch.nn.Module):
    """MoE(x) = sum over the token's served choices i of g(x)_i e_i(x) (V-MoE Sec. 2.1-2.4, App. A.2, App. C).

    The twin of ``moe_course.layers.SparseMoE``: the same constructor arguments (without ``rngs``), the same
    routing settings as plain attributes (change k, capacity_ratio, allocation, ... on a trained layer), the
    same ``MoEOutput`` (torch tensors; ``RoutingRecord`` as in JAX) and the same non-finite behaviour.
    forward: x (batch, tokens, width) -> MoEOutput; ``batch`` must be a multiple of ``group_size``.
    In training mode (``module.train()``) the router adds noise N(0, noise_std^2): ``noise`` (groups,
    group_size * tokens, experts) is the standard-normal draw itself (feed the JAX layer's draw to compare),
    else it is drawn from ``generator`` (torch's global generator when None); expert dropout acts too. In
    eval mode the layer is deterministic. Like every ``torch.nn.Module`` a new layer starts in training
    mode: call ``.eval()`` to compare with the JAX layer's default ``deterministic=True``. Parameters: router.weight (E, width) = the JAX router kernel
    transposed; experts as ``Experts``. check_finite=True raises ValueError naming the layer, routing group,
    token and image of the first non-finite token. Raises ValueError for a batch not a multiple of group_size.
    Under ``torch.autocast`` the router logits, the allocation and the aux loss stay float32
    (``moe_course.torch.precision``); dispatch, experts and combine run in the autocast dtype.
    """

    def __init__(self, width: int, hidden: int, num_experts: int, *, k: int = 2, capacity_ratio: float = 1.05,
                 group_size: int = 8, allocation: str = "vanilla", priority: str = "max",
                 skip_keep_fraction: float = 1.0, router_order: str = "softmax_then_topk",
                 noise_std: float | None = None, expert_dropout: float = 0.0, aux_loss_weight: float = 0.01,
                 capacity_rounding: str = "round", dispatch: str = "gather", check_finite: bool = False,
                 layer_name: str = "MoE layer", gelu: str = "exact", capacity_multiple_of: int | None = None,
                 combine_weights: str = "probabilities"):
        super().__init__()
        self.num_experts = num_experts
        self.k, self.capacity_ratio, self.group_size = k, capacity_ratio, group_size
        self.allocation, self.priority, self.skip_keep_fraction = allocation, priority, skip_keep_fraction
        self.router_order, self.noise_std, self.aux_loss_weight = router_order, noise_std, aux_loss_weight
        self.capacity_rounding, self.dispatch = capacity_rounding, dispatch
        self.capacity_multiple_of, self.combine_weights = capacity_multiple_of, combine_weights
        self.check_finite, self.layer_name = check_finite, layer_name
        self.router = linear(width, num_experts, bias=False)
        self.experts = Experts(num_experts, width, hidden, dropout=expert_dropout, gelu=gelu)

    def forward(self, x: torch.Tensor, *, generator: torch.Generator | None = None,
                noise: torch.Tensor | None = None) -> MoEOutput:
        """x: (batch, tokens, width) -> MoEOutput (output of x's shape, aux loss, routing record), routed in
        groups of ``group_size`` images (V-MoE Sec. 2). ``noise``: the router's standard-normal draw
        (groups, group tokens, experts), else drawn from ``generator`` in ``.train()`` mode."""
        batch, tokens, width = x.shape
        check_group_size(batch, self.group_size)
        groups = x.reshape(batch // self.group_size, self.group_size * tokens, width)
        with float32_region(x):
            logits = torch.nn.functional.linear(groups.float(), self.router.weight.float())  # (G, N, E)
        bad = nonfinite_tokens(groups) | nonfinite_tokens(logits)
        if self.check_finite and bool(bad.any()):
            group = int(bad.any(dim=1).int().argmax())
            token = int(bad[group].int().argmax())
            image = (group * self.group_size * tokens + token) // tokens
            raise ValueError(nonfinite_message(self.layer_name).format(group=group, token=token, image=image))
        if self.training and noise is None:
            noise = torch.randn(logits.shape, generator=generator, device=logits.device)
        with float32_region(x):
            routed, noisy_logits = route(routing, self, logits, noise=noise if self.training else None)
            aux = logits.new_zeros(()) if noisy_logits is None else vmoe_aux_loss(routing, self, logits, noisy_logits)
        y = torch.where(bad[..., None], torch.nan, apply_experts(groups, routed, self.experts,
                                                                 implementation=self.dispatch))
        return MoEOutput(y.reshape(batch, tokens, -1).to(x.dtype), aux, RoutingRecord.of(routed))
