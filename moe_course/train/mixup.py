"""Mixup (Zhang et al. 2018, arXiv 1710.09412) as big_vision trains with it (``big_vision/utils.py`` ``get_mixup``).

One mixing ratio per batch: a ~ Beta(p, p), folded to ``max(a, 1 - a)`` (so the original image always weighs at
least half); every example is mixed with its neighbour in the batch rolled by one (``jnp.roll(x, 1, axis=0)``:
example i with example i - 1, example 0 with the last), and the one-hot labels are mixed with the same ratio.
The key is split first, as big_vision's: (next key, mixup key) = split(key). big_vision draws the ratio once per
batch, outside its ``shard_map`` (``train.py`` ``update_fn`` calls ``u.get_mixup(rng, p)``, then wraps only the
returned mixing function in ``shard_map``), so only the roll is per device: on n devices, the first example of each
device's share is mixed with the last of that share. Here the roll runs over the whole batch of the step: the same
pairs on one device; on n devices, n of the pairs differ (those across the shares' boundaries).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def mixup_ratio(key: jax.Array, p: float) -> jax.Array:
    """The folded ratio max(a, 1 - a), a ~ Beta(p, p) drawn from ``key``: a float32 scalar in [0.5, 1]."""
    a = jax.random.beta(key, p, p)
    return jnp.maximum(a, 1.0 - a)


def mixup(key: jax.Array, images: jax.Array, labels: jax.Array, *, p: float
          ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(next key, mixed images, mixed labels) -- big_vision's ``get_mixup(key, p)(images, labels)``.

    images: (batch, ...) float; labels: (batch, classes) one-hot (or already soft) float. Both become
    ``r * x + (1 - r) * roll(x, 1, axis=0)`` with r = ``mixup_ratio(mixup key, p)``; shapes and dtypes kept.
    Raises ValueError for p <= 0 or arrays with different batch sizes.
    """
    if not p > 0:
        raise ValueError(f"mixup p={p!r} is not allowed; use p > 0 (0 means no mixup: do not call mixup)")
    if images.shape[0] != labels.shape[0]:
        raise ValueError(f"images ({images.shape[0]}) and labels ({labels.shape[0]}) have different batch sizes")
    key, mix_key = jax.random.split(key)
    r = mixup_ratio(mix_key, p)
    mix = lambda x: (r * x + (1.0 - r) * jnp.roll(x, shift=1, axis=0)).astype(x.dtype)  # noqa: E731
    return key, mix(images), mix(labels)
