"""PyTorch twin of ``moe_course.routing.losses``: V-MoE's importance and load losses (App. A.2), per group,
then averaged; same definitions (including the threshold that includes the expert's own noisy logit, see the
JAX module docstring), arguments and errors. As there, every loss takes an optional (groups, tokens) bool
``mask`` (LIMoE App. B.1: only kept tokens count, groups without kept tokens drop out of the average), and
ST-MoE's router z-loss is here too."""

from __future__ import annotations

from typing import NamedTuple

import torch

from moe_course.routing.checks import check_int
from moe_course.routing.losses import (AUX_LOSS_WEIGHT, IMPORTANCE_SHARE, LOAD_SHARE, check_router_logits,
                                       check_same_shape, load_noise_std)
from moe_course.torch.routing.router import top_k

__all__ = ["AUX_LOSS_WEIGHT", "AuxLosses", "auxiliary_losses", "importance_loss", "importance_per_expert",
           "load_loss", "load_per_expert", "mean_over_groups", "router_z_loss", "selection_probability",
           "squared_coefficient_of_variation", "token_weights"]


def squared_coefficient_of_variation(values: torch.Tensor, axis: int = -1) -> torch.Tensor:
    """(std / mean)^2 along ``axis``, population std, computed as var / mean^2. (..., n) -> (...)."""
    return values.var(dim=axis, correction=0) / values.mean(dim=axis) ** 2


def token_weights(logits: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Twin of the JAX ``token_weights``: (groups, tokens, 1) float32, 1 for kept tokens, 0 for masked ones
    (all 1 without a mask). Raises ValueError when ``mask`` is not (groups, tokens) like ``logits``."""
    if mask is None:
        return torch.ones(*logits.shape[:2], 1, dtype=torch.float32, device=logits.device)
    if tuple(mask.shape) != tuple(logits.shape[:2]):
        raise ValueError(f"mask has shape {tuple(mask.shape)}; it must be (groups, tokens) = {tuple(logits.shape[:2])}")
    return mask.float()[..., None]


def mean_over_groups(per_group: torch.Tensor, present: torch.Tensor) -> torch.Tensor:
    """Twin of the JAX ``mean_over_groups``: mean of (groups,) values over the groups where ``present``
    (groups,) bool holds, 0 when none does (absent groups' values must already be finite)."""
    present = present.float()
    return torch.where(present > 0, per_group, 0.0).sum() / present.sum().clamp_min(1.0)


def _balance_loss(per_expert: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """(std/mean)^2 over experts per group, averaged over the groups with kept tokens."""
    present = weights.sum(dim=(1, 2)) > 0
    safe = torch.where(present[:, None], per_expert, 1.0)  # an empty group's 0/0 never enters the gradient
    return mean_over_groups(squared_coefficient_of_variation(safe), present)


def importance_per_expert(logits: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Imp_e per group (App. A.2, Eq. 1): clean logits (groups, tokens, experts) -> (groups, experts) float32;
    mask: (groups, tokens) bool or None, only kept tokens are summed."""
    check_router_logits("logits", logits)
    return (torch.softmax(logits.float(), dim=-1) * token_weights(logits, mask)).sum(dim=1)


def importance_loss(logits: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """L_imp (App. A.2, Eq. 2), averaged over the groups with kept tokens -> scalar float32."""
    return _balance_loss(importance_per_expert(logits, mask), token_weights(logits, mask))


def selection_probability(logits: torch.Tensor, noisy_logits: torch.Tensor, k: int, *,
                          noise_std: float | None = None) -> torch.Tensor:
    """p_e(x) = 1 - Phi((threshold_k(x) - (W x)_e) / sigma) (App. A.2, Eq. 3-4), threshold_k(x) the k-th largest
    noisy logit. logits, noisy_logits: (groups, tokens, experts); sigma = noise_std or 1/E (0 raises).
    Returns (groups, tokens, experts) float32 in [0, 1]."""
    check_router_logits("logits", logits)
    check_router_logits("noisy_logits", noisy_logits)
    check_same_shape(noisy_logits, logits)
    num_experts = logits.shape[-1]
    k = check_int("k", k, minimum=1, maximum=num_experts)
    sigma = load_noise_std(noise_std, num_experts)
    threshold = top_k(noisy_logits.float(), k)[0][..., -1:]
    return 1.0 - torch.special.ndtr((threshold - logits.float()) / sigma)


def load_per_expert(logits: torch.Tensor, noisy_logits: torch.Tensor, k: int, *,
                    noise_std: float | None = None, mask: torch.Tensor | None = None) -> torch.Tensor:
    """load_e per group (App. A.2, Eq. 5): sum over the group's kept tokens of p_e(x) -> (groups, experts)
    float32; mask: (groups, tokens) bool or None."""
    p = selection_probability(logits, noisy_logits, k, noise_std=noise_std)
    return (p * token_weights(logits, mask)).sum(dim=1)


def load_loss(logits: torch.Tensor, noisy_logits: torch.Tensor, k: int, *,
              noise_std: float | None = None, mask: torch.Tensor | None = None) -> torch.Tensor:
    """L_load (App. A.2, Eq. 6), averaged over the groups with kept tokens -> scalar float32."""
    load = load_per_expert(logits, noisy_logits, k, noise_std=noise_std, mask=mask)
    return _balance_loss(load, token_weights(logits, mask))


def router_z_loss(logits: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Twin of the JAX ``router_z_loss`` (ST-MoE; LIMoE App. B.1): mean over kept tokens of
    (logsumexp_e a_ie)^2 per group, averaged over groups. logits (groups, tokens, experts) -> scalar float32."""
    check_router_logits("logits", logits)
    weights = token_weights(logits, mask)[..., 0]
    z = torch.logsumexp(logits.float(), dim=-1) ** 2
    count = weights.sum(dim=1)
    return mean_over_groups((z * weights).sum(dim=1) / count.clamp_min(1.0), count > 0)


class AuxLosses(NamedTuple):
    """Scalars, float32, each averaged over groups: importance (L_imp), load (L_load), total = L_aux."""

    importance: torch.Tensor
    load: torch.Tensor
    total: torch.Tensor


def auxiliary_losses(logits: torch.Tensor, noisy_logits: torch.Tensor, k: int, *,
                     noise_std: float | None = None, mask: torch.Tensor | None = None) -> AuxLosses:
    """V-MoE's L_aux = 0.5 L_imp + 0.5 L_load (App. A.2, Eq. 7); multiply ``total`` by ``AUX_LOSS_WEIGHT``.
    mask: (groups, tokens) bool or None, the tokens that count (padding excluded)."""
    importance = importance_loss(logits, mask)
    load = load_loss(logits, noisy_logits, k, noise_std=noise_std, mask=mask)
    return AuxLosses(importance, load, IMPORTANCE_SHARE * importance + LOAD_SHARE * load)
