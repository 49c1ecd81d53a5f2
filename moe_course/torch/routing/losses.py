"""PyTorch twin of ``moe_course.routing.losses``: V-MoE's importance and load losses (App. A.2), per group,
then averaged; same definitions (including the threshold that includes the expert's own noisy logit, see the
JAX module docstring), arguments and errors."""

from __future__ import annotations

from typing import NamedTuple

import torch

from moe_course.routing.checks import check_int
from moe_course.routing.losses import AUX_LOSS_WEIGHT, check_router_logits, check_same_shape, load_noise_std
from moe_course.torch.routing.router import top_k

__all__ = ["AUX_LOSS_WEIGHT", "AuxLosses", "auxiliary_losses", "importance_loss", "importance_per_expert",
           "load_loss", "load_per_expert", "selection_probability", "squared_coefficient_of_variation"]


def squared_coefficient_of_variation(values: torch.Tensor, axis: int = -1) -> torch.Tensor:
    """(std / mean)^2 along ``axis``, population std, computed as var / mean^2. (..., n) -> (...)."""
    return values.var(dim=axis, correction=0) / values.mean(dim=axis) ** 2


def importance_per_expert(logits: torch.Tensor) -> torch.Tensor:
    """Imp_e per group (App. A.2, Eq. 1): clean logits (groups, tokens, experts) -> (groups, experts) float32."""
    check_router_logits("logits", logits)
    return torch.softmax(logits.float(), dim=-1).sum(dim=1)


def importance_loss(logits: torch.Tensor) -> torch.Tensor:
    """L_imp (App. A.2, Eq. 2), averaged over groups: clean logits (groups, tokens, experts) -> scalar float32."""
    return squared_coefficient_of_variation(importance_per_expert(logits)).mean()


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
                    noise_std: float | None = None) -> torch.Tensor:
    """load_e per group (App. A.2, Eq. 5): sum over the group's tokens of p_e(x) -> (groups, experts) float32."""
    return selection_probability(logits, noisy_logits, k, noise_std=noise_std).sum(dim=1)


def load_loss(logits: torch.Tensor, noisy_logits: torch.Tensor, k: int, *,
              noise_std: float | None = None) -> torch.Tensor:
    """L_load (App. A.2, Eq. 6), averaged over groups -> scalar float32."""
    return squared_coefficient_of_variation(load_per_expert(logits, noisy_logits, k, noise_std=noise_std)).mean()


class AuxLosses(NamedTuple):
    """Scalars, float32, each averaged over groups: importance (L_imp), load (L_load), total = L_aux."""

    importance: torch.Tensor
    load: torch.Tensor
    total: torch.Tensor


def auxiliary_losses(logits: torch.Tensor, noisy_logits: torch.Tensor, k: int, *,
                     noise_std: float | None = None) -> AuxLosses:
    """V-MoE's L_aux = 0.5 L_imp + 0.5 L_load (App. A.2, Eq. 7); multiply ``total`` by ``AUX_LOSS_WEIGHT``."""
    importance = importance_loss(logits)
    load = load_loss(logits, noisy_logits, k, noise_std=noise_std)
    return AuxLosses(importance, load, 0.5 * importance + 0.5 * load)
