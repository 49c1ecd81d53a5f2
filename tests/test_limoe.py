"""LIMoE one-tower model (Sec. 2.2), its contrastive loss (Eq. 1) and its config checks."""

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from moe_course.configs import LIMoEConfig, config_from_dict, config_to_dict, get_preset
from moe_course.models import LIMoE, build_model, pruned_experts, temporary_routing
from moe_course.routing import batch_prioritized_allocation
from moe_course.train.contrastive import contrastive_loss


@pytest.fixture(scope="module")
def tiny():
    """16 image tokens (16x16, patches of 4) + 8 text tokens, 4 experts in block 1, groups of 2 pairs."""
    return LIMoEConfig(name="test-limoe", image_size=16, patch_size=4, channels=1, width=16, depth=2, heads=2,
                       mlp_dim=32, num_classes=10, num_experts=4, group_size=2, capacity_ratio=1.0, vocab_size=20,
                       seq_len=8, embed_dim=8, text_tau=math.log(2), image_tau=math.log(3))


@pytest.fixture(scope="module")
def pairs():
    images = jax.random.uniform(jax.random.key(0), (4, 16, 16, 1))
    text = jax.random.randint(jax.random.key(1), (4, 8), 2, 20).astype(jnp.int32)
    lengths = jnp.array([8, 5, 3, 6])
    mask = jnp.arange(8)[None] < lengths[:, None]
    return images, jnp.where(mask, text, 0), mask


def literal_eq1(zi, zt, temperature):
    """LIMoE Eq. 1 written out pair by pair: mean_j of the two halves."""
    zi, zt = np.asarray(zi, np.float64), np.asarray(zt, np.float64)
    n = len(zi)
    total = 0.0
    for j in range(n):
        own = math.exp(zi[j] @ zt[j] / temperature)
        to_texts = sum(math.exp(zi[j] @ zt[k] / temperature) for k in range(n))
        to_images = sum(math.exp(zi[k] @ zt[j] / temperature) for k in range(n))
        total += -0.5 * math.log(own / to_texts) - 0.5 * math.log(own / to_images)
    return total / n


def test_contrastive_loss_equals_the_literal_per_pair_loop():
    zi = jax.random.normal(jax.random.key(2), (5, 6))
    zt = jax.random.normal(jax.random.key(3), (5, 6))
    zi, zt = zi / jnp.linalg.norm(zi, axis=1, keepdims=True), zt / jnp.linalg.norm(zt, axis=1, keepdims=True)
    for scale in (1.0, 10.0, 37.0):
        loss, metrics = contrastive_loss(zi, zt, jnp.log(scale))
        np.testing.assert_allclose(loss, literal_eq1(zi, zt, 1.0 / scale), rtol=1e-5)
        np.testing.assert_allclose(0.5 * (metrics["image_to_text"] + metrics["text_to_image"]), loss, rtol=1e-6)
    with pytest.raises(ValueError, match="same shape"):
        contrastive_loss(zi, zt[:4], jnp.log(10.0))


def test_temperature_starts_at_10_kept_as_a_log_and_is_learned(tiny, pairs):
    model = LIMoE(tiny, rngs=nnx.Rngs(0))
    np.testing.assert_allclose(model.log_temperature[...], math.log(10.0), rtol=1e-6)
    images, text, mask = pairs
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def loss_fn(params):
        out = nnx.merge(graphdef, params, rest)(images, text, mask)
        return contrastive_loss(out.image_embedding, out.text_embedding, out.log_temperature)[0]

    grads = jax.jit(jax.grad(loss_fn))(params)
    assert abs(float(grads["log_temperature"][...])) > 1e-6


def test_embeddings_are_unit_vectors_and_modalities_do_not_attend_to_each_other(tiny, pairs):
    dense = LIMoE(tiny.replace(placement="none"), rngs=nnx.Rngs(0))
    images, text, mask = pairs
    joint = dense(images, text, mask)
    np.testing.assert_allclose(jnp.linalg.norm(joint.image_embedding, axis=1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(jnp.linalg.norm(joint.text_embedding, axis=1), 1.0, rtol=1e-5)
    # One tower, two separate computations: each modality alone gives the same embedding.
    np.testing.assert_allclose(dense(images=images).image_embedding, joint.image_embedding, atol=1e-5)
    np.testing.assert_allclose(dense(text=text, text_mask=mask).text_embedding, joint.text_embedding, atol=1e-5)
    other = dense(images, jnp.flip(text, 0), jnp.flip(mask, 0))
    np.testing.assert_allclose(other.image_embedding, joint.image_embedding, atol=1e-5)


def test_padding_changes_nothing_and_takes_no_expert_slot(tiny, pairs):
    model = LIMoE(tiny, rngs=nnx.Rngs(0))
    images, text, mask = pairs
    noisy_pad = jnp.where(mask, text, jax.random.randint(jax.random.key(5), text.shape, 2, 20))
    a = model(images, text, mask, deterministic=False, rngs=nnx.Rngs(7))
    b = model(images, noisy_pad, mask, deterministic=False, rngs=nnx.Rngs(7))
    np.testing.assert_allclose(a.text_embedding, b.text_embedding, atol=1e-5)
    np.testing.assert_allclose(a.image_embedding, b.image_embedding, atol=1e-5)
    for name in a.aux_terms:
        np.testing.assert_allclose(a.aux_terms[name], b.aux_terms[name], rtol=1e-5, err_msg=name)
    (record,) = a.routing
    padding = (a.modality == -1).reshape(record.served.shape[:2])
    assert int(padding.sum()) == int((~mask).sum()) > 0
    assert not bool(record.served[padding].any())
    np.testing.assert_array_equal(record.expert_fill.sum(1), record.served.sum((1, 2)))


def test_aux_loss_is_the_layers_mean_of_weight_times_mean_of_terms(tiny, pairs):
    model = LIMoE(tiny, rngs=nnx.Rngs(0))
    out = model(*pairs)
    # The paper's five terms: importance and load over all real tokens, entropy losses per modality.
    assert set(out.aux_terms) == {"importance", "load", "image/global_entropy", "text/local_entropy",
                                  "text/global_entropy"}
    np.testing.assert_allclose(out.aux_loss, 0.04 * np.mean([float(v) for v in out.aux_terms.values()]), rtol=1e-5)
    dense = LIMoE(tiny.replace(placement="none"), rngs=nnx.Rngs(0))(*pairs)
    assert float(dense.aux_loss) == 0.0 and dense.routing == ()


def test_bpr_with_a_token_mask_serves_real_tokens_as_if_padding_were_absent():
    gates = jax.random.uniform(jax.random.key(4), (1, 10, 1))
    experts = jax.random.randint(jax.random.key(6), (1, 10, 1), 0, 3)
    mask = jnp.array([[True, False, True, True, False, True, True, False, True, True]])
    masked = batch_prioritized_allocation(experts, gates, 2, 3, token_mask=mask)
    kept = np.flatnonzero(np.asarray(mask[0]))
    alone = batch_prioritized_allocation(experts[:, kept], gates[:, kept], 2, 3)
    np.testing.assert_array_equal(masked.slot[:, kept], alone.slot)
    assert (np.asarray(masked.slot[0, ~np.asarray(mask[0])]) == -1).all()
    assert np.asarray(masked.priority_rank[0, ~np.asarray(mask[0])]).min() == len(kept)  # ranked last


@pytest.mark.parametrize("changes, field", [
    ({"text_aux_losses": ("local_entropy", "entropy")}, "text_aux_losses has unknown loss 'entropy'"),
    ({"image_aux_losses": ("nope",)}, "image_aux_losses has unknown loss 'nope'"),
    ({"joint_aux_losses": ("local_entropy",)}, "joint_aux_losses has unknown loss 'local_entropy'"),
    ({"joint_aux_losses": "importance"}, "joint_aux_losses='importance' is not allowed"),
    ({"text_tau": float("nan")}, "text_tau=nan"),
    ({"image_tau": float("inf")}, "image_tau=inf"),
    ({"noise_std": 0.0}, "noise_std=0 leaves the load loss undefined"),
    ({"seq_len": 0}, "seq_len=0"),
    ({"vocab_size": 1}, "vocab_size=1"),
    ({"pool": "cls"}, "pool='cls'"),
    ({"allocation": "experts_choice"}, "allocation='experts_choice'"),
    ({"placement": "all"}, "placement='all'"),
])
def test_bad_config_gives_a_one_line_error_naming_the_field(tiny, changes, field):
    with pytest.raises(ValueError, match=field) as info:
        build_model(LIMoEConfig(**{**tiny.__dict__, **changes}), rngs=nnx.Rngs(0))
    assert "\n" not in str(info.value)


def test_thresholds_at_or_below_zero_are_allowed_and_switch_the_global_loss_off(tiny, pairs):
    config = tiny.replace(text_tau=0.0, image_tau=-1.0).validate()
    out = LIMoE(config, rngs=nnx.Rngs(0))(*pairs)
    assert float(out.aux_terms["text/global_entropy"]) == float(out.aux_terms["image/global_entropy"]) == 0.0


def test_presets_validate_and_round_trip():
    for name in ("digits-limoe", "digits-limoe-classic", "digits-dense-one-tower", "limoe-b/16", "limoe-l/16",
                 "limoe-b/16-classic", "limoe-l/16-classic", "dense-one-tower-b/16", "digits-limoe-local"):
        config = get_preset("limoe", name).validate()
        assert config_from_dict(config_to_dict(config)) == config
        assert config.aux_loss_weight == 0.04 and config.joint_aux_losses == ("importance", "load"), name
        # The paper's mix (Sec. 2.2.2), Fig. 3's classic baseline, or its middle step (+ local entropy on text).
        ladder = {"classic": ((), ()), "local": (("local_entropy",), ())}
        text, image = ladder.get(name.rsplit("-", 1)[-1], (("local_entropy", "global_entropy"), ("global_entropy",)))
        assert (config.text_aux_losses, config.image_aux_losses) == (text, image), name
    paper = get_preset("limoe", "limoe-b/16")
    assert (paper.num_experts, paper.k, paper.allocation, paper.seq_len, paper.embed_dim) == (32, 1, "bpr", 16, 512)
    np.testing.assert_allclose([paper.text_tau, paper.image_tau, paper.aux_loss_weight], [math.log(9), math.log(20), 0.04])
    assert get_preset("limoe", "digits-dense-one-tower").moe_blocks() == ()


def test_pruned_experts_route_only_to_kept_experts_and_restore_the_model(tiny, pairs):
    model = LIMoE(tiny, rngs=nnx.Rngs(0))
    images, text, mask = pairs
    full = model(images, text, mask)
    with pruned_experts(model, [np.ones(4, bool)], mode="router_drop"):
        same = model(images, text, mask)  # keeping every expert changes nothing
    np.testing.assert_allclose(same.text_embedding, full.text_embedding, atol=1e-6)
    keep = np.array([True, False, True, False])
    with pruned_experts(model, [keep], mode="router_pred"):
        (pred,) = model(images, text, mask).routing
    with pruned_experts(model, [keep], mode="router_drop"):
        (drop,) = model(images, text, mask).routing
    assert set(np.unique(np.asarray(pred.expert_index))) == {0, 2}
    np.testing.assert_array_equal(pred.expert_index, drop.expert_index)  # same experts, different gates
    assert float(jnp.max(drop.gates - pred.gates)) > 0
    np.testing.assert_allclose(model(images, text, mask).text_embedding, full.text_embedding, atol=1e-6)
    assert model.moe_layers()[0].expert_keep is None


@pytest.mark.parametrize("keep, mode, message", [
    ([np.ones(4, bool)], "router_guess", "mode='router_guess'"),
    ([np.ones(4, bool)] * 2, "router_pred", "keep has 2 masks"),
    ([np.ones(3, bool)], "router_pred", "keep[0] has shape (3,)"),
    ([np.zeros(4, bool)], "router_pred", "with 0 kept experts"),
])
def test_pruned_experts_bad_input_changes_nothing(tiny, keep, mode, message):
    model = LIMoE(tiny, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match=re.escape(message)):
        with pruned_experts(model, keep, mode=mode):
            pass
    assert model.moe_layers()[0].expert_keep is None


def test_with_routing_changes_a_limoe_capacity(tiny, pairs):
    model = LIMoE(tiny, rngs=nnx.Rngs(0))
    with temporary_routing(model, capacity_ratio=4.0):
        (record,) = model(*pairs).routing
        assert bool(record.served[model(*pairs).modality.reshape(record.served.shape[:2]) >= 0].all())
    assert model.config.capacity_ratio == 1.0 and model.moe_layers()[0].capacity_ratio == 1.0
