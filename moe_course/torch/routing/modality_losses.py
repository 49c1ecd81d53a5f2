"""PyTorch twin of ``moe_course.routing.modality_losses``: LIMoE's auxiliary loss of one MoE layer, chosen
joint losses (over all real tokens) and per-modality losses, averaged, times one weight (Mustafa et al. 2022,
Sec. 2.2.1-2.2.2, App. B.1). The constants and the name
check carry no array code and are the JAX module's own (imported, not copied), so a bad name gets the same
message in both frameworks.
"""

from __future__ import annotations

from typing import Mapping, NamedTuple, Sequence

import torch

from moe_course.routing.entropy import check_tau
from moe_course.routing.modality_losses import (
    CLASSIC_LOSSES,
    ENTROPY_LOSSES,
    JOINT_LOSSES,
    LIMOE_AUX_WEIGHT,
    MODALITIES,
    PADDING,
    PER_MODALITY_LOSSES,
    check_loss_names,
    check_multimodal_args,
)
from moe_course.torch.routing.entropy import (
    global_entropy_loss,
    local_entropy_loss,
    merged_entropy_loss,
    mutual_information_loss,
    target_entropy_loss,
)
from moe_course.torch.routing.losses import importance_loss, load_loss, router_z_loss

__all__ = ["CLASSIC_LOSSES", "ENTROPY_LOSSES", "JOINT_LOSSES", "LIMOE_AUX_WEIGHT", "MODALITIES", "PADDING", "PER_MODALITY_LOSSES",
           "MultimodalAuxLosses", "check_loss_names", "multimodal_aux_losses"]


class MultimodalAuxLosses(NamedTuple):
    """Twin of the JAX ``MultimodalAuxLosses``: total, a scalar float32 tensor (weight x mean of the chosen
    terms, 0 when none is chosen); terms, {"importance": scalar, ..., "text/local_entropy": scalar, ...}: joint
    terms under their bare names, per-modality terms as "modality/loss"."""

    total: torch.Tensor
    terms: dict[str, torch.Tensor]


def _modality_loss(loss: str, logits, noisy_logits, mask, *, tau, k, noise_std) -> torch.Tensor:
    """One named loss (a name from ``PER_MODALITY_LOSSES``) on the tokens where ``mask`` (groups, tokens) holds."""
    if loss == "importance":
        return importance_loss(logits, mask)
    if loss == "load":
        return load_loss(logits, noisy_logits, k, noise_std=noise_std, mask=mask)
    if loss == "z_loss":
        return router_z_loss(logits, mask)
    if loss == "local_entropy":
        return local_entropy_loss(logits, mask)
    if loss == "global_entropy":
        return global_entropy_loss(logits, mask, tau=tau)
    if loss == "target_entropy":
        return target_entropy_loss(logits, mask, k=k)
    return merged_entropy_loss(logits, mask, k=k)


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
    taus, joint = check_multimodal_args(modality, losses, taus, joint)
    terms: dict[str, torch.Tensor] = {}
    for loss in joint:
        if loss == "mutual_information":
            terms[loss] = mutual_information_loss(logits, modality, len(MODALITIES))
        else:
            terms[loss] = _modality_loss(loss, logits, noisy_logits, modality != PADDING, tau=None, k=k,
                                         noise_std=noise_std)
    for m, name in enumerate(MODALITIES):
        tau = check_tau(taus.get(name))
        for loss in check_loss_names(f"losses[{name!r}]", losses.get(name, ()), PER_MODALITY_LOSSES):
            terms[f"{name}/{loss}"] = _modality_loss(loss, logits, noisy_logits, modality == m, tau=tau, k=k,
                                                     noise_std=noise_std)
    if not terms:
        return MultimodalAuxLosses(torch.zeros((), dtype=torch.float32, device=logits.device), terms)
    return MultimodalAuxLosses(weight * torch.stack(list(terms.values())).mean(), terms)
