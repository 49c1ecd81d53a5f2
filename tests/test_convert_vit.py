"""transformers ViT <-> our Flax NNX ViT: converted weights give the same logits and attention maps.

Models are built from configs with random weights (no network, no from_pretrained of a Hub name); every
parameter is randomised, LayerNorm scales/biases and class/position embeddings included, so no weight is
trivially zero or one and a transposed or misplaced tensor shows in the outputs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the converters need torch and transformers (the torch extra)")
pytest.importorskip("transformers")

import jax  # noqa: E402
from flax import nnx  # noqa: E402
from transformers.models.vit.configuration_vit import ViTConfig as HFViTConfig  # noqa: E402
from transformers.models.vit.modeling_vit import ViTForImageClassification, ViTModel  # noqa: E402

from moe_course.configs.vit import VIT_PRESETS, ViTConfig  # noqa: E402
from moe_course.models import ViT  # noqa: E402
from moe_course.torch.convert_vit import (  # noqa: E402
    hf_config_from_vit,
    installed_layout,
    load_hf_state_dict,
    to_hf_state_dict,
    vit_config_from_hf,
    vit_from_hf,
    vit_to_hf,
)

SMALL = ViTConfig(name="small", image_size=32, patch_size=8, channels=3, width=64, depth=2, heads=4,
                  mlp_dim=128, num_classes=10)
ATOL, RTOL = 1e-4, 1e-5


def randomize_(hf_model) -> None:
    """Every parameter random: matrices ~ N(0, 1/fan_in) (activations stay O(1)), LayerNorm scales
    1 + 0.2 N(0, 1), biases 0.1 N(0, 1), class token and position embeddings 0.5 N(0, 1)."""
    with torch.no_grad():
        for name, p in hf_model.named_parameters():
            if "cls_token" in name or "position_embeddings" in name:
                p.copy_(0.5 * torch.randn_like(p))
            elif p.ndim >= 2:
                p.copy_(torch.randn_like(p) / np.sqrt(p[0].numel()))
            elif "layernorm" in name and name.endswith("weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.1 * torch.randn_like(p))


def abstract_vit(config: ViTConfig) -> ViT:
    """Our ViT with shapes only (nnx.eval_shape): no init compute; a load fills it."""
    return nnx.eval_shape(lambda: ViT(config, rngs=nnx.Rngs(0)))


def random_vit(config: ViTConfig, seed: int) -> ViT:
    """Our ViT with every parameter random, scaled as in randomize_ (our default init has a zero head,
    zero biases and unit LayerNorm scales, which would hide misplaced tensors)."""
    rng = np.random.default_rng(seed)
    model = abstract_vit(config)
    for path, node in nnx.iter_graph(model):
        if not isinstance(node, nnx.Param):
            continue
        shape = node.shape
        if path[-1] in ("cls_token", "pos_embed"):
            value = 0.5 * rng.standard_normal(shape)
        elif path[-1] == "kernel":
            value = rng.standard_normal(shape) / np.sqrt(np.prod(shape[:-1]))
        elif path[-1] == "scale":
            value = 1 + 0.2 * rng.standard_normal(shape)
        else:
            value = 0.1 * rng.standard_normal(shape)
        node.set_value(jax.numpy.asarray(value, dtype=np.float32))
    return model


def make_hf(config: ViTConfig, seed: int = 0, **overrides):
    torch.manual_seed(seed)
    hf_config = hf_config_from_vit(config)
    for key, value in overrides.items():
        setattr(hf_config, key, value)
    hf_config._attn_implementation = "eager"  # attention maps with output_attentions=True
    hf_model = ViTForImageClassification(hf_config).eval()
    randomize_(hf_model)
    return hf_model


def images_for(config: ViTConfig, batch: int = 3, seed: int = 0) -> np.ndarray:
    """(batch, H, W, C) float32 -- NHWC for ours; theirs gets the NCHW transpose."""
    shape = (batch, config.image_size, config.image_size, config.channels)
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def run_both(model: ViT, hf_model, images: np.ndarray):
    with jax.default_matmul_precision("float32"):
        ours = model(images, return_attention=True)
    with torch.no_grad():
        theirs = hf_model(pixel_values=torch.from_numpy(images.transpose(0, 3, 1, 2)), output_attentions=True)
    return ours, theirs


def assert_same_outputs(ours, theirs, *, atol=ATOL) -> None:
    logits = np.asarray(ours.logits)
    assert logits.std() > 0.1, "logits too small for the comparison to mean anything"
    np.testing.assert_allclose(logits, theirs.logits.numpy(), atol=atol, rtol=RTOL)
    assert len(ours.attention) == len(theirs.attentions)
    for i, (a, b) in enumerate(zip(ours.attention, theirs.attentions)):
        assert a.shape == tuple(b.shape), f"block {i}"
        np.testing.assert_allclose(np.asarray(a), b.numpy(), atol=1e-5, rtol=RTOL, err_msg=f"block {i}")


@pytest.fixture(scope="module")
def small():
    hf_model = make_hf(SMALL)
    return hf_model, vit_from_hf(hf_model)


# ------------------------------------------------------------------------------------------- equality


def test_logits_and_attention_maps_match(small):
    hf_model, model = small
    assert model.config == SMALL.replace(name=model.config.name)
    assert_same_outputs(*run_both(model, hf_model, images_for(SMALL)))


def test_deit_ti_shaped_at_224():
    # The full DeiT-Ti (depth 12, width 192, 3 heads, MLP 768) at 224x224 / patch 16 (197 tokens), a
    # 7-way head: ~3 s on 2 CPU cores, since vit_from_hf builds our model abstractly before filling it.
    config = VIT_PRESETS["deit-ti/16"].replace(num_classes=7)
    hf_model = make_hf(config, seed=1)
    model = vit_from_hf(hf_model)
    assert_same_outputs(*run_both(model, hf_model, images_for(config, batch=2, seed=1)))


def test_hub_layer_norm_eps_within_tolerance():
    # Hub ViT configs say layer_norm_eps=1e-12; ours is fixed at 1e-6. Within fp32 tolerance.
    hf_model = make_hf(SMALL, seed=2, layer_norm_eps=1e-12)
    model = vit_from_hf(hf_model)
    assert_same_outputs(*run_both(model, hf_model, images_for(SMALL, seed=2)))


def test_export_to_transformers():
    model = random_vit(SMALL, seed=3)
    hf_model = vit_to_hf(model, attn_implementation="eager")
    assert_same_outputs(*run_both(model, hf_model, images_for(SMALL, seed=3)))


# ------------------------------------------------------------------------------------------ round trips


def test_state_dict_round_trip(small):
    hf_model, model = small
    original = hf_model.state_dict()
    exported = to_hf_state_dict(model)
    assert list(exported) == list(original)
    for key, value in original.items():
        assert exported[key].dtype == value.dtype == torch.float32, key
        assert torch.equal(exported[key], value), key
    ViTForImageClassification(hf_model.config).load_state_dict(exported, strict=True)


def to_legacy(state_dict):
    """transformers 5.x module names -> the legacy names (4.x modules, checkpoint files)."""
    renames = [("vit.layers.", "vit.encoder.layer."), ("attention.q_proj", "attention.attention.query"),
               ("attention.k_proj", "attention.attention.key"), ("attention.v_proj", "attention.attention.value"),
               ("attention.o_proj", "attention.output.dense"), ("mlp.fc1", "intermediate.dense"),
               ("mlp.fc2", "output.dense")]
    out = {}
    for key, value in state_dict.items():
        for old, new in renames:
            key = key.replace(old, new)
        out[key] = value
    return out


def test_legacy_layout_numpy_and_bfloat16(small):
    hf_model, model = small
    modular = to_hf_state_dict(model, layout="modular")
    legacy = to_legacy(modular) if installed_layout() == "modular" else dict(hf_model.state_dict())
    assert any(".encoder.layer.0.attention.attention.query.weight" in k for k in legacy)
    # legacy keys, NumPy values (as safetensors.numpy.load_file gives)
    other = abstract_vit(SMALL)
    load_hf_state_dict(other, {k: v.numpy() for k, v in legacy.items()})
    back = to_hf_state_dict(other, layout="legacy")
    assert set(back) == set(legacy)
    assert all(torch.equal(back[k], legacy[k]) for k in legacy)
    assert all(torch.equal(a, b) for a, b in zip(to_hf_state_dict(other, layout="modular").values(), modular.values()))
    # bfloat16 tensors are accepted and land as float32
    load_hf_state_dict(other, {k: v.to(torch.bfloat16) for k, v in modular.items()})
    got = to_hf_state_dict(other, layout="modular")
    assert all(torch.equal(got[k], v.to(torch.bfloat16).float()) for k, v in modular.items())


def test_vit_model_state_dict_needs_head_false(small):
    hf_model, _ = small
    torch.manual_seed(4)
    backbone = ViTModel(hf_model.config)  # has a pooler, no classifier, keys without "vit."
    assert any(k.startswith("pooler.") for k in backbone.state_dict())
    model = random_vit(SMALL.replace(num_classes=3), seed=4)
    with pytest.raises(ValueError, match=r"missing keys: 'classifier.weight'.*head=False"):
        load_hf_state_dict(model, backbone.state_dict())
    head_before = np.array(model.head.kernel[...])
    load_hf_state_dict(model, backbone.state_dict(), head=False)
    np.testing.assert_array_equal(np.array(model.head.kernel[...]), head_before)
    exported = to_hf_state_dict(model)
    for key, value in backbone.state_dict().items():
        if not key.startswith("pooler."):
            assert torch.equal(exported["vit." + key], value), key


@pytest.mark.parametrize("name", ["small", "deit-ti/16", "deit-s/16", "gray"])
def test_config_round_trip(name):
    config = {"small": SMALL, "gray": SMALL.replace(name="gray", channels=1, image_size=28, patch_size=7)}.get(
        name, VIT_PRESETS.get(name)
    )
    hf_config = hf_config_from_vit(config)
    assert (hf_config.hidden_size, hf_config.num_hidden_layers, hf_config.num_attention_heads,
            hf_config.intermediate_size, hf_config.image_size, hf_config.patch_size, hf_config.num_channels,
            hf_config.num_labels) == (config.width, config.depth, config.heads, config.mlp_dim, config.image_size,
                                      config.patch_size, config.channels, config.num_classes)
    assert (hf_config.hidden_act, hf_config.layer_norm_eps, hf_config.qkv_bias) == ("gelu", 1e-6, True)
    assert hf_config.hidden_dropout_prob == hf_config.attention_probs_dropout_prob == 0
    assert vit_config_from_hf(hf_config, name=config.name) == config
    assert vit_config_from_hf(hf_config).name == "custom"


# -------------------------------------------------------------------------------------------- errors


def test_shape_mismatch_names_the_key(small):
    hf_model, _ = small
    state = dict(hf_model.state_dict())
    key = [k for k in state if k.endswith("1.mlp.fc1.weight") or k.endswith("1.intermediate.dense.weight")][0]
    state[key] = torch.zeros(96, 64)
    _, model = small
    before = to_hf_state_dict(model)
    with pytest.raises(ValueError, match=rf"'{key}': expected shape \(128, 64\), found \(96, 64\)"):
        load_hf_state_dict(model, state)
    # nothing was copied: the model is unchanged after a failed load
    assert all(torch.equal(a, b) for a, b in zip(to_hf_state_dict(model).values(), before.values()))
    with pytest.raises(ValueError, match=r"position_embeddings.*expected shape \(1, 65, 64\), found \(1, 17, 64\)"):
        load_hf_state_dict(abstract_vit(SMALL.replace(patch_size=4)), hf_model.state_dict())


def test_missing_and_unexpected_keys(small):
    hf_model, _ = small
    model = abstract_vit(SMALL)
    state = dict(hf_model.state_dict())
    missing = [k for k in state if k.endswith("layernorm_after.bias")][-1]
    del state[missing]
    with pytest.raises(ValueError, match=rf"missing keys: '{missing}'"):
        load_hf_state_dict(model, state)
    state = dict(hf_model.state_dict(), **{"vit.embeddings.mask_token": torch.zeros(1, 1, 64)})
    with pytest.raises(ValueError, match=r"unexpected keys: 'vit.embeddings.mask_token'"):
        load_hf_state_dict(model, state)
    deeper = abstract_vit(SMALL.replace(depth=3))  # a whole block missing
    with pytest.raises(ValueError, match=r"missing keys: .*2\."):
        load_hf_state_dict(deeper, hf_model.state_dict())
    mixed = dict(hf_model.state_dict(), **{"vit.encoder.layer.0.output.dense.bias": torch.zeros(64)})
    with pytest.raises(ValueError, match="mixes"):
        load_hf_state_dict(model, mixed)
    with pytest.raises(ValueError, match="layout="):
        to_hf_state_dict(model, layout="timm")


def test_inexpressible_configs_rejected(small):
    hf_model, _ = small
    with pytest.raises(ValueError, match="pool='gap'"):
        hf_config_from_vit(SMALL.replace(pool="gap"))
    with pytest.raises(ValueError, match="representation_size=64"):
        hf_config_from_vit(SMALL.replace(representation_size=64))
    gap = abstract_vit(SMALL.replace(pool="gap"))
    with pytest.raises(ValueError, match="pool='gap'"):
        load_hf_state_dict(gap, hf_model.state_dict())
    with pytest.raises(ValueError, match="pool='gap'"):
        to_hf_state_dict(gap)


@pytest.mark.parametrize(
    "changes, field",
    [
        ({"hidden_act": "gelu_new"}, "hidden_act"),
        ({"image_size": [32, 16]}, "image_size"),
        ({"patch_size": (8, 4)}, "patch_size"),
        ({"qkv_bias": False}, "qkv_bias"),
        ({"layer_norm_eps": 1e-3}, "layer_norm_eps"),
        ({"patch_size": 5}, "patch_size"),
        ({"num_attention_heads": 5}, "heads"),
    ],
)
def test_vit_config_from_hf_rejects(changes, field):
    kwargs = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                  image_size=32, patch_size=8, num_labels=10)
    hf_config = HFViTConfig(**kwargs)
    for key, value in changes.items():
        setattr(hf_config, key, value)
    with pytest.raises(ValueError, match=field):
        vit_config_from_hf(hf_config)


def test_package_imports_without_torch():
    code = ("import sys; sys.modules['torch'] = None; sys.modules['transformers'] = None; "
            "import moe_course.torch, moe_course.torch.convert_vit as c; "
            "assert c.installed_layout() == 'legacy'")
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=root, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
