"""PyTorch twins of ``moe_course.routing``: the same function names, arguments, results and errors.

Pure functions on torch tensors, one module per JAX module (router, capacity, allocation, dispatch, losses,
soft, mod, and LIMoE's entropy, modality_losses, pruning). The capacity arithmetic works on Python numbers only, so it is the JAX package's own
(``expert_capacity``, ``round_count``, ``kept_tokens``, ``mod_capacity`` are re-exported, not copied), as
are LIMoE's constants and pure-Python helpers (``check_tau``, ``check_loss_names``, ``pruning_order``,
``coverage_after_pruning``), and the
argument checks are shared too (``moe_course.routing.checks`` accepts torch tensors), so a bad argument gets
the same message in both frameworks. The one difference: where JAX takes a PRNG ``key``, these take a
``torch.Generator`` -- or ``noise``, the standard-normal draw itself, so both frameworks can be fed the same
noise. ``tests/test_torch_routing.py`` proves every function equal to its JAX original.
``expert_capacity`` is the JAX function that stays silent while ``torch.compile`` traces it (Dynamo cannot trace
``warnings.warn`` and would break the graph there); eager calls warn as in JAX.
"""

import torch

from moe_course.routing import capacity as _capacity
from moe_course.routing.capacity import (
    RATIO_WARNING_TOLERANCE,
    ROUNDINGS,
    CapacityRoundingWarning,
    effective_capacity_ratio,
    round_count,
)

from moe_course.torch.routing.allocation import (
    COMBINE_WEIGHTS,
    METHODS,
    SCORES,
    Allocation,
    ExpertsChoice,
    allocate,
    allocate_in_order,
    batch_prioritized_allocation,
    experts_choice_allocation,
    experts_choice_as_allocation,
    kept_tokens,
    token_normalized_weights,
    priority_scores,
    skip_patch_allocation,
    vanilla_allocation,
)
from moe_course.torch.routing.dispatch import (
    IMPLEMENTATIONS,
    apply_experts,
    buffer_token_index,
    combine,
    combine_tensor,
    dispatch,
    dispatch_tensor,
    einsum_combine,
    einsum_dispatch,
    gather_combine,
    gather_dispatch,
)
from moe_course.torch.routing.entropy import (
    check_tau,
    entropy,
    global_entropy_loss,
    local_entropy,
    local_entropy_loss,
    marginal_probs,
    merged_entropy_loss,
    mutual_information_loss,
    target_entropy_loss,
)
from moe_course.torch.routing.losses import (
    AUX_LOSS_WEIGHT,
    AuxLosses,
    auxiliary_losses,
    importance_loss,
    importance_per_expert,
    load_loss,
    load_per_expert,
    router_z_loss,
    selection_probability,
    squared_coefficient_of_variation,
)
from moe_course.torch.routing.mod import (
    MOD_ROUTERS,
    MoDSelection,
    attention_router_scores,
    gather_tokens,
    mod_capacity,
    mod_gate,
    mod_select,
    scatter_attention,
    scatter_update,
    standard_router_scores,
)
from moe_course.torch.routing.modality_losses import (
    CLASSIC_LOSSES,
    ENTROPY_LOSSES,
    JOINT_LOSSES,
    LIMOE_AUX_WEIGHT,
    MODALITIES,
    PADDING,
    PER_MODALITY_LOSSES,
    MultimodalAuxLosses,
    check_loss_names,
    multimodal_aux_losses,
)
from moe_course.torch.routing.pruning import (
    PRUNING_MODES,
    coverage_after_pruning,
    pruned_top_k_routing,
    pruning_order,
)
from moe_course.torch.routing.router import (
    ORDERS,
    RouterOutput,
    add_router_noise,
    default_noise_std,
    nonfinite_tokens,
    router_probabilities,
    top_k,
    top_k_routing,
)
from moe_course.torch.routing.soft import (
    NORM_EPS,
    SoftRouting,
    apply_soft_experts,
    l2_normalize,
    soft_combine,
    soft_combine_weights,
    soft_dispatch_weights,
    soft_logits,
    soft_routing,
    soft_slots,
)


def expert_capacity(*args, **kwargs) -> int:
    """``moe_course.routing.expert_capacity`` (same arguments, result and errors), without its rounding warning
    while ``torch.compile`` traces the caller."""
    return _capacity.expert_capacity(*args, **kwargs, warn=not torch.compiler.is_compiling())


__all__ = [
    "AUX_LOSS_WEIGHT", "Allocation", "COMBINE_WEIGHTS", "token_normalized_weights", "AuxLosses", "CLASSIC_LOSSES", "CapacityRoundingWarning", "ENTROPY_LOSSES",
    "ExpertsChoice", "IMPLEMENTATIONS", "JOINT_LOSSES", "LIMOE_AUX_WEIGHT", "METHODS", "MODALITIES", "MOD_ROUTERS", "MoDSelection",
    "MultimodalAuxLosses", "NORM_EPS", "ORDERS", "PADDING", "PER_MODALITY_LOSSES", "PRUNING_MODES",
    "RATIO_WARNING_TOLERANCE", "ROUNDINGS", "RouterOutput", "SCORES", "SoftRouting", "add_router_noise", "allocate",
    "allocate_in_order", "apply_experts", "apply_soft_experts", "attention_router_scores", "auxiliary_losses",
    "batch_prioritized_allocation", "buffer_token_index", "check_loss_names", "check_tau", "combine",
    "combine_tensor", "coverage_after_pruning", "default_noise_std", "dispatch", "dispatch_tensor",
    "effective_capacity_ratio", "einsum_combine", "einsum_dispatch", "entropy", "expert_capacity",
    "experts_choice_allocation", "experts_choice_as_allocation", "gather_combine", "gather_dispatch",
    "gather_tokens", "global_entropy_loss", "importance_loss", "importance_per_expert", "kept_tokens",
    "l2_normalize", "load_loss", "load_per_expert", "local_entropy", "local_entropy_loss", "marginal_probs",
    "merged_entropy_loss", "mod_capacity", "mod_gate", "mod_select", "multimodal_aux_losses",
    "mutual_information_loss", "nonfinite_tokens", "priority_scores", "pruned_top_k_routing", "pruning_order",
    "round_count", "router_probabilities", "router_z_loss", "scatter_attention", "scatter_update",
    "selection_probability", "skip_patch_allocation", "soft_combine", "soft_combine_weights",
    "soft_dispatch_weights", "soft_logits", "soft_routing", "soft_slots", "squared_coefficient_of_variation",
    "standard_router_scores", "target_entropy_loss", "top_k", "top_k_routing", "vanilla_allocation",
]
