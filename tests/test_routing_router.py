"""The router: g(x) = TOP_k(softmax(W x + eps)) (V-MoE Sec. 2.3) and the softmax(TOP_k) ablation (App. A.1)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moe_course.routing import (
    add_router_noise,
    default_noise_std,
    router_probabilities,
    top_k_routing,
    vanilla_allocation,
    apply_experts,
)

# One (groups, tokens, experts) shape for most routing tests: JAX compiles each operation once per shape, and
# those compilations are most of the run time on CPU.
SHAPE = (3, 12, 4)


def np_softmax(z):
    z = np.asarray(z, np.float64)
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def literal_top_k(values, k):
    """Per row: the k largest entries, larger first, equal entries in increasing index order."""
    values = np.asarray(values)
    index = np.zeros(values.shape[:-1] + (k,), np.int64)
    for pos in np.ndindex(values.shape[:-1]):
        row = values[pos]
        ranked = sorted(range(len(row)), key=lambda e: -row[e])  # sorted() is stable: ties keep index order
        index[pos] = ranked[:k]
    return index


@pytest.mark.parametrize("k", [1, 2, 3])
def test_softmax_then_topk_gates_are_unrenormalised_softmax_values(k):
    logits = jax.random.normal(jax.random.key(0), SHAPE)
    out = top_k_routing(logits, k)
    probs = np_softmax(logits)
    index = literal_top_k(probs, k)
    assert out.expert_index.shape == (3, 12, k) and out.expert_index.dtype == jnp.int32
    assert out.gates.shape == (3, 12, k) and out.gates.dtype == jnp.float32
    np.testing.assert_array_equal(out.expert_index, index)
    np.testing.assert_allclose(out.gates, np.take_along_axis(probs, index, -1), rtol=1e-6)
    np.testing.assert_allclose(out.probs, probs, rtol=1e-6)
    if k < SHAPE[-1]:
        assert np.all(np.asarray(out.gates).sum(-1) < 1.0 - 1e-3)  # not renormalised over the k choices


def test_ties_go_to_the_lower_expert_index():
    logits = jnp.array([[[1.0, 3.0, 3.0, 0.0, 3.0], [2.0, 2.0, 2.0, 2.0, 2.0]]])
    out = top_k_routing(logits, 3)
    np.testing.assert_array_equal(out.expert_index, [[[1, 2, 4], [0, 1, 2]]])
    # Many random ties: logits drawn from 3 values.
    logits = jax.random.randint(jax.random.key(1), SHAPE, 0, 3).astype(jnp.float32)
    for order in ("softmax_then_topk", "topk_then_softmax"):
        np.testing.assert_array_equal(top_k_routing(logits, 3, order=order).expert_index, literal_top_k(logits, 3))


@pytest.mark.parametrize("k", [1, 2])
def test_topk_then_softmax_renormalises_over_the_selected_logits(k):
    logits = jax.random.normal(jax.random.key(2), SHAPE)
    out = top_k_routing(logits, k, order="topk_then_softmax")
    index = literal_top_k(logits, k)
    np.testing.assert_array_equal(out.expert_index, index)
    np.testing.assert_allclose(out.gates, np_softmax(np.take_along_axis(np.asarray(logits), index, -1)), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(out.gates).sum(-1), 1.0, rtol=1e-6)


def test_no_key_no_noise_and_the_same_key_the_same_noise():
    logits = jax.random.normal(jax.random.key(3), SHAPE)
    np.testing.assert_array_equal(add_router_noise(logits), logits)
    np.testing.assert_array_equal(top_k_routing(logits, 2).noisy_logits, logits)
    a = top_k_routing(logits, 2, jax.random.key(7))
    b = top_k_routing(logits, 2, jax.random.key(7))
    c = top_k_routing(logits, 2, jax.random.key(8))
    np.testing.assert_array_equal(a.noisy_logits, b.noisy_logits)
    assert not np.allclose(a.noisy_logits, c.noisy_logits)
    # The gates are the top-k of the softmax of exactly those noisy logits.
    noisy = add_router_noise(logits, jax.random.key(7))
    np.testing.assert_array_equal(a.noisy_logits, noisy)
    np.testing.assert_allclose(a.probs, np_softmax(noisy), rtol=1e-6)
    np.testing.assert_allclose(router_probabilities(logits, jax.random.key(7)), a.probs, rtol=1e-6)
    np.testing.assert_array_equal(add_router_noise(logits, jax.random.key(7), noise_std=0.0), logits)


@pytest.mark.parametrize("num_experts, noise_std", [(8, None), (32, None), (4, 0.3)])
def test_noise_is_centred_with_std_one_over_e(num_experts, noise_std):
    zeros = jnp.zeros((4, 5000, num_experts))
    eps = np.asarray(add_router_noise(zeros, jax.random.key(0), noise_std=noise_std))
    expected = 1.0 / num_experts if noise_std is None else noise_std
    assert default_noise_std(num_experts) == pytest.approx(1.0 / num_experts)
    # n >= 80,000 samples: the sample std is within ~0.25 % (1 sigma) of the true one; allow 2 %.
    assert abs(eps.std() / expected - 1.0) < 0.02
    assert abs(eps.mean()) < 5 * expected / np.sqrt(eps.size)
    # Entry-wise independent: neighbouring experts are uncorrelated.
    assert abs(np.corrcoef(eps[..., 0].ravel(), eps[..., 1].ravel())[0, 1]) < 0.02


def test_gradient_reaches_the_router_with_k1_only_in_the_vmoe_order():
    """App. A.1: with softmax(TOP_1) the gate is always 1, so the router gets no gradient; TOP_1(softmax) does."""
    x = jax.random.normal(jax.random.key(4), (3, 12, 2))
    logits = jax.random.normal(jax.random.key(5), SHAPE)

    def loss(logits, order):
        out = top_k_routing(logits, 1, order=order)
        allocation = vanilla_allocation(out.expert_index, out.gates, 12, 4)  # nothing dropped
        return jnp.sum(apply_experts(x, allocation, lambda z: 2.0 * z + 1.0) ** 2)

    grad = jax.jit(jax.grad(loss), static_argnums=1)
    g_vmoe, g_shazeer = grad(logits, "softmax_then_topk"), grad(logits, "topk_then_softmax")
    assert np.all(np.isfinite(g_vmoe))
    assert np.all(np.abs(g_vmoe).sum(-1) > 1e-4)  # every token's router row gets a gradient
    np.testing.assert_array_equal(g_shazeer, np.zeros_like(g_shazeer))


def test_router_is_jittable():
    logits = jax.random.normal(jax.random.key(6), SHAPE)
    f = jax.jit(top_k_routing, static_argnames=("k", "noise_std", "order"))
    a, b = f(logits, k=2, key=jax.random.key(1)), top_k_routing(logits, 2, jax.random.key(1))
    np.testing.assert_array_equal(a.expert_index, b.expert_index)
    np.testing.assert_allclose(a.gates, b.gates, rtol=1e-6)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(k=0), "k="),
        (dict(k=5), "k="),
        (dict(k=1.0), "k="),
        (dict(k=2, order="topk_softmax"), "order="),
        (dict(k=2, noise_std=-0.1), "noise_std="),
        (dict(k=2, noise_std=float("nan")), "noise_std="),
    ],
)
def test_invalid_router_arguments_name_the_field(kwargs, field):
    logits = jnp.zeros((1, 3, 4))
    with pytest.raises(ValueError, match=field):
        top_k_routing(logits, key=jax.random.key(0), **kwargs)


def test_integer_logits_are_rejected():
    with pytest.raises(ValueError, match="logits"):
        top_k_routing(jnp.zeros((1, 3, 4), jnp.int32), 1)
