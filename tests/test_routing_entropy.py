"""LIMoE auxiliary losses (Sec. 2.2.2, App. B.1, App. E.1) against hand computations and known extremes."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scipy.stats import norm

from moe_course.routing import (
    JOINT_LOSSES,
    LIMOE_AUX_WEIGHT,
    MODALITIES,
    PER_MODALITY_LOSSES,
    entropy,
    global_entropy_loss,
    importance_loss,
    load_loss,
    local_entropy_loss,
    merged_entropy_loss,
    multimodal_aux_losses,
    mutual_information_loss,
    router_z_loss,
    target_entropy_loss,
)

BIG = 60.0  # a logit gap that makes the softmax one-hot in float32


def np_softmax(z):
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def np_entropy(p):
    p = np.asarray(p, np.float64)
    return -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1)), 0.0), axis=-1)


def one_hot_logits(experts, num_experts):
    """(groups, tokens) expert ids -> logits whose softmax is one-hot on them."""
    return jnp.asarray(BIG * np.eye(num_experts)[np.asarray(experts)], jnp.float32)


@pytest.fixture
def batch():
    """3 groups of 10 tokens, 6 experts; modality: image (0), text (1) or padding (-1)."""
    logits = jax.random.normal(jax.random.key(0), (3, 10, 6)) * 1.5
    modality = np.array([[0] * 6 + [1] * 3 + [-1]] * 3, np.int32)
    modality[1, 6:] = 0  # group 1 holds no text at all
    return logits, jnp.asarray(modality)


def hand_local(logits, mask):
    logits, mask = np.asarray(logits, np.float64), np.asarray(mask)
    per_group = [np_entropy(np_softmax(g[m])).mean() for g, m in zip(logits, mask) if m.any()]
    return np.mean(per_group)


def hand_marginal_entropies(logits, mask):
    logits, mask = np.asarray(logits, np.float64), np.asarray(mask)
    return [np_entropy(np_softmax(g[m]).mean(0)) for g, m in zip(logits, mask) if m.any()]


def test_entropy_extremes():
    np.testing.assert_allclose(entropy(jnp.full((4,), 0.25)), math.log(4), rtol=1e-6)
    assert float(entropy(jnp.array([0.0, 1.0, 0.0]))) == 0.0


def test_local_entropy_extremes_and_hand_computation(batch):
    logits, modality = batch
    np.testing.assert_allclose(local_entropy_loss(jnp.zeros((2, 5, 8))), math.log(8), rtol=1e-6)
    assert float(local_entropy_loss(one_hot_logits([[0, 3, 3], [1, 1, 2]], 4))) < 1e-6
    for m in (0, 1):
        mask = modality == m
        np.testing.assert_allclose(local_entropy_loss(logits, mask), hand_local(logits, mask), rtol=1e-5)


def test_global_entropy_extremes_and_hand_computation(batch):
    logits, modality = batch
    # Every token one-hot on the same expert: the marginal is one-hot, H = 0.
    assert abs(float(global_entropy_loss(one_hot_logits([[2, 2, 2, 2]], 4)))) < 1e-6
    # One-hot tokens spread evenly over all experts: H(marginal) = log E, the minimum -log E.
    np.testing.assert_allclose(global_entropy_loss(one_hot_logits([[0, 1, 2, 3]], 4)), -math.log(4), rtol=1e-5)
    for m in (0, 1):
        mask = modality == m
        np.testing.assert_allclose(global_entropy_loss(logits, mask),
                                   -np.mean(hand_marginal_entropies(logits, mask)), rtol=1e-5)


def test_threshold_switches_the_global_loss_off_exactly_above_tau():
    # Tokens one-hot on experts 0, 0, 1, 2: marginal (1/2, 1/4, 1/4, 0), H = 1.5 log 2.
    logits = one_hot_logits([[0, 0, 1, 2]], 4)
    h = 1.5 * math.log(2)
    np.testing.assert_allclose(global_entropy_loss(logits), -h, rtol=1e-5)
    np.testing.assert_allclose(global_entropy_loss(logits, tau=h + 0.1), 0.1, rtol=1e-3)
    assert float(global_entropy_loss(logits, tau=h - 1e-3)) == 0.0
    soft = jax.random.normal(jax.random.key(3), (2, 8, 4))
    h_soft = float(-global_entropy_loss(soft))
    grad_on = jax.grad(lambda z: global_entropy_loss(z, tau=h_soft + 0.05))(soft)
    grad_off = jax.grad(lambda z: global_entropy_loss(z, tau=0.5 * h_soft))(soft)
    assert float(jnp.abs(grad_on).sum()) > 1e-4
    assert float(jnp.abs(grad_off).sum()) == 0.0


@pytest.mark.parametrize("tau", [float("nan"), float("inf"), -float("inf"), "log 2", True])
def test_tau_must_be_a_finite_number(tau):
    with pytest.raises(ValueError, match="tau="):
        global_entropy_loss(jnp.zeros((1, 2, 3)), tau=tau)


@pytest.mark.parametrize("tau", [0.0, -0.5])
def test_tau_at_or_below_zero_switches_the_global_loss_off(tau):
    # max(0, tau - H) with H >= 0: zero for every routing, even a full collapse (H = 0), and no gradient.
    collapsed = one_hot_logits([[1, 1, 1, 1]], 4)
    soft = jax.random.normal(jax.random.key(11), (2, 8, 4))
    for logits in (collapsed, soft):
        assert float(global_entropy_loss(logits, tau=tau)) == 0.0
        assert float(jnp.abs(jax.grad(lambda z: global_entropy_loss(z, tau=tau))(logits)).sum()) == 0.0
    assert float(global_entropy_loss(collapsed, tau=0.1)) > 0.0  # just above 0 it is on again


def test_target_entropy_k_gt_1():
    # Each token spread evenly over exactly 2 experts: Omega_local = log 2, the K = 2 target is met.
    two_way = jnp.asarray([[[0.0, 0.0, -BIG, -BIG], [-BIG, 0.0, 0.0, -BIG]]])
    assert float(target_entropy_loss(two_way, k=2)) < 1e-6
    np.testing.assert_allclose(target_entropy_loss(one_hot_logits([[0, 1]], 4), k=2), math.log(2) ** 2, rtol=1e-5)
    logits = jax.random.normal(jax.random.key(1), (2, 7, 5))
    expected = np.mean([(math.log(3) - np_entropy(np_softmax(np.asarray(g, np.float64))).mean()) ** 2 for g in logits])
    np.testing.assert_allclose(target_entropy_loss(logits, k=3), expected, rtol=1e-5)


def test_merged_entropy_k_gt_1():
    # All the weight on some 2 experts, split however: merged entropy 0.
    split = jnp.log(jnp.asarray([[[0.7, 0.3, 1e-30, 1e-30], [1e-30, 0.1, 0.9, 1e-30]]]))
    assert float(merged_entropy_loss(split, k=2)) < 1e-5
    # Uniform over E = 4 with K = 1: binary entropy of (1/4, 3/4).
    q = 0.25
    np.testing.assert_allclose(merged_entropy_loss(jnp.zeros((1, 3, 4)), k=1),
                               -(q * math.log(q) + (1 - q) * math.log(1 - q)), rtol=1e-5)
    logits = jax.random.normal(jax.random.key(2), (2, 7, 5))
    p = np_softmax(np.asarray(logits, np.float64))
    top = np.sort(p, -1)[..., -2:].sum(-1)
    expected = np.mean(np_entropy(np.stack([top, 1 - top], -1)).mean(-1))
    np.testing.assert_allclose(merged_entropy_loss(logits, k=2), expected, rtol=1e-5)


def test_mutual_information_extremes_and_hand_computation(batch):
    # Images one-hot on expert 0, texts on expert 1: disjoint experts, -MI = -log 2.
    disjoint = one_hot_logits([[0, 0, 1, 1]], 3)
    modality = jnp.asarray([[0, 0, 1, 1]], jnp.int32)
    np.testing.assert_allclose(mutual_information_loss(disjoint, modality, 2), -math.log(2), rtol=1e-5)
    # Same distribution for both modalities: MI = 0.
    assert abs(float(mutual_information_loss(jnp.zeros((1, 4, 3)), modality, 2))) < 1e-6
    logits, modality = batch
    expected = []
    for g in range(3):
        marginals = [np_softmax(np.asarray(logits[g], np.float64)[np.asarray(modality[g]) == m]).mean(0)
                     for m in (0, 1) if (np.asarray(modality[g]) == m).any()]
        if len(marginals) == 2:  # group 1 has no text: no loss there
            expected.append(np.mean([np_entropy(p) for p in marginals]) - np_entropy(np.mean(marginals, 0)))
    np.testing.assert_allclose(mutual_information_loss(logits, modality, 2), np.mean(expected), rtol=1e-5)


def test_classic_losses_with_a_mask_equal_the_loss_on_the_kept_tokens():
    logits = jax.random.normal(jax.random.key(4), (2, 8, 4))
    noisy = logits + 0.1 * jax.random.normal(jax.random.key(5), logits.shape)
    mask = jnp.broadcast_to(jnp.arange(8) < 5, (2, 8))
    np.testing.assert_allclose(importance_loss(logits, mask), importance_loss(logits[:, :5]), rtol=1e-6)
    np.testing.assert_allclose(load_loss(logits, noisy, 1, mask=mask), load_loss(logits[:, :5], noisy[:, :5], 1),
                               rtol=1e-6)
    z = np.log(np.exp(np.asarray(logits[:, :5], np.float64)).sum(-1)) ** 2
    np.testing.assert_allclose(router_z_loss(logits, mask), z.mean(), rtol=1e-5)


def hand_joint_classic(logits, noisy, modality, k, sigma):
    """Importance, load and z-loss over each group's real tokens of BOTH modalities, written out as loops
    (V-MoE App. A.2 Eq. 1-6, ST-MoE's z-loss, LIMoE App. B.1), then averaged over groups with real tokens."""
    logits, noisy = np.asarray(logits, np.float64), np.asarray(noisy, np.float64)
    groups, tokens, experts = logits.shape
    out = {"importance": [], "load": [], "z_loss": []}
    for g in range(groups):
        real = [t for t in range(tokens) if modality[g][t] != -1]  # image and text alike; padding never
        if not real:
            continue
        imp, load, z = np.zeros(experts), np.zeros(experts), 0.0
        for t in real:
            imp += np_softmax(logits[g, t])
            threshold = sorted(noisy[g, t], reverse=True)[k - 1]
            for e in range(experts):
                load[e] += 1.0 - norm.cdf((threshold - logits[g, t, e]) / sigma)
            z += math.log(sum(math.exp(a) for a in logits[g, t])) ** 2
        out["importance"].append(np.var(imp) / np.mean(imp) ** 2)
        out["load"].append(np.var(load) / np.mean(load) ** 2)
        out["z_loss"].append(z / len(real))
    return {name: np.mean(values) for name, values in out.items()}


@pytest.mark.parametrize("k", [1, 2])
def test_joint_classic_losses_equal_a_literal_loop_over_all_real_tokens(batch, k):
    logits, modality = batch
    noisy = logits + 0.3 * jax.random.normal(jax.random.key(12), logits.shape)
    out = multimodal_aux_losses(logits, noisy, modality, losses={}, joint=("importance", "load", "z_loss"), k=k,
                                noise_std=0.3, weight=1.0)
    expected = hand_joint_classic(logits, noisy, np.asarray(modality), k, 0.3)
    assert set(out.terms) == set(expected)
    for name, value in expected.items():
        np.testing.assert_allclose(out.terms[name], value, rtol=2e-5, err_msg=name)
    np.testing.assert_allclose(out.total, np.mean(list(expected.values())), rtol=2e-5)
    # Joint is not the mean of the per-modality losses: they are different numbers on this batch.
    per = multimodal_aux_losses(logits, noisy, modality, losses={"image": ("importance",), "text": ("importance",)})
    for name in ("image/importance", "text/importance"):
        assert abs(float(per.terms[name]) - float(out.terms["importance"])) > 1e-3, name


def test_sec_2_2_1_collapsed_text_barely_moves_the_joint_classic_losses():
    # LIMoE Sec. 2.2.1 with B/16's numbers: 32 experts, 196 image tokens spread evenly (round robin: 28
    # experts get 6, 4 get 7), all 16 text tokens on expert 0 -- text collapsed, its expert overflowing.
    experts, image, text = 32, 196, 16
    logits = one_hot_logits([np.r_[np.arange(image) % experts, np.zeros(text, int)]], experts)
    modality = jnp.asarray([[0] * image + [1] * text], jnp.int32)
    joint = multimodal_aux_losses(logits, logits, modality, losses={}, joint=("importance", "load"))
    per_modality = multimodal_aux_losses(logits, logits, modality, losses={m: ("importance", "load") for m in MODALITIES})
    # Importance and load range over [0, E - 1]; the joint ones stay within 1% of it, so the paper's classic
    # losses hardly see the collapse ...
    for name in ("importance", "load"):
        assert float(joint.terms[name]) < 0.01 * (experts - 1), joint.terms
    # ... while the per-modality text terms sit at their maximum E - 1 (every text token on one expert).
    for name in ("text/importance", "text/load"):
        np.testing.assert_allclose(per_modality.terms[name], experts - 1, rtol=1e-5)
    assert float(per_modality.total) > 50 * float(joint.total)
    # The exact joint importance: per-expert sums 6 (28x), 7 (3x), 7 + 16 (expert 0) -> CV^2 of that vector.
    imp = np.r_[np.full(28, 6.0), np.full(3, 7.0), 23.0]
    np.testing.assert_allclose(joint.terms["importance"], np.var(imp) / np.mean(imp) ** 2, rtol=1e-5)


ALL_LOSSES = {"image": PER_MODALITY_LOSSES, "text": PER_MODALITY_LOSSES}
TAUS = {"image": math.log(5), "text": math.log(2)}


@jax.jit
def _all_terms(logits, modality, noisy=None):
    return multimodal_aux_losses(logits, logits if noisy is None else noisy, modality, losses=ALL_LOSSES, taus=TAUS,
                                 joint=JOINT_LOSSES, k=2, noise_std=0.2)


def test_padding_tokens_change_no_loss(batch):
    logits, modality = batch
    padded = jnp.where((modality == -1)[..., None], 0.0, logits)
    wild = jnp.where((modality == -1)[..., None], 50.0 * jax.random.normal(jax.random.key(9), logits.shape), logits)
    a, b = _all_terms(padded, modality), _all_terms(wild, modality)
    assert set(a.terms) == {f"{m}/{n}" for m in MODALITIES for n in PER_MODALITY_LOSSES} | set(JOINT_LOSSES)
    for name in a.terms:
        np.testing.assert_allclose(a.terms[name], b.terms[name], rtol=1e-6, err_msg=name)
    grad = jax.grad(lambda z: _all_terms(z, modality).total)(logits)
    assert float(jnp.abs(grad[modality == -1]).max()) == 0.0


def test_total_is_weight_times_mean_of_the_chosen_terms(batch):
    logits, modality = batch
    out = multimodal_aux_losses(logits, logits, modality, losses={"text": ("local_entropy", "global_entropy"),
                                "image": ("global_entropy",)}, taus={"text": math.log(9), "image": math.log(20)},
                                noise_std=0.0)
    assert set(out.terms) == {"text/local_entropy", "text/global_entropy", "image/global_entropy"}
    np.testing.assert_allclose(out.total, LIMOE_AUX_WEIGHT * np.mean([float(v) for v in out.terms.values()]),
                               rtol=1e-6)
    np.testing.assert_allclose(out.terms["text/global_entropy"],
                               global_entropy_loss(logits, modality == 1, tau=math.log(9)), rtol=1e-6)
    assert float(multimodal_aux_losses(logits, logits, modality, losses={}).total) == 0.0


def test_gradients_reach_the_router_weights_through_every_term(batch):
    _, modality = batch
    x = jax.random.normal(jax.random.key(6), (3, 10, 5))
    w = jax.random.normal(jax.random.key(7), (5, 6)) * 0.3
    noise = 0.2 * jax.random.normal(jax.random.key(8), (3, 10, 6))
    grads = jax.jit(jax.jacrev(lambda w: _all_terms(x @ w, modality, x @ w + noise).terms))(w)
    for name, grad in grads.items():
        assert bool(jnp.all(jnp.isfinite(grad))), name
        if name not in ("image/global_entropy", "text/global_entropy"):  # thresholded: may be switched off
            assert float(jnp.abs(grad).sum()) > 1e-6, name


def test_one_hot_extremes_give_finite_gradients():
    logits = one_hot_logits([[0, 1, 1, 2]], 4)
    modality = jnp.asarray([[0, 0, 1, 1]], jnp.int32)
    grad = jax.grad(lambda z: _all_terms(z, modality).total)(logits)
    assert bool(jnp.all(jnp.isfinite(grad)))


def test_selection_errors_name_the_field(batch):
    logits, modality = batch
    with pytest.raises(ValueError, match="losses\\['text'\\] has unknown loss 'entropy'"):
        multimodal_aux_losses(logits, logits, modality, losses={"text": ("entropy",)})
    with pytest.raises(ValueError, match="modality 'audio' is not known"):
        multimodal_aux_losses(logits, logits, modality, losses={"audio": ("load",)})
    with pytest.raises(ValueError, match="joint has unknown loss 'local_entropy'"):
        multimodal_aux_losses(logits, logits, modality, losses={}, joint=("local_entropy",))
    with pytest.raises(ValueError, match="tau=nan"):
        multimodal_aux_losses(logits, logits, modality, losses={"text": ("global_entropy",)},
                              taus={"text": float("nan")})
    with pytest.raises(ValueError, match="names a loss twice"):
        multimodal_aux_losses(logits, logits, modality, losses={"text": ("load", "load")})
