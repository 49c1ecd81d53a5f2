"""Recorded weights (moe_course.train.weights_file) and the backbone chapter 6 loads."""

import numpy as np
import pytest
from flax import nnx

from moe_course.configs import get_preset
from moe_course.data import load_dataset
from moe_course.models import ViT
from moe_course.settings import RECORDED_BACKBONE
from moe_course.train import evaluate
from moe_course.train.weights_file import load_weights, parameter_arrays, save_weights


def test_saved_weights_load_into_a_fresh_model_bit_for_bit(tiny_vit_config, tmp_path):
    trained, fresh = ViT(tiny_vit_config, rngs=nnx.Rngs(1)), ViT(tiny_vit_config, rngs=nnx.Rngs(2))
    save_weights(trained, tmp_path / "w.npz")
    assert not list(tmp_path.glob("*.partial"))
    load_weights(fresh, tmp_path / "w.npz")
    ours, theirs = parameter_arrays(trained), parameter_arrays(fresh)
    assert ours.keys() == theirs.keys() and all(np.array_equal(ours[k], theirs[k]) for k in ours)


def test_weights_of_another_shape_are_refused_by_name(tiny_vit_config, tmp_path):
    save_weights(ViT(tiny_vit_config, rngs=nnx.Rngs(1)), tmp_path / "w.npz")
    wider = ViT(tiny_vit_config.replace(mlp_dim=48), rngs=nnx.Rngs(1))
    with pytest.raises(ValueError, match=r"w.npz: parameter 'blocks.0.mlp.fc1.bias' has shape \(32,\), but our"):
        load_weights(wider, tmp_path / "w.npz")
    with pytest.raises(FileNotFoundError):
        load_weights(wider, tmp_path / "missing.npz")


def test_the_recorded_chapter_6_backbone_has_learned():
    config = get_preset("vit", "digits-24-p4")
    model = load_weights(ViT(config, rngs=nnx.Rngs(0)), RECORDED_BACKBONE)
    digits = load_dataset("digits", image_size=config.image_size)
    assert evaluate(model, digits, "test", batch_size=525)["accuracy"] >= 0.85
