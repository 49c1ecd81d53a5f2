"""The PyTorch models (moe_course.torch.models) equal the Flax NNX models after weight conversion, both ways.

Small configs of every family (ViT, V-MoE, Soft MoE ViT with the soft and a sparse router, MoD ViT with
both routers) with every parameter random: logits, aux losses, routing records and attention maps to 1e-5,
routing decisions exact, parameter gradients to 1e-4; NNX -> PyTorch -> NNX is bit-exact.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the PyTorch twins need torch (pip install 'moe-course[torch]')")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402

from moe_course.configs import MoDConfig, SoftMoEConfig, ViTConfig, VMoEConfig  # noqa: E402
from moe_course.models import build_model, with_routing  # noqa: E402
from moe_course.torch import models as tm  # noqa: E402
from moe_course.torch.convert import (  # noqa: E402
    from_torch,
    load_torch_state_dict,
    parameter_entries,
    to_torch,
    torch_state_dict,
)
from torch_twins import assert_param_grads, assert_same, randomize_nnx, to_torch as tensor  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::moe_course.routing.CapacityRoundingWarning")

SHAPE = dict(image_size=8, patch_size=2, channels=3, width=16, depth=4, heads=2, mlp_dim=24, num_classes=5)
MOE = dict(num_experts=4, group_size=2, placement="every-2")
CONFIGS = {
    "vit-cls": ViTConfig(name="t-vit", pool="cls", representation_size=12, **SHAPE),
    "vmoe-bpr": VMoEConfig(name="t-vmoe", k=2, capacity_ratio=0.5, allocation="bpr", **MOE, **SHAPE),
    "vmoe-vanilla-sum": VMoEConfig(name="t-vmoe2", k=3, capacity_ratio=1.0, aux_loss_reduction="sum",
                                   dispatch="einsum", pool="cls", **MOE, **SHAPE),
    "soft": SoftMoEConfig(name="t-soft", router="soft", slots_per_expert=2, num_experts=4, group_size=1,
                          placement="second-half", **SHAPE),
    "soft-experts-choice": SoftMoEConfig(name="t-ec", router="sparse", allocation="experts_choice",
                                         num_experts=4, group_size=1, placement="second-half", **SHAPE),
    "mod-attention": MoDConfig(name="t-mod", capacity=0.5, router="attention", pool="cls", **SHAPE),
    "mod-standard": MoDConfig(name="t-mod2", capacity=0.25, router="standard", **SHAPE),
    # the tanh GELU of the released big_vision / vmoe checkpoints, in the dense MLPs and the experts
    "vmoe-tanh-gelu": VMoEConfig(name="t-vmoe3", k=1, capacity_ratio=1.0, gelu="tanh", **MOE, **SHAPE),
}


def pair(name: str):
    model = build_model(CONFIGS[name], rngs=nnx.Rngs(0))
    randomize_nnx(model, seed=len(name))
    return model, to_torch(model)


def images(seed: int = 0, batch: int = 4) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(batch, 8, 8, 3)).astype(np.float32)


def nchw(x: np.ndarray) -> torch.Tensor:
    return tensor(x).permute(0, 3, 1, 2)


def assert_records_equal(ours, twin) -> None:
    assert len(ours) == len(twin)
    for a, b in zip(ours, twin):
        assert type(a).__name__ == type(b).__name__
        for field, value in a._asdict().items():
            other = getattr(b, field)
            if value is None or isinstance(value, int):
                assert other == value, field
            elif jnp.issubdtype(jnp.asarray(value).dtype, jnp.floating):
                assert_same(value, other, name=field)
            else:
                assert_same(value, other, exact=True, name=field)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_forward_equal(name):
    model, twin = pair(name)
    x = images()
    ours = model(jnp.asarray(x), return_attention=True)
    got = twin(nchw(x), return_attention=True)
    assert float(np.abs(np.asarray(ours.logits)).max()) > 0.1, "random weights must give non-trivial logits"
    assert_same(ours.logits, got.logits, name="logits")
    assert_same(ours.aux_loss, got.aux_loss, name="aux_loss")
    assert len(ours.attention) == len(got.attention) == CONFIGS[name].depth
    for a, b in zip(ours.attention, got.attention):
        assert_same(a, b, name="attention")
    assert_records_equal(ours.routing, got.routing)


def test_tanh_gelu_changes_the_function():
    """gelu="tanh" is not a no-op: the same weights under the exact GELU give other logits (the twins agree
    with each other under either, test_forward_equal)."""
    model, _ = pair("vmoe-tanh-gelu")
    exact = nnx.merge(*nnx.split(build_model(CONFIGS["vmoe-tanh-gelu"].replace(gelu="exact"), rngs=nnx.Rngs(0))))
    nnx.update(exact, nnx.state(model))
    x = jnp.asarray(images())
    difference = float(jnp.max(jnp.abs(model(x).logits - exact(x).logits)))
    assert 1e-5 < difference < 0.5, difference


@pytest.mark.parametrize("name", ["vmoe-bpr", "soft", "mod-standard", "vit-cls"])
def test_parameter_gradients_equal(name):
    model, twin = pair(name)
    x, labels = images(1), np.arange(4) % 5

    def loss(model):
        out = model(jnp.asarray(x))
        return optax.softmax_cross_entropy_with_integer_labels(out.logits, jnp.asarray(labels)).mean() + out.aux_loss

    grads = nnx.grad(loss)(model)
    out = twin(nchw(x))
    (torch.nn.functional.cross_entropy(out.logits, torch.as_tensor(labels)) + out.aux_loss).backward()
    assert_param_grads(model, grads, twin)


def test_routing_changed_at_inference_in_both():
    model, twin = pair("vmoe-bpr")
    with_routing(model, k=1, capacity_ratio=0.25, allocation="vanilla")
    tm.with_routing(twin, k=1, capacity_ratio=0.25, allocation="vanilla")
    x = images(2)
    ours, got = model(jnp.asarray(x)), twin(nchw(x))
    assert_same(ours.logits, got.logits)
    assert_records_equal(ours.routing, got.routing)
    assert to_torch(model).moe_layers()[0].k == 1  # the converted twin carries the changed routing


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_round_trip_is_bit_exact(name):
    model, twin = pair(name)
    back = from_torch(twin)
    assert type(back) is type(model) and back.config == model.config
    before, after = torch_state_dict(model), torch_state_dict(back)
    assert sorted(before) == sorted(after) == sorted(twin.state_dict())
    for key in before:
        assert torch.equal(before[key], after[key]), key


def test_parameter_names_and_layouts():
    model, twin = pair("vmoe-bpr")
    entries = {theirs: (ours, how) for ours, theirs, how in parameter_entries(model)}
    assert entries["blocks.1.attn.query.weight"] == ("blocks.1.attn.query.kernel", "linear")
    assert entries["blocks.1.norm2.weight"] == ("blocks.1.norm2.scale", "plain")
    assert entries["patch_embed.proj.weight"] == ("patch_embed.proj.kernel", "conv")
    assert entries["blocks.1.mlp.experts.fc1_kernel"] == ("blocks.1.mlp.experts.fc1_kernel", "plain")
    assert entries["blocks.1.mlp.router.weight"] == ("blocks.1.mlp.router.kernel", "linear")
    assert twin.state_dict()["blocks.1.mlp.router.weight"].shape == (4, 16)  # (experts, width), torch's layout


def test_load_refuses_a_mismatched_state_dict():
    model, twin = pair("vmoe-bpr")
    state = twin.state_dict()
    state.pop("blocks.1.mlp.experts.fc2_bias")
    state["blocks.1.mlp.gate.weight"] = torch.zeros(1)
    with pytest.raises(ValueError, match=r"missing keys: 'blocks.1.mlp.experts.fc2_bias'; unexpected keys: "
                                         r"'blocks.1.mlp.gate.weight'"):
        load_torch_state_dict(model, state)
    state = twin.state_dict()
    state["blocks.1.mlp.router.weight"] = torch.zeros(16, 4)
    with pytest.raises(ValueError, match=r"'blocks.1.mlp.router.weight': expected shape \(4, 16\), found \(16, 4\)"):
        load_torch_state_dict(model, state)


def test_images_must_be_channels_first():
    _, twin = pair("vit-cls")
    with pytest.raises(ValueError, match=r"images have shape \(8, 8, 3\) per example; this model expects \(3, 8, 8\)"):
        twin(tensor(images()))
