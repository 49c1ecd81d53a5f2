"""The sparse MoE layer of V-MoE: router -> capacity allocation -> dispatch -> experts -> combine."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx
from jax.experimental import checkify

from moe_course.layers.experts import Experts
from moe_course import routing
from moe_course.routing import apply_experts, nonfinite_tokens
from moe_course.routing.losses import IMPORTANCE_SHARE


def check_group_size(batch: int, group_size: int) -> None:
    """Raise ValueError unless ``batch`` is a multiple of ``group_size`` (images per routing group)."""
    if batch % group_size:
        raise ValueError(f"batch={batch} is not a multiple of group_size={group_size}; use a batch size "
                         f"divisible by {group_size} (images per routing group)")


def nonfinite_message(layer_name: str) -> str:
    """The error of ``check_finite`` for ``layer_name``, with ``{group}``, ``{token}``, ``{image}`` left to fill."""
    return (f"{layer_name}: non-finite (NaN or inf) features or router logits in routing group {{group}} "
            f"(token {{token}} of the group, image {{image}} of the batch); the layer input is already non-finite")


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

    @classmethod
    def of(cls, allocation) -> "RoutingRecord":
        """The record of an ``Allocation`` (JAX or its PyTorch twin)."""
        return cls(allocation.expert_index, allocation.gates, allocation.served, allocation.priority_rank,
                   allocation.expert_fill, allocation.capacity)


class MoEOutput(NamedTuple):
    """output: (batch, tokens, width). aux_loss: scalar, weight * L_aux (0 for experts choice). routing: record.
    aux_terms: the unweighted parts of the aux loss by name, where the layer reports them (LIMoE), else {}."""

    output: jax.Array
    aux_loss: jax.Array
    routing: RoutingRecord
    aux_terms: dict = {}


def route(routing, layer, logits, token_mask=None, **noise):
    """The routing step of a sparse MoE layer, written once for both frameworks: router -> capacity ->
    allocation (V-MoE Sec. 2.3-2.4, App. C).

    routing: the module of routing functions, ``moe_course.routing`` or its twin ``moe_course.torch.routing``
    (same names and arguments). layer: a ``SparseMoE`` of either framework (its routing settings are read).
    logits: (groups, tokens, experts) float32 router logits. token_mask: (groups, tokens) bool or None; False
    tokens (padding) take no buffer slot. noise: that framework's noise argument (JAX ``key=``, PyTorch
    ``noise=``); empty or None for no noise. Returns (allocation, the noisy logits the top-k saw, or None for
    experts choice, which has no balancing loss). Raises ValueError for a token mask with experts choice.
    """
    num_tokens = logits.shape[1]
    capacity = routing.expert_capacity(layer.k, num_tokens, layer.capacity_ratio, layer.num_experts,
                                       rounding=layer.capacity_rounding, multiple_of=layer.capacity_multiple_of)
    if layer.allocation == "experts_choice":
        if token_mask is not None:
            raise ValueError("token_mask is not supported with allocation='experts_choice'; use a token-choice "
                             "allocation ('vanilla', 'bpr', 'skip_patch')")
        probs = routing.router_probabilities(logits, noise_std=layer.noise_std, **noise)
        choice = routing.experts_choice_allocation(probs, capacity, combine_weights=layer.combine_weights)
        return routing.experts_choice_as_allocation(choice, num_tokens), None
    keep = getattr(layer, "expert_keep", None)  # pruned experts (LIMoE App. E.4), set by models.pruned_experts
    if keep is None:
        router = routing.top_k_routing(logits, layer.k, noise_std=layer.noise_std, order=layer.router_order, **noise)
    else:
        router = routing.pruned_top_k_routing(logits, layer.k, keep, mode=layer.pruning_mode,
                                              noise_std=layer.noise_std, **noise)
    keep = layer.skip_keep_fraction if layer.allocation == "skip_patch" else None
    masked = {} if token_mask is None else {"token_mask": token_mask}
    routed = routing.allocate(router.expert_index, router.gates, capacity, layer.num_experts,
                              method=layer.allocation, score=layer.priority, keep_fraction=keep, **masked)
    return routed, router.noisy_logits


def vmoe_aux_loss(routing, layer, logits, noisy_logits, token_mask=None):
    """weight * L_aux of V-MoE (App. A.2) over the kept tokens, for either framework (see ``route``).
    Without router noise (noise_std=0) the load loss is undefined, so it is the importance term alone at its share
    of Eq. 7: weight * 0.5 * L_imp, as google-research/vmoe computes it (vmoe/nn/routing.py, the
    ``deterministic or noise_std == 0.0`` branch of ``NoisyTopExpertsPerItemRouter``, with its weights 0.005 =
    0.01 x 0.5; tests/test_reference_aux_loss.py)."""
    masked = {} if token_mask is None else {"mask": token_mask}
    if layer.noise_std == 0:
        return layer.aux_loss_weight * IMPORTANCE_SHARE * routing.importance_loss(logits, **masked)
    losses = routing.auxiliary_losses(logits, noisy_logits, layer.k, noise_std=layer.noise_std, **masked)
    return layer.aux_loss_weight * losses.total


class SparseMoE(nnx.Module):
    """MoE(x) = sum over the token's served choices i of g(x)_i e_i(x) (V-MoE Sec. 2.1-2.4, App. A.2, App. C).

    Call: x (batch, tokens, width) -> MoEOutput, output in x's dtype. ``batch`` must be a multiple of ``group_size``
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
    a token is processed by k*C experts, the compute of token choice at the same k and C. combine_weights
    (Expert Choice only): "probabilities" (the router's) or "token_normalized" (each token's divided by their
    sum, as sparse upcycling does for vision; ``routing.token_normalized_weights``).
    Raises ValueError for a batch that is not a multiple of group_size.
    Precision: dtype / param_dtype are the experts' computation and parameter dtypes (Flax's fields). The
    router always computes its logits in float32 (its kernel cast up), and the softmax, top-k, priorities,
    allocation and aux losses follow in float32, as vmoe's routers do; dispatch, the experts and the
    gate-weighted combine run in ``dtype`` (the float32 gates cast to it at the combine product).
    Expert parallelism: ``moe_course.parallel.use_mesh`` sets ``mesh`` and hands the layer ``expert_apply``, the
    function that runs the experts split over the mesh's ``expert`` axis with all-to-all
    (``moe_course.parallel.expert_parallel``); outputs and routing equal the one-device layer's. The layer
    itself knows nothing of meshes: with ``expert_apply`` None the experts run on one device.

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
                 layer_name: str = "MoE layer", gelu: str = "exact", capacity_multiple_of: int | None = None,
                 combine_weights: str = "probabilities", dtype=jnp.float32, param_dtype=jnp.float32, rngs: nnx.Rngs):
        self.num_experts = num_experts
        self.k, self.capacity_ratio, self.group_size = k, capacity_ratio, group_size
        self.allocation, self.priority, self.skip_keep_fraction = allocation, priority, skip_keep_fraction
        self.router_order, self.noise_std, self.aux_loss_weight = router_order, noise_std, aux_loss_weight
        self.capacity_rounding, self.dispatch = capacity_rounding, dispatch
        self.capacity_multiple_of, self.combine_weights = capacity_multiple_of, combine_weights
        self.check_finite, self.layer_name = check_finite, layer_name
        self.mesh = None  # the jax.sharding.Mesh that parallel.use_mesh put the layer on, or None
        # expert_apply(groups, routed, layer, deterministic=, rngs=) -> outputs, or None for one device;
        # set by moe_course.parallel.use_mesh (the layer never imports the parallel package)
        self.expert_apply = None
        self.router = nnx.Linear(width, num_experts, use_bias=False, dtype=jnp.float32, param_dtype=param_dtype,
                                 rngs=rngs)
        self.experts = Experts(num_experts, width, hidden, dropout=expert_dropout, gelu=gelu, dtype=dtype,
                               param_dtype=param_dtype, rngs=rngs)

    def __call__(self, x: jax.Array, *, deterministic: bool = True, rngs: nnx.Rngs | None = None,
                 token_mask: jax.Array | None = None, modality: jax.Array | None = None) -> MoEOutput:
        batch, tokens, width = x.shape
        check_group_size(batch, self.group_size)
        for name, value in (("token_mask", token_mask), ("modality", modality)):
            if value is not None and tuple(value.shape) != (batch, tokens):
                raise ValueError(f"{name} has shape {tuple(value.shape)}; it must be (batch, tokens) = {(batch, tokens)}")
        groups = x.reshape(batch // self.group_size, self.group_size * tokens, width)
        as_groups = lambda a: None if a is None else a.reshape(groups.shape[:2])
        logits = self.router(groups).astype(jnp.float32)  # (G, N, E)
        bad = nonfinite_tokens(groups) | nonfinite_tokens(logits)  # (G, N)
        if self.check_finite:
            self._check(bad, tokens)
        key = rngs() if (not deterministic and rngs is not None) else None
        mask = as_groups(token_mask)
        routed, noisy_logits = route(routing, self, logits, token_mask=mask, key=key)
        if noisy_logits is None:
            aux, terms = jnp.zeros((), jnp.float32), {}
        else:
            aux, terms = self.aux_loss(logits, noisy_logits, mask, as_groups(modality))
        y = jnp.where(bad[..., None], jnp.nan, self._apply_experts(groups, routed, deterministic, rngs))
        return MoEOutput(y.reshape(batch, tokens, -1).astype(x.dtype), aux, RoutingRecord.of(routed), terms)

    def aux_loss(self, logits: jax.Array, noisy_logits: jax.Array, token_mask: jax.Array | None,
                 modality: jax.Array | None) -> tuple[jax.Array, dict]:
        """(weight * L_aux, {}) of V-MoE (App. A.2) over the kept tokens; arrays in routing groups (G, N[, E]).
        Subclasses (LIMoE) override it and name their parts in the dict."""
        return vmoe_aux_loss(routing, self, logits, noisy_logits, token_mask), {}

    def _apply_experts(self, groups: jax.Array, routed, deterministic: bool, rngs: nnx.Rngs | None) -> jax.Array:
        if self.expert_apply is not None:  # experts on several devices
            return self.expert_apply(groups, routed, self, deterministic=deterministic, rngs=rngs)
        expert_fn = lambda buffers: self.experts(buffers, deterministic=deterministic, rngs=rngs)
        return apply_experts(groups, routed, expert_fn, implementation=self.dispatch)

    def _check(self, bad: jax.Array, tokens: int) -> None:
        group = jnp.argmax(jnp.any(bad, axis=1))
        token = jnp.argmax(bad[group])
        checkify.check(
            ~jnp.any(bad), nonfinite_message(self.layer_name),
            group=group, token=token, image=(group * self.group_size * tokens + token) // tokens,
        )
