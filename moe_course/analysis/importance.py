"""Leave-one-out token importance (A-MoD, Gadhikar et al. 2024, Sec. 4.4 and App. A) and its agreement with
routing scores.

A token's importance is how much the loss grows when that token is removed from the input sequence: it is
neither attended to nor pooled, in every block. Tokens whose removal costs nothing can skip blocks cheaply;
a good MoD router ranks tokens the way this (expensive) measurement does.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from scipy.stats import spearmanr

from moe_course.models.vit import ViT


def _loss_from_tokens(model: ViT, tokens: jax.Array, labels: jax.Array) -> jax.Array:
    """Per-image cross-entropy (nats) of a dense ViT run from embedded tokens (batch, tokens, width)."""
    for block in model.blocks:
        tokens, _, _ = block(tokens)
    logits = model.head(model.pool(model.norm(tokens)))
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels)


def leave_one_out_importance(model: ViT, images: jax.Array, labels: jax.Array) -> jax.Array:
    """(batch, patches) float32: loss without patch token i minus the loss with all tokens, per image.

    model: a dense ``ViT`` (the class token, when there is one, is never removed; only patch tokens are
    scored). images: (batch, S, S, C); labels: (batch,) int. One forward pass per patch (vectorised), so
    the cost is ``patches`` times a forward pass. Raises ValueError for a model that is not a dense ViT.
    """
    if type(model) is not ViT:
        raise ValueError(f"model is a {type(model).__name__}; leave-one-out importance is measured on a dense ViT")
    tokens = model.embed(jnp.asarray(images))
    labels = jnp.asarray(labels)
    first = 1 if model.config.pool == "cls" else 0
    n = tokens.shape[1]
    full = _loss_from_tokens(model, tokens, labels)

    def without(i):
        keep = jnp.arange(n - 1) + (jnp.arange(n - 1) >= i)  # every position but i, in order
        return _loss_from_tokens(model, tokens[:, keep], labels)

    losses = jax.lax.map(without, jnp.arange(first, n))  # (patches, batch)
    return (losses - full[None]).T


def mean_rank_correlation(importance, scores) -> float:
    """Spearman rank correlation between two per-token measures, computed per image and averaged.

    importance, scores: (batch, tokens) arrays (e.g. leave-one-out importance and a router's scores for the
    same tokens). Images where either measure is constant are skipped (their correlation is undefined).
    Returns a float in [-1, 1]; raises ValueError for mismatched shapes or no usable image.
    """
    importance, scores = np.asarray(importance), np.asarray(scores)
    if importance.shape != scores.shape or importance.ndim != 2:
        raise ValueError(f"importance {importance.shape} and scores {scores.shape} must both be (batch, tokens)")
    values = [spearmanr(a, b).statistic for a, b in zip(importance, scores) if np.ptp(a) > 0 and np.ptp(b) > 0]
    if not values:
        raise ValueError("no image has non-constant importance and scores; the correlation is undefined")
    return float(np.mean(values))
