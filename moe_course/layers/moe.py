"""The sparse MoE layer of V-MoE: router -> capacity allocation -> dispatch -> experts -> combine."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax.experimental import checkify

from moe_course.layers.experts import Experts
from moe_course.routing import (
    allocate,
    apply_experts,
    auxiliary_losses,
    expert_capacity,
    importance_loss,
    experts_choice_allocation,
    nonfinite_tokens,
    experts_choice_as_allocation,
    router_probabilities,
    top_k_routing,
)


class RoutingRecord(NamedTuple):
    """What one MoE layer did with one batch (for the analyses of V-MoE Sec. 4 and App. E).

    expert_index: (groups, tokens, k) int32 chosen experts, TOP-1 first (k = E for experts choice).
    gates: (groups, tokens, k) float32 router weights of those choices. served: (groups, tokens, k) bool,
    False where the expert's buffer was full (the choice was dropped). priority_rank: (groups, tokens) int32
    processing order of the tokens (0 first), or None for experts choice. expert_fill: (groups, experts)
    int32 used buffer slots. capacity: slots per expert and group. Tokens of a group are the ``group_size``
    images' tokens laid out image after image: token t of a group is patch t % P of image t // P.
    """

    expert_index: jax.Array
    gates: jax.Array
    served: jax.Array
    priority_rank: jax.Array | None
    expert_fill: jax.Array
    capacity: int


class MoEOutput(NamedTuple):
    """output: (batch, tokens, width). aux_loss: scalar, weight * L_aux (0 for experts choice). routing: record.
    aux_terms: the unweighted parts of the aux loss by name, where the layer reports them (LIMoE), else {}."""

    output: jax.Array
    aux_loss: jax.Array
    routing: RoutingRecord
    aux_terms: dict = {}


class SparseMoE(nnx.Module):
    """MoE(x) = sum over the token's served choices i of g(x)_i e_i(x) (V-MoE Sec. 2.1-2.4, App. A.2, App. C).

    Call: x (batch, tokens, width) float32 -> MoEOutput. ``batch`` must be a multiple of ``group_size``
    (images per routing group); tokens compete for each expert's ``capacity`` slots only within their group.
    token_mask: (batch, tokens) bool or None. False tokens (padding) take no expert buffer slot, come out
    as 0 (the residual carries them on) and count in no aux loss; the capacity is still computed from all
    token positions (it must be static). Not available with experts choice.
    modality: (batch, tokens) int or None, passed to ``aux_loss`` (the multimodal layer needs it).
    Training (``deterministic=False`` with ``rngs``) adds router noise N(0, noise_std^2) and expert dropout;
    evaluation is deterministic. The routing settings (k, capacity_ratio, allocation, priority,
    skip_keep_fraction, dispatch) are plain attributes: change them on a trained layer (Sec. 3.1, App. E.4),
    or use ``moe_course.models.with_routing`` for a whole model.
    Experts choice (Zhou et al. 2022) gives every expert the same B_e = round(k*N*C/E) slots, so on average
    a token is processed by k*C experts, the compute of token choice at the same k and C.
    Raises ValueError for a batch that is not a multiple of group_size.

    Non-finite values are never hidden: a token whose features or router logits hold a NaN or inf comes out
    all NaN, under every allocation and both dispatch implementations; it takes no expert buffer slot, so
    every other token's output stays finite; the aux loss becomes NaN. (Without this, BPR ranked such a
    token last, dropped it and returned a finite 0; see ``moe_course.routing.router``.)
    check_finite=True (debug): ``jax.experimental.checkify`` checks that every token is finite and fails with
    a JaxRuntimeError (a ValueError) naming ``layer_name``, the routing group, the token in the group and
    the image in the batch. It raises when the layer runs eagerly; under ``jax.jit`` the function must be
    wrapped in ``checkify.checkify`` (the course's train and eval steps do that when the model config has
    ``check_finite=True``), or jit refuses to trace the check.
    """

    def __init__(self, width: int, hidden: int, num_experts: int, *, k: int = 2, capacity_ratio: float = 1.05,
                 group_size: int = 8, allocation: str = "vanilla", priority: str = "max",
                 skip_keep_fraction: float = 1.0, router_order: str = "softmax_then_topk",
                 noise_std: float | None = None, expert_dropout: float = 0.0, aux_loss_weight: float = 0.01,
                 capacity_rounding: str = "round", dispatch: str = "gather", check_finite: bool = False,
                 layer_name: str = "MoE layer", rngs: nnx.Rngs):
        self.num_experts = num_experts
        self.k, self.capacity_ratio, self.group_size = k, capacity_ratio, group_size
        self.allocation, self.priority, self.skip_keep_fraction = allocation, priority, skip_keep_fraction
        self.router_order, self.noise_std, self.aux_loss_weight = router_order, noise_std, aux_loss_weight
        self.capacity_rounding, self.dispatch = capacity_rounding, dispatch
        self.check_finite, self.layer_name = check_finite, layer_name
        self.router = nnx.Linear(width, num_experts, use_bias=False, rngs=rngs)
        self.experts = Experts(num_experts, width, hidden, dropout=expert_dropout, rngs=rngs)

    def __call__(self, x: jax.Array, *, deterministic: bool = True, rngs: nnx.Rngs | None = None,
                 token_mask: jax.Array | None = None, modality: jax.Array | None = None) -> MoEOutput:
        batch, tokens, width = x.shape
        if batch % self.group_size:
            raise ValueError(f"batch={batch} is not a multiple of group_size={self.group_size}; use a batch size "
                             f"divisible by {self.group_size} (images per routing group)")
        for name, value in (("token_mask", token_mask), ("modality", modality)):
            if value is not None and tuple(value.shape) != (batch, tokens):
                raise ValueError(f"{name} has shape {tuple(value.shape)}; it must be (batch, tokens) = {(batch, tokens)}")
        if token_mask is not None and self.allocation == "experts_choice":
            raise ValueError("token_mask is not supported with allocation='experts_choice'; use a token-choice "
                             "allocation ('vanilla', 'bpr', 'skip_patch')")
        groups = x.reshape(batch // self.group_size, self.group_size * tokens, width)
        as_groups = lambda a: None if a is None else a.reshape(groups.shape[:2])
        logits = self.router(groups).astype(jnp.float32)  # (G, N, E)
        bad = nonfinite_tokens(groups) | nonfinite_tokens(logits)  # (G, N)
        if self.check_finite:
            self._check(bad, tokens)
        key = rngs() if (not deterministic and rngs is not None) else None
        capacity = expert_capacity(self.k, groups.shape[1], self.capacity_ratio, self.num_experts,
                                   rounding=self.capacity_rounding)
        terms = {}
        if self.allocation == "experts_choice":
            probs = router_probabilities(logits, key, noise_std=self.noise_std)
            routed = experts_choice_as_allocation(experts_choice_allocation(probs, capacity), groups.shape[1])
            aux = jnp.zeros((), jnp.float32)
        else:
            router = top_k_routing(logits, self.k, key, noise_std=self.noise_std, order=self.router_order)
            keep = self.skip_keep_fraction if self.allocation == "skip_patch" else None
            routed = allocate(router.expert_index, router.gates, capacity, self.num_experts,
                              method=self.allocation, score=self.priority, keep_fraction=keep,
                              token_mask=as_groups(token_mask))
            aux, terms = self.aux_loss(logits, router.noisy_logits, as_groups(token_mask), as_groups(modality))
        expert_fn = lambda buffers: self.experts(buffers, deterministic=deterministic, rngs=rngs)
        y = jnp.where(bad[..., None], jnp.nan, apply_experts(groups, routed, expert_fn, implementation=self.dispatch))
        record = RoutingRecord(routed.expert_index, routed.gates, routed.served, routed.priority_rank,
                               routed.expert_fill, capacity)
        return MoEOutput(y.reshape(batch, tokens, -1).astype(x.dtype), aux, record, terms)

    def aux_loss(self, logits: jax.Array, noisy_logits: jax.Array, token_mask: jax.Array | None,
                 modality: jax.Array | None) -> tuple[jax.Array, dict]:
        """(weight * L_aux, {}) of V-MoE (App. A.2) over the kept tokens; arrays in routing groups (G, N[, E]).
        Without router noise the load loss is undefined, so it is importance only. Subclasses (LIMoE) override."""
        if self.noise_std == 0:
            return self.aux_loss_weight * importance_loss(logits, token_mask), {}
        losses = auxiliary_losses(logits, noisy_logits, self.k, noise_std=self.noise_std, mask=token_mask)
        return self.aux_loss_weight * losses.total, {}

    def _check(self, bad: jax.Array, tokens: int) -> None:
        group = jnp.argmax(jnp.any(bad, axis=1))
        token = jnp.argmax(bad[group])
        checkify.check(
            ~jnp.any(bad),
            f"{self.layer_name}: non-finite (NaN or inf) features or router logits in routing group {{group}} "
            f"(token {{token}} of the group, image {{image}} of the batch); the layer input is already non-finite",
            group=group, token=token, image=(group * self.group_size * tokens + token) // tokens,
        )
