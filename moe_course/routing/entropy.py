"""LIMoE's entropy-based auxiliary losses (Mustafa et al. 2022, Sec. 2.2.2, App. B.1, App. E.1), per modality.

A multimodal batch routes image and text tokens through the same router. In each MoE layer and for one
modality m, every kept token x_i has a router distribution ``p_m(experts | x_i) = softmax(W x_i)`` (the clean
logits, as the importance loss uses), and ``p~_m(experts)`` is their average over the modality's tokens.
- local entropy ``Omega_local = mean_i H(p_m(experts | x_i))``: small when each token is confident about
  its expert (Eq. 2, left);
- global entropy ``Omega_global = -H(p~_m(experts))``: small (very negative) when the modality as a whole
  spreads over many experts (Eq. 2, right). Thresholded,
  ``max(0, tau + Omega_global)`` = ``max(0, tau - H(p~_m))``, it pushes only until the marginal entropy
  reaches tau; with tau = log S the modality must use at least S experts (uniformly; more when unevenly) --
  a soft minimum (Sec. 2.2.2, App. B.2);
- mutual information ``-MI(experts; m) = (1/M) sum_m H(p~_m) - H((1/M) sum_m p~_m)`` over the M modalities
  (App. B.1): one loss for all modalities, without a threshold;
- for K > 1 experts per token (App. E.1), two replacements of the local loss: target entropy
  ``(log K - Omega_local)^2`` (each token should spread over about K experts), and merged entropy: the
  binary entropy of (sum of the top-K probabilities, the rest), averaged over tokens (each token should put
  all its weight on some K experts, however it splits it among them).

Conventions shared with ``losses``: inputs are (groups, tokens, experts) logits and a (groups, tokens) bool
``mask`` selecting the modality's tokens (padding always False); each loss is computed per routing group
over its kept tokens and averaged over the groups that hold any (0 when none does). Entropies are in nats,
with 0 log 0 = 0.
"""

from __future__ import annotations

import math
import numbers

import jax
import jax.numpy as jnp

from moe_course.routing.checks import check_floating, check_int, check_integer_array, check_ndim
from moe_course.routing.losses import mean_over_groups, token_weights


def entropy(probs: jax.Array, axis: int = -1) -> jax.Array:
    """H(p) = -sum_e p_e log p_e along ``axis`` in nats, with 0 log 0 = 0: (..., E) -> (...) float32.

    The log is taken of max(p, the smallest normal float32), which changes no value (p log p is 0 there
    either way) but keeps the gradient finite where an entry is exactly 0 (d/dp p log p = log p + 1).
    """
    probs = jnp.asarray(probs, jnp.float32)
    return -jnp.sum(probs * jnp.log(jnp.maximum(probs, jnp.finfo(jnp.float32).tiny)), axis=axis)


def _probs(logits: jax.Array) -> jax.Array:
    check_ndim("logits", logits, 3, "(groups, tokens, experts)")
    check_floating("logits", logits)
    return jax.nn.softmax(jnp.asarray(logits, jnp.float32), axis=-1)


def _token_mean(values: jax.Array, weights: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Per group mean of (groups, tokens) values over kept tokens -> ((groups,), present (groups,) bool)."""
    count = jnp.sum(weights, axis=1)
    return jnp.sum(values * weights, axis=1) / jnp.maximum(count, 1.0), count > 0


def marginal_probs(logits: jax.Array, mask: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """p~_m(experts) per group: the mean router distribution of the kept tokens (Sec. 2.2.2, below Eq. 2).

    logits: (groups, tokens, experts) float; mask: (groups, tokens) bool or None. Returns (marginal (groups,
    experts) float32, present (groups,) bool); a group without kept tokens gets the uniform distribution (so
    its entropy stays finite) and present False. Raises ValueError for bad shapes or dtypes.
    """
    probs = _probs(logits)
    weights = token_weights(logits, mask)
    count = jnp.sum(weights, axis=1)  # (G, 1)
    marginal = jnp.sum(probs * weights, axis=1) / jnp.maximum(count, 1.0)
    present = count[:, 0] > 0
    uniform = jnp.full_like(marginal, 1.0 / marginal.shape[-1])
    return jnp.where(present[:, None], marginal, uniform), present


def local_entropy(logits: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """Omega_local per group (Eq. 2): mean over kept tokens of H(p(experts | x_i)) -> ((groups,) float32,
    present (groups,) bool)."""
    return _token_mean(entropy(_probs(logits)), token_weights(logits, mask)[..., 0])


def local_entropy_loss(logits: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """Local entropy loss Omega_local (LIMoE Eq. 2), averaged over groups: (groups, tokens, experts) logits and
    a (groups, tokens) bool mask -> scalar float32 in [0, log E]. 0 when every token is one-hot."""
    return mean_over_groups(*local_entropy(logits, mask))


def check_tau(tau) -> float | None:
    """``tau`` as a float if it is a finite number, None if None; else ValueError naming tau.

    Any finite tau is allowed: tau <= 0 makes the thresholded global loss ``max(0, tau - H)`` exactly 0 for
    every routing (an entropy is never negative), the "off" end of the paper's threshold sweeps (App. B.2).
    """
    if tau is None:
        return None
    ok = isinstance(tau, numbers.Real) and not isinstance(tau, bool) and math.isfinite(tau)
    if not ok:
        raise ValueError(f"tau={tau!r} is not allowed; use a finite threshold (tau = log S for a soft minimum of S "
                         "experts; <= 0 switches the loss off) or None for the unthresholded loss")
    return float(tau)


def global_entropy_loss(logits: jax.Array, mask: jax.Array | None = None, *, tau: float | None = None) -> jax.Array:
    """Global entropy loss (LIMoE Eq. 2 and Sec. 2.2.2), averaged over groups -> scalar float32.

    tau None: Omega_global = -H(p~_m), in [-log E, 0]. tau a finite number: the thresholded
    ``max(0, tau + Omega_global)`` = ``max(0, tau - H(p~_m))``, exactly 0 (and without gradient) once the
    marginal entropy reaches tau -- so for tau <= 0 it is 0 whatever the routing, since H >= 0 (App. B.2
    sweeps tau from log 1 = 0 up). logits, mask as ``marginal_probs``. Raises ValueError for a tau that is
    NaN, infinite or not a number.
    """
    tau = check_tau(tau)
    marginal, present = marginal_probs(logits, mask)
    h = entropy(marginal)
    per_group = -h if tau is None else jnp.maximum(0.0, tau - h)
    return mean_over_groups(per_group, present)


def target_entropy_loss(logits: jax.Array, mask: jax.Array | None = None, *, k: int) -> jax.Array:
    """K > 1 local loss, target entropy (LIMoE App. E.1): (log K - Omega_local)^2 per group, averaged over groups.
    0 when every token spreads evenly over exactly K experts. k: 1 <= K <= E. -> scalar float32."""
    k = check_int("k", k, maximum=jnp.shape(logits)[-1])
    local, present = local_entropy(logits, mask)
    return mean_over_groups((math.log(k) - local) ** 2, present)


def merged_entropy_loss(logits: jax.Array, mask: jax.Array | None = None, *, k: int) -> jax.Array:
    """K > 1 local loss, merged entropy (LIMoE App. E.1): per token, the entropy of the two-outcome distribution
    (q, 1 - q) with q = the sum of its top-K probabilities; mean over kept tokens, then over groups.
    0 when each token's weight lies entirely on K experts. k: 1 <= K <= E. -> scalar float32."""
    probs = _probs(logits)
    k = check_int("k", k, maximum=probs.shape[-1])
    top = jnp.sum(jax.lax.top_k(probs, k)[0], axis=-1)
    merged = jnp.stack([top, jnp.clip(1.0 - top, 0.0, 1.0)], axis=-1)
    return mean_over_groups(*_token_mean(entropy(merged), token_weights(logits, mask)[..., 0]))


def mutual_information_loss(logits: jax.Array, modality: jax.Array, num_modalities: int) -> jax.Array:
    """-MI(experts; m) (LIMoE App. B.1) per group, averaged over groups -> scalar float32 in [-log M, 0].

    logits: (groups, tokens, experts); modality: (groups, tokens) int, the modality id in [0, M) of each token
    or -1 for padding (never counted). In a group only the modalities present take part (M there = their
    number); a group with fewer than two modalities present has no loss. Minimal (-log M) when the
    modalities use disjoint experts.
    """
    check_ndim("modality", modality, 2, "(groups, tokens)")
    check_integer_array("modality", modality)
    num_modalities = check_int("num_modalities", num_modalities)
    marginals, presents = [], []
    for m in range(num_modalities):
        marginal, present = marginal_probs(logits, modality == m)
        marginals.append(marginal)
        presents.append(present)
    marginals = jnp.stack(marginals, axis=1)  # (G, M, E)
    weights = jnp.stack(presents, axis=1).astype(jnp.float32)  # (G, M)
    count = jnp.sum(weights, axis=1)
    share = weights / jnp.maximum(count, 1.0)[:, None]
    mean_of_entropies = jnp.sum(share * entropy(marginals), axis=1)
    entropy_of_mean = entropy(jnp.sum(share[..., None] * marginals, axis=1))
    return mean_over_groups(mean_of_entropies - entropy_of_mean, count >= 2)
