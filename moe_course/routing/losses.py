"""V-MoE auxiliary load-balancing losses (Riquelme et al. 2021, App. A.2), computed per group, then averaged.

Two losses push the router towards using all experts evenly. Both are the squared coefficient of variation
(std / mean)^2 over experts (population std), of:
- importance (Eq. 1-2): ``Imp_e = sum_x softmax(W x)_e``, the CLEAN router probabilities summed over the
  group's tokens -- every token contributes to every expert, selected or not;
- load (Eq. 3-6): a smooth stand-in for how many tokens each expert receives. For token x,
  ``threshold_k(x)`` is the k-th largest NOISY logit ``W x + eps`` (the noise drawn in the forward pass);
  ``p_e(x) = P((W x)_e + eps_new >= threshold_k(x)) = 1 - Phi((threshold_k(x) - (W x)_e) / sigma)`` with
  ``eps_new ~ N(0, sigma^2)``, sigma = 1/E, and Phi the standard normal CDF; ``load_e = sum_x p_e(x)``.
The total is ``L_aux = 0.5 L_imp + 0.5 L_load`` (Eq. 7); the model adds ``lambda * L_aux`` with
lambda = ``AUX_LOSS_WEIGHT`` = 0.01 to its task loss (the caller multiplies).

Token masks (LIMoE, Mustafa et al. 2022, App. B.1): every loss here takes an optional ``mask`` (groups,
tokens) bool that keeps only some tokens -- one modality's, never padding. Sums run over the kept tokens; a
group without kept tokens has no loss and drops out of the average over groups (0 when no group has any).
The router z-loss of ST-MoE (Zoph et al. 2022), ``mean_i (logsumexp_e a_ie)^2``, is here too.

Importance alone is fooled by tokens whose probabilities are balanced on average while one expert is never
the TOP-1 (App. A.2, Table 3); load sees that.

The threshold subtlety. V-MoE simplifies Shazeer et al. (2017): ONE threshold per token, the k-th largest
noisy logit, compared against every expert -- including the experts that themselves made the top k. For the
expert that owns the threshold logit, ``threshold_k(x) - (W x)_e`` is just its own forward-pass noise
``eps_e``, so ``p_e(x) = 1 - Phi(eps_e / sigma)``: a number that does not depend on that expert's logit at
all (its gradient through that token is 0), and that is 0.5 without noise. Shazeer et al. instead compare
expert e against the k-th largest of the OTHER experts' noisy logits. This module implements the paper's
(and google-research/vmoe's) version: the threshold includes the expert's own entry, and gradients flow
through both the threshold and ``(W x)_e``.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from moe_course.routing.checks import check_floating, check_int, check_ndim, check_positive
from moe_course.routing.router import default_noise_std

AUX_LOSS_WEIGHT = 0.01  # lambda of V-MoE App. A.2: total loss = task loss + AUX_LOSS_WEIGHT * L_aux
# The shares of Eq. 7, L_aux = 0.5 L_imp + 0.5 L_load. google-research/vmoe writes lambda times them as one weight
# per loss (vmoe/configs/vmoe_paper/common.py: importance_loss_weight = load_loss_weight = 0.005) and, without
# router noise, keeps the importance term at its weight and drops the load term (vmoe/nn/routing.py,
# NoisyTopExpertsPerItemRouter._compute_gates_softmax_and_metrics): a noise-free layer's loss is
# lambda * IMPORTANCE_SHARE * L_imp.
IMPORTANCE_SHARE = 0.5
LOAD_SHARE = 0.5


def squared_coefficient_of_variation(values: jax.Array, axis: int = -1) -> jax.Array:
    """(std / mean)^2 along ``axis``, population std (ddof 0), computed as var / mean^2 (no sqrt, so its
    gradient is defined at perfect balance). (..., n) -> (...)."""
    return jnp.var(values, axis=axis) / jnp.mean(values, axis=axis) ** 2


def check_router_logits(name: str, logits) -> None:
    """Raise ValueError naming ``name`` unless logits is a floating (groups, tokens, experts) array (JAX or torch)."""
    check_ndim(name, logits, 3, "(groups, tokens, experts)")
    check_floating(name, logits)


def token_weights(logits: jax.Array, mask: jax.Array | None) -> jax.Array:
    """(groups, tokens, 1) float32: 1 for kept tokens, 0 for masked ones (all 1 without a mask).
    Raises ValueError when ``mask`` is not a (groups, tokens) array matching ``logits``."""
    if mask is None:
        return jnp.ones((*jnp.shape(logits)[:2], 1), jnp.float32)
    if jnp.shape(mask) != jnp.shape(logits)[:2]:
        raise ValueError(f"mask has shape {jnp.shape(mask)}; it must be (groups, tokens) = {jnp.shape(logits)[:2]}")
    return jnp.asarray(mask, jnp.float32)[..., None]


def mean_over_groups(per_group: jax.Array, present: jax.Array) -> jax.Array:
    """Mean of (groups,) values over the groups where ``present`` (groups,) bool holds; 0 when none does.
    Callers must already have made the absent groups' values finite (a NaN there would poison the gradient)."""
    present = jnp.asarray(present, jnp.float32)
    return jnp.sum(jnp.where(present > 0, per_group, 0.0)) / jnp.maximum(jnp.sum(present), 1.0)


def _balance_loss(per_expert: jax.Array, weights: jax.Array) -> jax.Array:
    """(std/mean)^2 over experts per group, averaged over the groups with kept tokens."""
    present = jnp.sum(weights, axis=(1, 2)) > 0
    safe = jnp.where(present[:, None], per_expert, 1.0)  # an empty group's 0/0 never enters the gradient
    return mean_over_groups(squared_coefficient_of_variation(safe), present)


def importance_per_expert(logits: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """Imp_e per group (App. A.2, Eq. 1): clean logits (groups, tokens, experts) -> (groups, experts) float32.
    mask: (groups, tokens) bool or None; only kept tokens are summed (see the module docstring)."""
    check_router_logits("logits", logits)
    probs = jax.nn.softmax(jnp.asarray(logits, jnp.float32), axis=-1)
    return jnp.sum(probs * token_weights(logits, mask), axis=1)


def importance_loss(logits: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """L_imp (App. A.2, Eq. 2), averaged over groups: clean logits (groups, tokens, experts) -> scalar float32.
    mask: as ``importance_per_expert``."""
    return _balance_loss(importance_per_expert(logits, mask), token_weights(logits, mask))


def check_same_shape(noisy_logits, logits) -> None:
    """Raise ValueError unless noisy_logits has the shape of logits."""
    if tuple(jnp.shape(noisy_logits)) != tuple(jnp.shape(logits)):
        raise ValueError(f"noisy_logits has shape {tuple(jnp.shape(noisy_logits))}; it must match logits "
                         f"{tuple(jnp.shape(logits))}")


def load_noise_std(noise_std: float | None, num_experts: int) -> float:
    """sigma of the load loss: ``noise_std``, or 1/E for None; ValueError for 0 (p_e(x) needs sigma > 0)."""
    if noise_std is not None and noise_std == 0:
        raise ValueError("noise_std=0 is not allowed for the load loss (p_e(x) needs sigma > 0); use None (1/E) or "
                         "a positive number, or leave the load loss out for a noise-free router")
    return default_noise_std(num_experts) if noise_std is None else check_positive("noise_std", noise_std)


def selection_probability(
    logits: jax.Array, noisy_logits: jax.Array, k: int, *, noise_std: float | None = None
) -> jax.Array:
    """p_e(x) (App. A.2, Eq. 3-4): probability that expert e would be in the token's top k if only its own noise
    were drawn again, against the fixed threshold ``threshold_k(x)`` = k-th largest noisy logit.

    logits: (groups, tokens, experts) clean ``W x``. noisy_logits: same shape, ``W x + eps`` from the forward
    pass (``RouterOutput.noisy_logits``; equal to ``logits`` without noise). k: 1 <= k <= experts.
    noise_std: sigma > 0; None means 1 / E (0 raises: the probability is undefined without noise).
    Returns (groups, tokens, experts) float32 in [0, 1].
    See the module docstring for the expert that owns the threshold. Raises ValueError naming the argument.
    """
    check_router_logits("logits", logits)
    check_router_logits("noisy_logits", noisy_logits)
    check_same_shape(noisy_logits, logits)
    num_experts = jnp.shape(logits)[-1]
    k = check_int("k", k, minimum=1, maximum=num_experts)
    sigma = load_noise_std(noise_std, num_experts)
    logits = jnp.asarray(logits, jnp.float32)
    threshold = jax.lax.top_k(jnp.asarray(noisy_logits, jnp.float32), k)[0][..., -1:]  # (G, T, 1)
    return 1.0 - jax.scipy.stats.norm.cdf((threshold - logits) / sigma)


def load_per_expert(
    logits: jax.Array, noisy_logits: jax.Array, k: int, *, noise_std: float | None = None,
    mask: jax.Array | None = None,
) -> jax.Array:
    """load_e per group (App. A.2, Eq. 5): sum over the group's (kept) tokens of p_e(x) -> (groups, experts)
    float32. mask: (groups, tokens) bool or None (see the module docstring)."""
    p = selection_probability(logits, noisy_logits, k, noise_std=noise_std)
    return jnp.sum(p * token_weights(logits, mask), axis=1)


def load_loss(logits: jax.Array, noisy_logits: jax.Array, k: int, *, noise_std: float | None = None,
              mask: jax.Array | None = None) -> jax.Array:
    """L_load (App. A.2, Eq. 6), averaged over groups -> scalar float32. Arguments as ``selection_probability``;
    mask as ``load_per_expert``."""
    load = load_per_expert(logits, noisy_logits, k, noise_std=noise_std, mask=mask)
    return _balance_loss(load, token_weights(logits, mask))


def router_z_loss(logits: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """Router z-loss (ST-MoE, Zoph et al. 2022; LIMoE App. B.1): ``mean_i (logsumexp_e a_ie)^2`` over the
    (kept) tokens of a group, averaged over groups. logits: (groups, tokens, experts) the clean router logits
    ``a = W x``; mask as ``importance_per_expert``. Returns a scalar float32; it keeps the logits small."""
    check_router_logits("logits", logits)
    weights = token_weights(logits, mask)[..., 0]
    z = jax.nn.logsumexp(jnp.asarray(logits, jnp.float32), axis=-1) ** 2
    count = jnp.sum(weights, axis=1)
    return mean_over_groups(jnp.sum(z * weights, axis=1) / jnp.maximum(count, 1.0), count > 0)


class AuxLosses(NamedTuple):
    """Scalars, float32, each averaged over groups: importance (L_imp), load (L_load), total = L_aux."""

    importance: jax.Array
    load: jax.Array
    total: jax.Array


def auxiliary_losses(
    logits: jax.Array, noisy_logits: jax.Array, k: int, *, noise_std: float | None = None,
    mask: jax.Array | None = None,
) -> AuxLosses:
    """V-MoE's L_aux = 0.5 L_imp + 0.5 L_load (App. A.2, Eq. 7), with both parts, per group then averaged.

    logits: (groups, tokens, experts) clean router logits; noisy_logits: the noisy ones of the forward pass;
    k: experts per token; noise_std: sigma, None = 1/E; mask: (groups, tokens) bool or None, the tokens that
    count (padding excluded). Multiply ``total`` by ``AUX_LOSS_WEIGHT`` (0.01).
    """
    importance = importance_loss(logits, mask)
    load = load_loss(logits, noisy_logits, k, noise_std=noise_std, mask=mask)
    return AuxLosses(importance, load, IMPORTANCE_SHARE * importance + LOAD_SHARE * load)
