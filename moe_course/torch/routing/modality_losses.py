"""PyTorch twin of ``moe_course.routing.modality_losses``: LIMoE's auxiliary loss of one MoE layer, chosen
joint losses (over all real tokens) and per-modality losses, averaged, times one weight (Mustafa et al. 2022,
Sec. 2.2.1-2.2.2, App. B.1). The constants, the name
checks and the choice of terms (``aux_terms``, given ``TORCH_LOSSES``, the PyTorch loss functions) carry no
array code and are the JAX module's own (imported, not copied), so a bad name gets the same message in both
frameworks.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Mapping, NamedTuple, Sequence

import torch

from moe_course.routing.modality_losses import (
    CLASSIC_LOSSES,
    ENTROPY_LOSSES,
    JOINT_LOSSES,
    LIMOE_AUX_WEIGHT,
    MODALITIES,
    PADDING,
    PER_MODALITY_LOSSES,
    aux_terms,
    check_loss_names,
)
from moe_course.torch.routing.entropy import (
    global_entropy_loss,
    local_entropy_loss,
    merged_entropy_loss,
    mutual_information_loss,
    target_entropy_loss,
)
from moe_course.torch.routing.losses import importance_loss, load_loss, router_z_loss

__all__ = ["CLASSIC_LOSSES", "ENTROPY_LOSSES", "JOINT_LOSSES", "LIMOE_AUX_WEIGHT", "MODALITIES", "PADDING",
           "PER_MODALITY_LOSSES", "TORCH_LOSSES", "MultimodalAuxLosses", "check_loss_names", "multimodal_aux_losses"]


class MultimodalAuxLosses(NamedTuple):
    """Twin of the JAX ``MultimodalAuxLosses``: total, a scalar float32 tensor (weight x mean of the chosen
    terms, 0 when none is chosen); terms, {"importance": scalar, ..., "text/local_entropy": scalar, ...}: joint
    terms under their bare names, per-modality terms as "modality/loss"."""

    total: torch.Tensor
    terms: dict[str, torch.Tensor]


# The PyTorch loss functions by name, for the JAX module's ``aux_terms`` (which picks and calls them).
TORCH_LOSSES = SimpleNamespace(
    importance_loss=importance_loss, load_loss=load_loss, router_z_loss=router_z_loss,
    local_entropy_loss=local_entropy_loss, global_entropy_loss=global_entropy_loss,
    target_entropy_loss=target_entropy_loss, merged_entropy_loss=merged_entropy_loss,
    mutual_information_loss=mutual_information_loss,
)


def multimodal_aux_losses(
    logits: torch.Tensor,
    noisy_logits: torch.Tensor,
    modality: torch.Tensor,
    *,
    losses: Mapping[str, Sequence[str]],
    taus: Mapping[str, float | None] | None = None,
    joint: Sequence[str] = (),
    k: int = 1,
    noise_std: float | None = None,
    weight: float = LIMOE_AUX_WEIGHT,
) -> MultimodalAuxLosses:
    """Twin of the JAX ``multimodal_aux_losses`` (LIMoE Sec. 2.2.1-2.2.2, App. B.1): same arguments -- logits,
    noisy_logits (groups, tokens, experts) float; modality (groups, tokens) int, an index into ``MODALITIES``
    or ``PADDING``; losses {modality: names from ``PER_MODALITY_LOSSES``}, each on that modality's tokens;
    taus {modality: tau (finite; <= 0 switches the loss off) or None}; joint: names from ``JOINT_LOSSES``, each
    once over all real tokens; k; noise_std; weight -- same result and same ValueErrors."""
    terms = aux_terms(TORCH_LOSSES, logits, noisy_logits, modality, losses=losses, taus=taus, joint=joint, k=k,
                      noise_std=noise_std)
    if not terms:
        return MultimodalAuxLosses(torch.zeros((), dtype=torch.float32, device=logits.device), terms)
    return MultimodalAuxLosses(weight * torch.stack(list(terms.values())).mean(), terms)
