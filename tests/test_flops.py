"""Analytic FLOP counts against a hand count on a small config (one multiply-add = 2 FLOPs, matmuls only)."""

import pytest

from moe_course.analysis import flops_breakdown, flops_per_image
from moe_course.configs import SoftMoEConfig, ViTConfig, VMoEConfig, get_preset
from moe_course.configs.vit import backbone_of

pytestmark = pytest.mark.filterwarnings("ignore::moe_course.routing.CapacityRoundingWarning")

# 8x8 images, 4x4 patches: T = 4 tokens of width D = 8, 2 blocks, MLP hidden H = 16, 3 classes.
BACKBONE = dict(image_size=8, patch_size=4, channels=1, width=8, depth=2, heads=2, mlp_dim=16, num_classes=3,
                pool="gap")
# By hand: embed 2*4*16*8 = 1024; attention per block 8*4*8*8 + 4*4*4*8 = 2560; MLP per block 4*4*8*16 = 2048;
# head 2*8*3 = 48.
DENSE = 1024 + 2 * 2560 + 2 * 2048 + 48


def test_dense_vit_hand_count():
    config = ViTConfig(**BACKBONE)
    assert flops_breakdown(config) == {"embed": 1024, "attention": 5120, "mlp": 4096, "moe": 0, "head": 48}
    assert flops_per_image(config) == DENSE == 10288


def test_tokens_and_experts_choice_hand_count():
    # MoE in block 1: E = 2, k = 1, C = 1, groups of 2 images = 8 tokens -> B = 4 slots per expert and group,
    # E*B/2 = 4 expert slots per image. Router 2*4*8*2 = 128, experts 4 * 4*8*16 = 2048, combine 2*4*k'*8.
    config = VMoEConfig(**BACKBONE, num_experts=2, k=1, capacity_ratio=1.0, moe_last_n=1, group_size=2)
    assert flops_breakdown(config)["moe"] == 128 + 2048 + 64
    assert flops_per_image(config) == DENSE - 2048 + 128 + 2048 + 64
    experts_choice = config.replace(allocation="experts_choice")  # combine over k' = E = 2 choices
    assert flops_breakdown(experts_choice)["moe"] == 128 + 2048 + 128
    # C = 2 doubles the buffers, and the experts run on every slot, full or empty.
    assert flops_breakdown(config.replace(capacity_ratio=2.0))["moe"] == 128 + 2 * 2048 + 64


def test_soft_moe_hand_count():
    # Second half = block 1: n = 2 experts x p = 2 slots = S = 4. Logits, D^T X, C Y~: 3 * 2*4*8*4 = 768;
    # experts on 4 slots: 4 * 4*8*16 = 2048.
    config = SoftMoEConfig(**BACKBONE, num_experts=2, slots_per_expert=2, group_size=1)
    assert config.moe_blocks() == (1,)
    assert flops_breakdown(config)["moe"] == 768 + 2048
    assert flops_per_image(config) == DENSE + 768
    # The sparse router in the same family counts as V-MoE: groups of 1 image, B = 4 / 2 = 2 per expert.
    sparse = config.replace(router="sparse", k=1, capacity_ratio=1.0)
    assert flops_breakdown(sparse)["moe"] == 2 * 4 * 8 * 2 + 4 * 4 * 8 * 16 + 2 * 4 * 8


def test_soft_moe_cost_is_set_by_slots_not_experts():
    s16 = get_preset("soft-moe", "soft-moe-s/16")
    more = s16.replace(num_experts=512, slots_per_expert=1)
    fewer_experts = s16.replace(num_experts=32, slots_per_expert=4)  # same 128 slots
    assert flops_per_image(fewer_experts) == flops_per_image(s16) < flops_per_image(more)
    dense = backbone_of(s16)
    # 128 slots for 197 tokens: the experts do less work than the dense MLP; the routing products add some.
    assert 0.9 < flops_per_image(s16) / flops_per_image(dense) < 1.1


def test_representation_layer_and_errors():
    config = ViTConfig(**BACKBONE, representation_size=5)
    assert flops_breakdown(config)["head"] == 2 * 8 * 5 + 2 * 5 * 3
    with pytest.raises(ValueError, match="heads=3"):
        flops_per_image(ViTConfig(**{**BACKBONE, "heads": 3}))


def test_one_tower_pair_hand_count():
    # 4 patches + 4 text positions = T = 8 tokens per pair, D = 8, H = 16, embed_dim 5; MoE in block 1 with
    # E = 2, k = 1, C = 1, groups of 2 pairs = 16 tokens -> B = 8 slots per expert: 8 expert slots per pair.
    from moe_course.configs import LIMoEConfig

    limoe = LIMoEConfig(**{**BACKBONE, "num_classes": 10}, num_experts=2, k=1, capacity_ratio=1.0, moe_last_n=1,
                        placement="last-n", group_size=2, seq_len=4, vocab_size=50, embed_dim=5)
    attention = 8 * 8 * 8 * 8 + 4 * 8 * 8 * 8  # projections 8 T D^2 + the two T x T products 4 T^2 D
    expected = {"embed": 1024, "attention": 2 * attention, "mlp": 4 * 8 * 8 * 16,
                "moe": 2 * 8 * 8 * 2 + 8 * 4 * 8 * 16 + 2 * 8 * 1 * 8, "head": 2 * 2 * 8 * 5}
    assert flops_breakdown(limoe) == expected
    dense = limoe.replace(placement="none")
    assert flops_breakdown(dense) == {**expected, "mlp": 2 * 4 * 8 * 8 * 16, "moe": 0}
    # C = 1, k = 1: the experts do one dense MLP's work, so the two differ only by the router and the combine.
    assert flops_per_image(limoe) - flops_per_image(dense) == 2 * 8 * 8 * 2 + 2 * 8 * 8


def test_glyphs_presets_share_one_backbone_at_equal_forward_flops():
    """The parameter-bound regime compares four models that differ only in their MoE blocks' MLPs, at the dense
    model's forward FLOPs (within 5%: the routers and, for Soft MoE, dispatch and combine)."""
    import argparse

    from moe_course.cli import _dataset_name
    from moe_course.recipes import recipe_for

    dense = get_preset("vit", "glyphs-tiny")
    models = [get_preset("vmoe", "glyphs-tiny-moe"), get_preset("vmoe", "glyphs-tiny-ec"),
              get_preset("soft-moe", "glyphs-tiny-soft")]
    assert [m.allocation for m in models[:2]] == ["bpr", "experts_choice"] and models[2].router == "soft"
    for model in models:
        assert backbone_of(model).replace(name=dense.name) == dense
        assert 1.0 < flops_per_image(model) / flops_per_image(dense) < 1.05
        assert model.num_experts == 16 and model.moe_blocks() == (1, 3)
        assert _dataset_name(argparse.Namespace(dataset=None), model) == "digit-glyphs"
        assert recipe_for(model) == recipe_for(dense) and recipe_for(dense).steps == 8000  # one schedule for all
    assert _dataset_name(argparse.Namespace(dataset=None), get_preset("vit", "digits-tiny")) == "digits"
