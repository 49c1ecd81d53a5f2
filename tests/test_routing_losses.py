"""V-MoE auxiliary losses (App. A.2): importance, load, L_aux, against hand computations with numpy/scipy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.stats import norm

from moe_course.routing import (
    AUX_LOSS_WEIGHT,
    add_router_noise,
    auxiliary_losses,
    importance_loss,
    importance_per_expert,
    load_loss,
    load_per_expert,
    selection_probability,
    squared_coefficient_of_variation,
)


def np_softmax(z):
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def cv2(values):
    """(std / mean)^2 with the population std, as Eq. 2 and Eq. 6."""
    return np.std(values) ** 2 / np.mean(values) ** 2


def hand_importance_loss(logits):
    logits = np.asarray(logits, np.float64)
    return np.mean([cv2(np_softmax(group).sum(0)) for group in logits])


def hand_load_loss(logits, noisy, k, sigma):
    logits, noisy = np.asarray(logits, np.float64), np.asarray(noisy, np.float64)
    losses = []
    for g in range(logits.shape[0]):
        load = np.zeros(logits.shape[-1])
        for t in range(logits.shape[1]):
            threshold = sorted(noisy[g, t], reverse=True)[k - 1]  # k-th largest noisy logit, Eq. 3
            for e in range(logits.shape[-1]):
                load[e] += 1.0 - norm.cdf((threshold - logits[g, t, e]) / sigma)  # Eq. 4, summed: Eq. 5
        losses.append(cv2(load))  # Eq. 6
    return np.mean(losses)


@pytest.fixture
def logits_and_noise():
    logits = jax.random.normal(jax.random.key(0), (3, 12, 4)) * 0.3
    noisy = add_router_noise(logits, jax.random.key(1))
    return logits, noisy


def test_importance_equals_hand_computation(logits_and_noise):
    logits, _ = logits_and_noise
    np.testing.assert_allclose(importance_per_expert(logits), np_softmax(np.asarray(logits, np.float64)).sum(1), rtol=1e-6)
    np.testing.assert_allclose(importance_loss(logits), hand_importance_loss(logits), rtol=1e-5)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_load_equals_hand_computation(logits_and_noise, k):
    logits, noisy = logits_and_noise
    np.testing.assert_allclose(load_loss(logits, noisy, k), hand_load_loss(logits, noisy, k, 1 / 4), rtol=1e-5)
    np.testing.assert_allclose(
        load_loss(logits, noisy, k, noise_std=0.5), hand_load_loss(logits, noisy, k, 0.5), rtol=1e-5
    )


def test_aux_loss_is_the_mean_of_both_and_the_weight_is_001(logits_and_noise):
    logits, noisy = logits_and_noise
    out = auxiliary_losses(logits, noisy, 2)
    imp, load = hand_importance_loss(logits), hand_load_loss(logits, noisy, 2, 1 / 4)
    np.testing.assert_allclose(out.importance, imp, rtol=1e-5)
    np.testing.assert_allclose(out.load, load, rtol=1e-5)
    np.testing.assert_allclose(out.total, 0.5 * imp + 0.5 * load, rtol=1e-5)
    assert AUX_LOSS_WEIGHT == 0.01


def test_losses_are_per_group_then_averaged():
    # Group 0 balanced, group 1 not: the mean of the per-group losses differs from the loss of the pooled tokens.
    logits = jnp.array([[[2.0, 0.0], [0.0, 2.0]], [[2.0, 0.0], [2.0, 0.0]]])
    per_group = [hand_importance_loss(logits[:1]), hand_importance_loss(logits[1:])]
    assert per_group[0] == pytest.approx(0.0, abs=1e-12)
    np.testing.assert_allclose(importance_loss(logits), np.mean(per_group), rtol=1e-6)
    assert abs(np.mean(per_group) - hand_importance_loss(logits.reshape(1, 4, 2))) > 0.1


def test_table_3_balanced_importance_but_an_expert_never_selected():
    """App. A.2, Table 3 (k = 1): weights (0.9, 0.5, 0.1) and (0.1, 0.5, 0.9) alternate. Every expert has the
    same importance, but expert 2 is never the TOP-1: the importance loss is 0, the load loss is not."""
    rows = np.array([[0.9, 0.5, 0.1], [0.1, 0.5, 0.9]] * 2)
    logits = jnp.asarray(np.log(rows)[None], jnp.float32)  # softmax(log w) = w / 1.5, same ranking as w
    np.testing.assert_allclose(importance_per_expert(logits), [[4 / 3, 4 / 3, 4 / 3]], rtol=1e-6)
    assert float(importance_loss(logits)) == pytest.approx(0.0, abs=1e-6)
    # No noise: threshold = the token's largest logit; sigma = 1/3.
    p_middle = 1 - norm.cdf((np.log(0.9) - np.log(0.5)) * 3)
    p_low = 1 - norm.cdf((np.log(0.9) - np.log(0.1)) * 3)
    load = np.array([2 * 0.5 + 2 * p_low, 4 * p_middle, 2 * 0.5 + 2 * p_low])
    np.testing.assert_allclose(load_per_expert(logits, logits, 1), [load], rtol=1e-5)
    assert float(load_loss(logits, logits, 1)) == pytest.approx(cv2(load), rel=1e-5)
    assert float(load_loss(logits, logits, 1)) > 0.3


def test_the_expert_owning_the_threshold_is_compared_with_its_own_noisy_logit():
    """Eq. 3-4 use one threshold per token, the k-th largest noisy logit, for every expert. For the expert that
    owns it, p = 1 - Phi(eps_own / sigma), independent of that expert's own logit (zero gradient)."""
    logits = jnp.array([[[0.3, 0.1, -0.2, 0.25]]])
    eps = jnp.array([[[0.05, -0.1, 0.02, -0.03]]])  # noisy: 0.35, 0.0, -0.18, 0.22 -> k=2 threshold owner: 3
    p = selection_probability(logits, logits + eps, 2, noise_std=0.25)
    np.testing.assert_allclose(p[0, 0, 3], 1 - norm.cdf(-0.03 / 0.25), rtol=1e-6)
    np.testing.assert_allclose(p[0, 0, 0], 1 - norm.cdf((0.22 - 0.3) / 0.25), rtol=1e-6)
    # The owner's probability does not move with the logits (the noise is held fixed).
    p_of = jax.jit(jax.jacobian(lambda l: selection_probability(l, l + eps, 2, noise_std=0.25)[0, 0]))
    jacobian = p_of(logits)  # (experts, 1, 1, experts): d p_e / d logits
    grad = jacobian[3]
    np.testing.assert_array_equal(grad, np.zeros_like(grad))
    # The others' do, through both their own logit and the threshold.
    grad = jacobian[1]
    assert grad[0, 0, 1] > 0 and grad[0, 0, 3] < 0 and grad[0, 0, 0] == 0 and grad[0, 0, 2] == 0


def test_gradients_are_finite_at_perfect_balance():
    logits = jnp.zeros((3, 12, 4))
    grads = jax.jit(jax.grad(lambda l: auxiliary_losses(l, l, 1).total))(logits)
    assert np.all(np.isfinite(grads))
    np.testing.assert_allclose(squared_coefficient_of_variation(jnp.array([2.0, 2.0, 2.0])), 0.0, atol=1e-7)


def test_invalid_loss_inputs_name_the_field():
    logits = jnp.zeros((1, 4, 3))
    with pytest.raises(ValueError, match="logits"):
        importance_loss(logits[0])
    with pytest.raises(ValueError, match="noisy_logits"):
        load_loss(logits, logits[:, :2], 1)
    with pytest.raises(ValueError, match="k="):
        load_loss(logits, logits, 4)
    with pytest.raises(ValueError, match="k="):
        auxiliary_losses(logits, logits, 0)
    with pytest.raises(ValueError, match="noise_std="):
        load_loss(logits, logits, 1, noise_std=0.0)
