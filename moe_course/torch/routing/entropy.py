"""PyTorch twin of ``moe_course.routing.entropy``: LIMoE's per-modality entropy losses (Mustafa et al. 2022,
Sec. 2.2.2 Eq. 2, App. B.1, App. E.1) -- local and global entropy, -MI(experts; modality), and the K > 1
target / merged entropy losses. Same definitions, arguments, results and errors as the JAX module (see its
docstring): (groups, tokens, experts) logits, a (groups, tokens) bool ``mask`` of the modality's tokens, each
loss per group over its kept tokens then averaged over the groups holding any; entropies in nats, 0 log 0 = 0.
``check_tau`` works on Python numbers only and is the JAX module's own.
"""

from __future__ import annotations

import math

import torch

from moe_course.routing.checks import check_floating, check_int, check_integer_array, check_ndim
from moe_course.routing.entropy import check_tau
from moe_course.torch.routing.losses import mean_over_groups, token_weights
from moe_course.torch.routing.router import top_k

__all__ = ["check_tau", "entropy", "global_entropy_loss", "local_entropy", "local_entropy_loss",
           "marginal_probs", "merged_entropy_loss", "mutual_information_loss", "target_entropy_loss"]


def entropy(probs: torch.Tensor, axis: int = -1) -> torch.Tensor:
    """Twin of the JAX ``entropy``: H(p) = -sum_e p_e log p_e along ``axis`` in nats, 0 log 0 = 0, the log
    taken of max(p, tiny) so the gradient stays finite at p = 0. (..., E) -> (...) float32."""
    probs = probs.float()
    return -(probs * torch.log(probs.clamp_min(torch.finfo(torch.float32).tiny))).sum(dim=axis)


def _probs(logits: torch.Tensor) -> torch.Tensor:
    check_ndim("logits", logits, 3, "(groups, tokens, experts)")
    check_floating("logits", logits)
    return torch.softmax(logits.float(), dim=-1)


def _token_mean(values: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per group mean of (groups, tokens) values over kept tokens -> ((groups,), present (groups,) bool)."""
    count = weights.sum(dim=1)
    return (values * weights).sum(dim=1) / count.clamp_min(1.0), count > 0


def marginal_probs(logits: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Twin of the JAX ``marginal_probs`` (LIMoE Sec. 2.2.2): p~_m(experts) per group, the mean router
    distribution of the kept tokens. logits (groups, tokens, experts) float, mask (groups, tokens) bool or None
    -> (marginal (groups, experts) float32, uniform for a group without kept tokens; present (groups,) bool)."""
    probs = _probs(logits)
    weights = token_weights(logits, mask)
    count = weights.sum(dim=1)  # (G, 1)
    marginal = (probs * weights).sum(dim=1) / count.clamp_min(1.0)
    present = count[:, 0] > 0
    uniform = torch.full_like(marginal, 1.0 / marginal.shape[-1])
    return torch.where(present[:, None], marginal, uniform), present


def local_entropy(logits: torch.Tensor, mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Twin of the JAX ``local_entropy`` (Eq. 2): mean over kept tokens of H(p(experts | x_i)) per group ->
    ((groups,) float32, present (groups,) bool)."""
    return _token_mean(entropy(_probs(logits)), token_weights(logits, mask)[..., 0])


def local_entropy_loss(logits: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Twin of the JAX ``local_entropy_loss`` (LIMoE Eq. 2): Omega_local averaged over groups -> scalar float32."""
    return mean_over_groups(*local_entropy(logits, mask))


def global_entropy_loss(logits: torch.Tensor, mask: torch.Tensor | None = None, *,
                        tau: float | None = None) -> torch.Tensor:
    """Twin of the JAX ``global_entropy_loss`` (LIMoE Eq. 2, Sec. 2.2.2) -> scalar float32: -H(p~_m) for tau
    None, else max(0, tau - H(p~_m)) (0 for every routing when tau <= 0), averaged over groups. Raises
    ValueError for a tau that is NaN, infinite or not a number."""
    tau = check_tau(tau)
    marginal, present = marginal_probs(logits, mask)
    h = entropy(marginal)
    per_group = -h if tau is None else torch.maximum(torch.zeros_like(h), tau - h)
    return mean_over_groups(per_group, present)


def target_entropy_loss(logits: torch.Tensor, mask: torch.Tensor | None = None, *, k: int) -> torch.Tensor:
    """Twin of the JAX ``target_entropy_loss`` (LIMoE App. E.1): (log K - Omega_local)^2 per group, averaged
    over groups. k: 1 <= K <= E. -> scalar float32."""
    k = check_int("k", k, maximum=logits.shape[-1])
    local, present = local_entropy(logits, mask)
    return mean_over_groups((math.log(k) - local) ** 2, present)


def merged_entropy_loss(logits: torch.Tensor, mask: torch.Tensor | None = None, *, k: int) -> torch.Tensor:
    """Twin of the JAX ``merged_entropy_loss`` (LIMoE App. E.1): per token the binary entropy of (q, 1 - q),
    q = the sum of its top-K probabilities (ties to the lower expert index, as ``jax.lax.top_k``); mean over
    kept tokens, then over groups. k: 1 <= K <= E. -> scalar float32."""
    probs = _probs(logits)
    k = check_int("k", k, maximum=probs.shape[-1])
    top = top_k(probs, k)[0].sum(dim=-1)
    merged = torch.stack([top, (1.0 - top).clamp(0.0, 1.0)], dim=-1)
    return mean_over_groups(*_token_mean(entropy(merged), token_weights(logits, mask)[..., 0]))


def mutual_information_loss(logits: torch.Tensor, modality: torch.Tensor, num_modalities: int) -> torch.Tensor:
    """Twin of the JAX ``mutual_information_loss`` (LIMoE App. B.1): -MI(experts; m) per group over the
    modalities present in it (groups with fewer than two have no loss), averaged -> scalar float32.
    logits (groups, tokens, experts); modality (groups, tokens) int in [0, M), -1 for padding."""
    check_ndim("modality", modality, 2, "(groups, tokens)")
    check_integer_array("modality", modality)
    num_modalities = check_int("num_modalities", num_modalities)
    marginals, presents = zip(*(marginal_probs(logits, modality == m) for m in range(num_modalities)))
    marginals = torch.stack(marginals, dim=1)  # (G, M, E)
    weights = torch.stack(presents, dim=1).float()  # (G, M)
    count = weights.sum(dim=1)
    share = weights / count.clamp_min(1.0)[:, None]
    mean_of_entropies = (share * entropy(marginals)).sum(dim=1)
    entropy_of_mean = entropy((share[..., None] * marginals).sum(dim=1))
    return mean_over_groups(mean_of_entropies - entropy_of_mean, count >= 2)
