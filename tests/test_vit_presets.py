"""The paper presets have the papers' parameter counts (counted from shapes only, nothing allocated)."""

from __future__ import annotations

import pytest

from moe_course.configs.vit import JFT_CLASSES, VIT_PRESETS
from moe_course.models import vit_param_count

# V-MoE (Riquelme et al. 2021) Table 7, dense ViTs with an 18,291-way JFT-300M head at 224x224, in millions.
TABLE_7 = {
    "vit-s/32": 36.5,
    "vit-b/32": 102.1,
    "vit-b/16": 100.5,
    "vit-l/32": 325.3,
    "vit-l/16": 323.1,
    "vit-h/14": 655.8,
}


@pytest.mark.parametrize("name", sorted(TABLE_7))
def test_vmoe_table_7_parameter_counts(name):
    config = VIT_PRESETS[name]
    assert config.num_classes == JFT_CLASSES and config.image_size == 224
    count = vit_param_count(config)
    assert count == pytest.approx(TABLE_7[name] * 1e6, rel=0.005), f"{name}: {count / 1e6:.2f}M"


@pytest.mark.parametrize("name", ["deit-ti/16", "deit-s/16"])
def test_deit_counts_equal_transformers(name):
    torch = pytest.importorskip("torch", reason="the PyTorch twins need torch (the torch extra)")
    pytest.importorskip("transformers")
    from transformers.models.vit.modeling_vit import ViTForImageClassification

    from moe_course.torch.convert_vit import hf_config_from_vit

    config = VIT_PRESETS[name]
    with torch.device("meta"):  # shapes only, no memory
        hf_model = ViTForImageClassification(hf_config_from_vit(config))
    assert all(p.is_meta for p in hf_model.parameters())
    assert vit_param_count(config) == sum(p.numel() for p in hf_model.parameters())


def test_deit_counts_match_the_paper():
    # DeiT (Touvron et al. 2021) Table 1: DeiT-Ti 5M, DeiT-S 22M parameters.
    assert vit_param_count(VIT_PRESETS["deit-ti/16"]) == pytest.approx(5.7e6, rel=0.01)
    assert vit_param_count(VIT_PRESETS["deit-s/16"]) == pytest.approx(22.1e6, rel=0.01)
