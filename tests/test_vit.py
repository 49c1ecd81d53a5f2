import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from moe_course.configs import VIT_PRESETS, ViTConfig, config_from_dict, config_to_dict, get_preset
from moe_course.layers import attention_weights
from moe_course.models import ViT, patchify


def test_output_shapes_and_attention_maps(tiny_vit_config):
    model = ViT(tiny_vit_config, rngs=nnx.Rngs(0))
    out = model(jnp.ones((3, 16, 16, 1)), return_attention=True)
    assert out.logits.shape == (3, 10)
    assert len(out.attention) == 2 and out.attention[0].shape == (3, 2, 16, 16)
    np.testing.assert_allclose(out.attention[1].sum(-1), 1.0, rtol=1e-5)
    assert model(jnp.ones((3, 16, 16, 1))).attention == ()


def test_cls_token_adds_one_token(tiny_vit_config):
    model = ViT(tiny_vit_config.replace(pool="cls"), rngs=nnx.Rngs(0))
    assert model(jnp.ones((1, 16, 16, 1)), return_attention=True).attention[0].shape[-1] == 17


def test_patch_embedding_is_a_linear_map_of_patches(tiny_vit_config):
    model = ViT(tiny_vit_config, rngs=nnx.Rngs(0))
    images = jax.random.uniform(jax.random.key(1), (2, 16, 16, 1))
    kernel = model.patch_embed.proj.kernel[...]  # (p, p, C, D)
    expected = patchify(images, 4) @ kernel.reshape(-1, kernel.shape[-1]) + model.patch_embed.proj.bias[...]
    np.testing.assert_allclose(model.patch_embed(images), expected, atol=1e-5)


def test_attention_weights_match_literal_softmax():
    q, k = jax.random.normal(jax.random.key(0), (2, 1, 5, 2, 4))
    w = attention_weights(q, k)
    literal = np.zeros((1, 2, 5, 5))
    for h in range(2):
        s = np.asarray(q[0, :, h]) @ np.asarray(k[0, :, h]).T / 2.0
        literal[0, h] = np.exp(s) / np.exp(s).sum(-1, keepdims=True)
    np.testing.assert_allclose(w, literal, rtol=1e-5)


def test_same_seed_same_model(tiny_vit_config):
    a = ViT(tiny_vit_config, rngs=nnx.Rngs(3))(jnp.ones((1, 16, 16, 1))).logits
    b = ViT(tiny_vit_config, rngs=nnx.Rngs(3))(jnp.ones((1, 16, 16, 1))).logits
    np.testing.assert_array_equal(a, b)


def test_dropout_needs_training_mode(tiny_vit_config):
    model = ViT(tiny_vit_config.replace(dropout=0.5), rngs=nnx.Rngs(0))
    model.head.kernel[...] = jax.random.normal(jax.random.key(0), model.head.kernel.shape)
    x = jax.random.uniform(jax.random.key(2), (2, 16, 16, 1))
    np.testing.assert_array_equal(model(x).logits, model(x).logits)
    a = model(x, deterministic=False, rngs=nnx.Rngs(1)).logits
    b = model(x, deterministic=False, rngs=nnx.Rngs(2)).logits
    assert not np.allclose(a, b)


@pytest.mark.parametrize(
    "changes, message",
    [({"patch_size": 5}, "patch_size=5 does not divide image_size=16"), ({"heads": 3}, "heads=3"),
     ({"pool": "max"}, "pool='max'"), ({"depth": 0}, "depth=0"), ({"dropout": 1.0}, "dropout=1.0"),
     ({"colour": 1}, "unknown ViTConfig field")],
)
def test_invalid_config_names_field(tiny_vit_config, changes, message):
    with pytest.raises(ValueError, match=message):
        tiny_vit_config.replace(**changes)


def test_wrong_image_shape_is_a_clear_error(tiny_vit_config):
    with pytest.raises(ValueError, match="expects"):
        ViT(tiny_vit_config, rngs=nnx.Rngs(0))(jnp.ones((1, 32, 32, 1)))


def test_presets_lookup_and_round_trip():
    assert get_preset("vit", "ViT-B/16").width == 768
    with pytest.raises(ValueError, match="preset='vit-q/16'.*allowed: .*digits-tiny"):
        get_preset("vit", "vit-q/16")
    for cfg in VIT_PRESETS.values():
        assert config_from_dict(config_to_dict(cfg)) == cfg
    assert isinstance(config_from_dict(config_to_dict(ViTConfig())), ViTConfig)
