"""The Soft MoE layer and ViT: special cases, batch independence, the router switch, presets, errors and CLI."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from moe_course.cli import main
from moe_course.configs import get_preset
from moe_course.configs.soft_moe import SOFT_MOE_PRESETS, SoftMoEConfig
from moe_course.layers import Experts, MoEOutput, SoftMoE, SoftRoutingRecord, SparseMoE
from moe_course.models import SoftMoEViT, build_model, soft_moe_param_count, vit_param_count
from moe_course.configs.vit import backbone_of

pytestmark = pytest.mark.filterwarnings("ignore::moe_course.routing.CapacityRoundingWarning")

forward = nnx.jit(lambda module, x: module(x))  # one compile per module: faster than op-by-op dispatch

TINY = SoftMoEConfig(name="test-soft", image_size=16, patch_size=4, channels=1, width=16, depth=4, heads=2,
                     mlp_dim=32, num_classes=10, pool="gap", num_experts=4, slots_per_expert=2, group_size=2)


def _experts_on_tokens(layer, x):
    """The layer's single expert applied to every token directly: (batch, tokens, width)."""
    return layer.experts(x[:, None])[:, 0]


def test_one_expert_one_slot_per_token_is_the_mlp_when_routing_is_a_permutation():
    """n = 1, p = T: with orthonormal tokens, phi = the tokens and a large scale, D = C = I and Soft MoE is the MLP."""
    tokens, width = 4, 8
    layer = SoftMoE(width, 16, 1, slots_per_expert=tokens, rngs=nnx.Rngs(0))
    x = jnp.eye(tokens, width)[None]  # token t = unit vector e_t
    layer.phi[...] = jnp.eye(tokens, width).T  # slot j's parameters = token j
    layer.scale[...] = jnp.asarray(60.0)
    out = forward(layer, x)
    np.testing.assert_allclose(out.routing.dispatch_weights[0], np.eye(tokens), atol=1e-6)
    np.testing.assert_allclose(out.output, _experts_on_tokens(layer, x), rtol=1e-5, atol=1e-5)


def test_one_expert_at_scale_zero_gives_every_token_the_expert_of_the_mean_token():
    """Uniform weights (scale 0): every slot is the mean token, so every output token is f(mean token)."""
    layer = SoftMoE(8, 16, 1, slots_per_expert=3, rngs=nnx.Rngs(1))
    layer.scale[...] = jnp.asarray(0.0)
    x = jax.random.normal(jax.random.key(0), (2, 5, 8))
    out = layer(x)
    expected = _experts_on_tokens(layer, x.mean(axis=1, keepdims=True))
    np.testing.assert_allclose(out.output, jnp.broadcast_to(expected, x.shape), rtol=1e-5, atol=1e-5)


def test_layer_record_and_init():
    layer = SoftMoE(16, 32, 4, slots_per_expert=2, rngs=nnx.Rngs(0))
    assert layer.phi.shape == (16, 8) and float(layer.scale[...]) == 1.0 and isinstance(layer.experts, Experts)
    out = layer(jax.random.normal(jax.random.key(1), (3, 6, 16)))
    assert isinstance(out, MoEOutput) and isinstance(out.routing, SoftRoutingRecord)
    assert out.output.shape == (3, 6, 16) and float(out.aux_loss) == 0.0
    assert out.routing.dispatch_weights.shape == (3, 6, 8)
    # At init the logits are cosines in [-1, 1]: every dispatch weight is within a factor e^2 of uniform.
    assert float(out.routing.dispatch_weights.max() / out.routing.dispatch_weights.min()) <= np.exp(2) + 1e-4


@pytest.mark.parametrize("width, experts, slots", [(64, 8, 4), (32, 64, 1)])
def test_phi_is_drawn_as_vmoes_mu_with_fan_in_experts_times_width(width, experts, slots):
    """vmoe draws mu (width, experts, slots) lecun-normal: fan-in experts * width, not width (SPEC section 4)."""
    layer = SoftMoE(width, 8, experts, slots_per_expert=slots, rngs=nnx.Rngs(params=3))
    mu = nnx.initializers.lecun_normal()(nnx.Rngs(params=3).params(), (width, experts, slots))
    np.testing.assert_array_equal(np.asarray(layer.phi[...]), np.asarray(mu).reshape(width, experts * slots))
    std = float(np.std(np.asarray(layer.phi[...])))
    assert abs(std * np.sqrt(experts * width) - 1.0) < 0.1, std  # fan-in width would give sqrt(experts) times this


def _with_random_head(model):
    """The head starts at zero (all logits 0); give it random weights so the logits show the features."""
    model.head.kernel[...] = jax.random.normal(jax.random.key(9), model.head.kernel.shape)
    return model


def test_image_output_does_not_depend_on_the_batch_unlike_tokens_choice():
    images = jax.random.uniform(jax.random.key(0), (4, 16, 16, 1))
    other = images.at[0].set(jax.random.uniform(jax.random.key(1), (16, 16, 1)))  # image 1's group partner
    soft = _with_random_head(build_model(TINY, rngs=nnx.Rngs(0)))
    np.testing.assert_allclose(forward(soft, images).logits[1], forward(soft, other).logits[1], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(forward(soft, images[1:2]).logits[0], forward(soft, images).logits[1], rtol=1e-5,
                               atol=1e-6)
    tokens_choice = _with_random_head(build_model(TINY.replace(router="sparse", k=1, capacity_ratio=1.0),
                                                  rngs=nnx.Rngs(0)))
    # Vanilla routing fills the group's buffers image 0 first: what image 0 sends decides what image 1 keeps.
    assert not np.allclose(forward(tokens_choice, images).logits[1], forward(tokens_choice, other).logits[1],
                           atol=1e-4)


def test_router_switch_keeps_the_backbone():
    soft = build_model(TINY, rngs=nnx.Rngs(0))
    tokens = build_model(TINY.replace(router="sparse", k=1), rngs=nnx.Rngs(0))
    experts = build_model(TINY.replace(router="sparse", k=1, allocation="experts_choice"), rngs=nnx.Rngs(0))
    assert isinstance(soft, SoftMoEViT) and TINY.moe_blocks() == (2, 3)
    assert [type(b.mlp).__name__ for b in soft.blocks] == ["MLP", "MLP", "SoftMoE", "SoftMoE"]
    assert all(isinstance(m, SparseMoE) for m in tokens.moe_layers() + experts.moe_layers())
    images = jax.random.uniform(jax.random.key(0), (4, 16, 16, 1))
    for model in (soft, tokens, experts):
        out = forward(model, images)
        assert out.logits.shape == (4, 10) and len(out.routing) == 2
    assert isinstance(forward(soft, images).routing[0], SoftRoutingRecord)
    # Same parameters except the router: soft has phi (D x n*p) + scale, sparse a D x E router kernel.
    d, e, s = TINY.width, TINY.num_experts, TINY.num_slots
    assert soft_moe_param_count(TINY) - soft_moe_param_count(TINY.replace(router="sparse")) == 2 * (d * s + 1 - d * e)


@pytest.mark.parametrize("name", ["soft-moe-s/16", "soft-moe-b/16", "soft-moe-l/16"])
def test_paper_presets_parameter_counts(name):
    config = get_preset("soft-moe", name)
    assert config.num_experts == 128 and config.slots_per_expert == 1
    assert config.moe_blocks() == tuple(range(config.depth // 2, config.depth))
    dense = vit_param_count(backbone_of(config))
    d, h = config.width, config.mlp_dim
    per_layer = (config.num_experts - 1) * (2 * d * h + h + d) + d * config.num_slots + 1
    assert soft_moe_param_count(config) == dense + len(config.moe_blocks()) * per_layer


def test_presets_registered_and_cpu_preset_runs():
    assert set(SOFT_MOE_PRESETS) >= {"soft-moe-s/16", "soft-moe-b/16", "soft-moe-l/16", "digits-tiny-soft"}
    config = get_preset("soft-moe", "digits-tiny-soft")
    assert config.num_slots == config.num_patches  # as many slots as tokens
    assert config.moe_blocks() == (2, 3) and soft_moe_param_count(config) > vit_param_count(
        get_preset("vit", "digits-tiny"))


@pytest.mark.parametrize("changes, field", [
    (dict(num_experts=0), "num_experts=0"), (dict(slots_per_expert=0), "slots_per_expert=0"),
    (dict(slots_per_expert=1.5), "slots_per_expert=1.5"), (dict(router="hard"), "router='hard'"),
])
def test_config_errors_name_the_field(changes, field):
    with pytest.raises(ValueError, match=field):
        TINY.replace(**changes)


def test_layer_errors_name_the_field():
    with pytest.raises(ValueError, match="num_experts=0"):
        SoftMoE(8, 16, 0, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="slots_per_expert=-1"):
        SoftMoE(8, 16, 2, slots_per_expert=-1, rngs=nnx.Rngs(0))
    layer = SoftMoE(8, 16, 2, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="width=6 of the tokens x does not match phi's 8 rows"):
        jax.jit(lambda x: layer(x).output)(jnp.ones((1, 3, 6)))


def test_cli_trains_soft_moe(tmp_path, capsys):
    workdir = str(tmp_path / "soft")
    common = ["--image-size", "16", "--batch-size", "16", "--steps", "2", "--warmup-steps", "1", "--no-progress"]
    assert main(["train", "soft-moe", "--preset", "digits-tiny-soft", "--workdir", workdir, *common]) == 0
    assert "test_accuracy:" in capsys.readouterr().out
    assert main(["train", "soft-moe", "--preset", "digits-tiny-soft", "--k", "1", "--workdir",
                 str(tmp_path / "k"), *common]) == 2
    assert "--k applies to V-MoE models; this is a Soft MoE (router 'soft')" in capsys.readouterr().err
