"""Mixup equals a NumPy transcription of big_vision's ``utils.get_mixup`` (google-research/big_vision at
0127fb6b, big_vision/utils.py), in JAX and in the PyTorch twin; the ratio has big_vision's distribution; the
training step mixes the batch and its labels when ``mixup_p`` is set."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from moe_course.train.mixup import mixup, mixup_ratio


def big_vision_mixup_numpy(a: float, *things: np.ndarray) -> list[np.ndarray]:
    """big_vision's get_mixup after its draw ``a = jax.random.beta(rng_mixup, p, p)``, line by line in NumPy:
    a = max(a, 1 - a); mix = a * thing + (1 - a) * roll(thing, shift=1, axis=0)."""
    a = np.maximum(a, 1.0 - a)
    return [a * thing + (1 - a) * np.roll(thing, shift=1, axis=0) for thing in things]


IMAGES = np.random.default_rng(0).uniform(size=(5, 4, 4, 3)).astype(np.float32)
LABELS = np.eye(7, dtype=np.float32)[[0, 3, 6, 2, 2]]


@pytest.mark.parametrize("seed, p", [(0, 0.2), (1, 0.2), (2, 1.0), (3, 0.5)])
def test_jax_mixup_equals_big_vision(seed, p):
    key = jax.random.key(seed)
    next_key, images, labels = mixup(key, jnp.asarray(IMAGES), jnp.asarray(LABELS), p=p)
    rng, rng_mixup = jax.random.split(key)  # big_vision: rng, rng_mixup = jax.random.split(rng)
    a = float(jax.random.beta(rng_mixup, p, p))
    want_images, want_labels = big_vision_mixup_numpy(a, IMAGES, LABELS)
    np.testing.assert_allclose(images, want_images, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(labels, want_labels, rtol=1e-6, atol=1e-7)
    assert jnp.array_equal(jax.random.key_data(next_key), jax.random.key_data(rng))
    np.testing.assert_allclose(np.asarray(labels).sum(-1), 1.0, rtol=1e-6)


def test_torch_mixup_equals_big_vision():
    torch = pytest.importorskip("torch")
    from moe_course.torch.mixup import mixup as torch_mixup

    for seed in range(3):
        generator = torch.Generator().manual_seed(seed)
        images, labels, r = torch_mixup(torch.from_numpy(IMAGES), torch.from_numpy(LABELS), p=0.2,
                                        generator=generator)
        want_images, want_labels = big_vision_mixup_numpy(r, IMAGES, LABELS)
        assert 0.5 <= r <= 1.0
        np.testing.assert_allclose(images.numpy(), want_images, rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(labels.numpy(), want_labels, rtol=1e-6, atol=1e-7)
    # The same key of JAX's draw gives the same mixed batch in both frameworks.
    _, jax_images, _ = mixup(jax.random.key(4), jnp.asarray(IMAGES), jnp.asarray(LABELS), p=0.2)
    a = float(mixup_ratio(jax.random.split(jax.random.key(4))[1], 0.2))
    images, _, _ = torch_mixup(torch.from_numpy(IMAGES), torch.from_numpy(LABELS), p=0.2, ratio=a)
    np.testing.assert_allclose(images.numpy(), np.asarray(jax_images), rtol=1e-6, atol=1e-7)


def test_the_ratio_is_max_of_a_and_1_minus_a_for_a_beta_draw():
    """4,000 draws of each implementation against the folded Beta(0.2, 0.2): P(R <= r) = 2 F(r) - 1 on
    [0.5, 1]; a chi-square test over 7 bins, p-values above 1e-3 on fixed seeds. (Bins, not Kolmogorov-Smirnov:
    a float32 draw within 6e-8 of 1 is exactly 1, about 3% of them at p = 0.2, a jump KS would count.)"""
    torch = pytest.importorskip("torch")
    from moe_course.torch.mixup import mixup_ratio as torch_ratio

    folded_cdf = lambda r: 2 * stats.beta(0.2, 0.2).cdf(r) - 1  # noqa: E731
    draws = np.asarray(jax.vmap(lambda k: mixup_ratio(k, 0.2))(jax.random.split(jax.random.key(0), 4000)))
    generator = torch.Generator().manual_seed(0)
    torch_draws = np.array([torch_ratio(0.2, generator) for _ in range(4000)])
    edges = np.array([0.5, 0.6, 0.7, 0.8, 0.9, 0.99, 0.9999, 1.0])
    expected = np.diff(folded_cdf(edges)) * 4000
    for sample in (draws, torch_draws):
        assert sample.min() >= 0.5 and sample.max() <= 1.0
        counts = np.histogram(sample, bins=edges)[0]
        assert stats.chisquare(counts, expected * counts.sum() / expected.sum()).pvalue > 1e-3, counts
    with pytest.raises(ValueError, match="p=0"):
        mixup(jax.random.key(0), jnp.asarray(IMAGES), jnp.asarray(LABELS), p=0)


def test_the_train_step_mixes_images_and_labels():
    """With mixup_p the step's loss is the soft cross-entropy of the model on the mixed batch."""
    import optax
    from flax import nnx

    from moe_course.configs import get_preset
    from moe_course.models import build_model
    from moe_course.train.objectives import soft_cross_entropy
    from moe_course.train.steps import make_train_step

    config = get_preset("vit", "i1k-tiny").replace(image_size=16, patch_size=8, depth=1)
    model = build_model(config, rngs=nnx.Rngs(0))
    model.head.kernel[...] = jax.random.normal(jax.random.key(2), model.head.kernel.shape)  # non-uniform logits
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx = optax.sgd(0.0)
    step = make_train_step(graphdef, tx, mixup_p=0.2, num_classes=10)
    images = jax.random.uniform(jax.random.key(1), (4, 16, 16, 3))
    batch = {"image": images, "label": jnp.array([1, 2, 3, 4])}
    key = jax.random.key(7)
    _, _, metrics = step(params, rest, tx.init(params), batch, key)
    _, mixed, soft = mixup(key, images, jax.nn.one_hot(batch["label"], 10), p=0.2)
    want = soft_cross_entropy(model(mixed).logits, soft)
    np.testing.assert_allclose(metrics["task_loss"], want, rtol=1e-5)
    with pytest.raises(ValueError, match="mixup_p=0.2 applies to classification"):
        make_train_step(graphdef, tx, mixup_p=0.2)
