"""Soft MoE routing (Eq. 1-3) against a literal loop over slots and tokens; normalisation, shapes and errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moe_course.routing import (
    apply_soft_experts,
    l2_normalize,
    soft_combine_weights,
    soft_dispatch_weights,
    soft_logits,
    soft_routing,
)

G, T, D, E, P = 2, 5, 6, 3, 2  # groups, tokens, width, experts, slots per expert


def _inputs(seed=0, scale=1.7):
    kx, kp = jax.random.split(jax.random.key(seed))
    return 3.0 * jax.random.normal(kx, (G, T, D)), jax.random.normal(kp, (D, E * P)), scale


def _expert(i, v):
    """A different nonlinear function per expert: tanh(v * (i + 1)) + i."""
    return np.tanh(v * (i + 1)) + i


def _literal(x, phi, scale):
    """Eq. 1-3 one scalar at a time: cosine logits, column and row softmaxes, slot sums, expert calls."""
    x, phi = np.asarray(x, np.float64), np.asarray(phi, np.float64)
    y = np.zeros_like(x)
    for g in range(G):
        logits = np.zeros((T, E * P))
        for t in range(T):
            for j in range(E * P):
                xn = x[g, t] / np.sqrt((x[g, t] ** 2).sum() + 1e-6)
                pn = phi[:, j] / np.sqrt((phi[:, j] ** 2).sum() + 1e-6)
                logits[t, j] = scale * (xn * pn).sum()
        slot_out = np.zeros((E * P, D))
        for j in range(E * P):
            d = np.exp(logits[:, j]) / np.exp(logits[:, j]).sum()  # softmax over the tokens
            slot_in = sum(d[t] * x[g, t] for t in range(T))  # raw tokens
            slot_out[j] = _expert(j // P, slot_in)
        for t in range(T):
            c = np.exp(logits[t]) / np.exp(logits[t]).sum()  # softmax over all slots
            y[g, t] = sum(c[j] * slot_out[j] for j in range(E * P))
    return y


def test_soft_moe_equals_literal_loop():
    x, phi, scale = _inputs()
    routing = soft_routing(x, phi, scale)
    expert_fn = lambda slots: jnp.stack([_expert(i, slots[:, i]) for i in range(E)], axis=1)
    y = apply_soft_experts(x, routing, expert_fn, E)
    assert y.shape == (G, T, D)
    np.testing.assert_allclose(np.asarray(y), _literal(x, phi, scale), rtol=1e-5, atol=1e-5)


def test_dispatch_columns_and_combine_rows_sum_to_one():
    routing = soft_routing(*_inputs(1))
    assert routing.dispatch_weights.shape == routing.combine_weights.shape == (G, T, E * P)
    np.testing.assert_allclose(routing.dispatch_weights.sum(axis=1), 1.0, rtol=1e-6)  # over tokens, per slot
    np.testing.assert_allclose(routing.combine_weights.sum(axis=2), 1.0, rtol=1e-6)  # over slots, per token
    assert float(routing.dispatch_weights.min()) > 0 and float(routing.combine_weights.min()) > 0
    # The two axes really differ: D's rows and C's columns do not sum to 1.
    assert not np.allclose(routing.dispatch_weights.sum(axis=2), 1.0)
    assert not np.allclose(routing.combine_weights.sum(axis=1), 1.0)


def test_logits_are_scaled_cosines_and_ignore_token_norm():
    x, phi, _ = _inputs(2)
    logits = soft_logits(x, phi, 1.0)
    assert float(jnp.abs(logits).max()) <= 1.0 + 1e-6  # at init (scale 1) |logits| <= 1: near-uniform D and C
    np.testing.assert_allclose(soft_logits(10.0 * x, 7.0 * phi, 1.0), logits, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(soft_logits(x, phi, 4.0), 4.0 * logits, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(jnp.linalg.norm(l2_normalize(x), axis=-1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(jnp.linalg.norm(l2_normalize(phi, axis=0), axis=0), 1.0, rtol=1e-5)


def test_slots_combine_raw_tokens():
    """Scaling the tokens leaves D unchanged and scales the slots: the experts see the raw magnitudes."""
    x, phi, scale = _inputs(3)
    identity = lambda slots: slots
    y1 = apply_soft_experts(x, soft_routing(x, phi, scale), identity, E)
    y5 = apply_soft_experts(5.0 * x, soft_routing(5.0 * x, phi, scale), identity, E)
    np.testing.assert_allclose(y5, 5.0 * y1, rtol=1e-5, atol=1e-5)


def test_gradients_reach_phi_and_scale():
    x, phi, scale = _inputs(4)

    def loss(phi, scale):
        return (apply_soft_experts(x, soft_routing(x, phi, scale), jnp.tanh, E) ** 2).sum()

    g_phi, g_scale = jax.grad(loss, argnums=(0, 1))(phi, jnp.asarray(scale))
    assert float(jnp.abs(g_phi).min()) > 0 and abs(float(g_scale)) > 0


def test_softmax_axes_directly():
    logits = jnp.arange(2 * 3 * 4, dtype=jnp.float32).reshape(2, 3, 4) / 7
    np.testing.assert_allclose(soft_dispatch_weights(logits), jax.nn.softmax(logits, axis=1))
    np.testing.assert_allclose(soft_combine_weights(logits), jax.nn.softmax(logits, axis=2))


@pytest.mark.parametrize("x_shape, phi_shape, match", [
    ((G, T, D), (D + 1, 4), "width=6"),
    ((T, D), (D, 4), "x has shape"),
    ((G, T, D), (D, 4, 1), "phi has shape"),
])
def test_shape_errors_name_the_field(x_shape, phi_shape, match):
    with pytest.raises(ValueError, match=match):
        soft_logits(jnp.ones(x_shape), jnp.ones(phi_shape))


def test_other_errors():
    with pytest.raises(ValueError, match="dtype"):
        soft_logits(jnp.ones((G, T, D), jnp.int32), jnp.ones((D, 4)))
    x, phi, scale = _inputs()
    with pytest.raises(ValueError, match="num_experts=4 does not divide the 6 slots"):
        apply_soft_experts(x, soft_routing(x, phi, scale), jnp.tanh, 4)
    with pytest.raises(ValueError, match="num_experts=0"):
        apply_soft_experts(x, soft_routing(x, phi, scale), jnp.tanh, 0)
