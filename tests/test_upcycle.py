"""Sparse upcycling (``moe_course.models.upcycling``): vmoe's ``expand_tile`` rule, function preservation at step 0,
deterministic continued training, and bad input refused before anything is built."""

from __future__ import annotations

import re
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from moe_course.configs.soft_moe import SoftMoEConfig
from moe_course.configs.vit import ViTConfig
from moe_course.configs.vmoe import VMoEConfig
from moe_course.models import VMoE, ViT
from moe_course.models import upcycling as upcycle_module
from moe_course.models.upcycling import upcycle
from moe_course.reference import read_npz, vit_from_big_vision, vmoe_from_checkpoint
from moe_course.reference.big_vision import unscan

pytestmark = pytest.mark.filterwarnings("ignore::moe_course.routing.CapacityRoundingWarning")

FIXTURES = Path(__file__).parent / "fixtures" / "reference"
DENSE = ViTConfig(name="dense", image_size=16, patch_size=4, channels=1, width=32, depth=2, heads=2, mlp_dim=64,
                  num_classes=5, pool="gap")
E = 4


def _moe(**settings) -> VMoEConfig:
    """DENSE's backbone with one MoE layer (block 1), 4 experts, groups of 2 images."""
    fields = {**DENSE.__dict__, "name": "upcycled", "num_experts": E, "placement": "every-2", "group_size": 2}
    return VMoEConfig(**{**fields, **settings})


def _trained_looking_dense(seed: int = 0) -> ViT:
    """A dense ViT whose head is not zero (a fresh head is, and would hide every difference in the logits)."""
    dense = ViT(DENSE, rngs=nnx.Rngs(seed))
    dense.head.kernel[...] = jax.random.normal(jax.random.key(seed + 1), dense.head.kernel.shape)
    return dense


def _images(batch: int = 4) -> jax.Array:
    return jax.random.uniform(jax.random.key(7), (batch, 16, 16, 1))


def _apply_vmoe_rules(arrays: dict, rules: list[tuple]) -> dict:
    """vmoe's ``mapping.map_state_dict`` as it treats these rules (vmoe/initialization/mapping.py, rules.py): the
    first rule whose regex ``search``es a source name renames it by ``re.sub``; ``('expand_tile', axis, reps)``
    expands the array's dims at ``axis`` and tiles ``reps`` times along it (``ExpandTileTransformation``)."""
    mapped = {}
    for name, array in arrays.items():
        pattern, replacement, *transform = next(rule for rule in rules if re.search(rule[0], name))
        array = np.asarray(array)
        if transform:
            _, axis, reps = transform
            array = np.expand_dims(array, axis)
            array = np.tile(array, [reps if i == axis else 1 for i in range(array.ndim)])
        mapped[re.sub(pattern, replacement, name)] = array
    return mapped


def test_experts_are_vmoes_expand_tile_of_the_dense_mlp():
    """A big_vision ViT (the scanned 3-block fixture) upcycled two ways: by our ``upcycle``, and by vmoe's rules
    (the MoE block's MLP ``expand_tile``d to 4 experts, every other array renamed into vmoe's V-MoE layout, the
    router left at the target's initial value) read back by the vmoe loader. Every parameter is equal."""
    arrays = unscan(read_npz(FIXTURES / "bv_gap_scan.npz"))
    dense = vit_from_big_vision(arrays)
    rules = [
        (r"^Transformer/encoderblock_1/MlpBlock_0/(Dense_[01])/(kernel|bias)$", r"Encoder/encoderblock_1/Moe/Mlp/\1/\2",
         "expand_tile", 0, E),
        (r"^Transformer/encoderblock_(\d+)/MlpBlock_0/", r"Encoder/encoderblock_\1/Mlp/"),
        (r"^Transformer/encoderblock_(\d+)/MultiHeadDotProductAttention_0/", r"Encoder/encoderblock_\1/SelfAttention/"),
        (r"^Transformer/encoderblock_(\d+)/(LayerNorm_[01])/", r"Encoder/encoderblock_\1/\2/"),
        (r"^Transformer/encoder_norm/", "Encoder/encoder_norm/"),
        (r"^pos_embedding$", "Encoder/posembed_input/pos_embedding"),
        (r"^(embedding|head)/", r"\1/"),
    ]
    vmoe_arrays = _apply_vmoe_rules(arrays, rules)
    assert vmoe_arrays["Encoder/encoderblock_1/Moe/Mlp/Dense_0/kernel"].shape == (E, 32, 48)
    model = {"classifier": "gap", "encoder": {"moe": {"layers": [1], "router": {
        "num_selected_experts": 1, "dispatcher": {"capacity_factor": 2.0, "batch_priority": True}}}}}
    config = vmoe_from_checkpoint({**vmoe_arrays, "Encoder/encoderblock_1/Moe/Router/dense/kernel":
                                   np.zeros((32, E), np.float32)}, model, group_size=2).config
    ours = upcycle(dense, config, seed=3)
    fresh_router = VMoE(config, rngs=nnx.Rngs(3)).blocks[1].mlp.router.kernel[...]
    vmoe_arrays["Encoder/encoderblock_1/Moe/Router/dense/kernel"] = np.asarray(fresh_router)
    theirs = vmoe_from_checkpoint(vmoe_arrays, model, group_size=2)
    equal = jax.tree.map(np.array_equal, nnx.state(ours, nnx.Param), nnx.state(theirs, nnx.Param))
    assert jax.tree.all(equal), equal
    assert np.any(fresh_router)  # the router is LeCun normal, not zero


@pytest.mark.parametrize("settings", [dict(k=1, router_order="topk_then_softmax", capacity_ratio=4.0),
                                      dict(k=E, router_order="softmax_then_topk", capacity_ratio=1.0)],
                         ids=["top1-softmax-after", "k=E"])
def test_the_upcycled_model_computes_the_dense_function_where_gates_sum_to_one(settings):
    """Capacity C = E/k holds every token, and each token's gates sum to one: the logits are the dense model's."""
    dense = _trained_looking_dense()
    moe = upcycle(dense, _moe(**settings))
    out = moe(_images())
    assert all(bool(record.served.all()) for record in out.routing)
    np.testing.assert_allclose(out.logits, dense(_images()).logits, atol=2e-5, rtol=1e-5)


def test_with_top1_after_the_softmax_the_mlp_is_scaled_by_the_gate():
    """V-MoE's default order (top-1 of the softmax) does not preserve the function: the MoE layer returns
    g(x) * MLP(x), g the largest router probability, between 1/E and 1: 0.55 on average here (E = 4, unit-variance
    tokens, LeCun-normal router)."""
    dense = _trained_looking_dense()
    moe = upcycle(dense, _moe(k=1, capacity_ratio=4.0))
    tokens = jax.random.normal(jax.random.key(3), (2, 16, 32))
    out = moe.blocks[1].mlp(tokens)
    gates = out.routing.gates[..., 0].reshape(2, 16)
    assert bool(out.routing.served.all())
    np.testing.assert_allclose(out.output, gates[..., None] * dense.blocks[1].mlp(tokens), atol=1e-5, rtol=1e-5)
    assert 1 / E < float(gates.min()) and float(gates.max()) < 1
    assert abs(float(gates.mean()) - 0.55) < 0.05
    assert np.abs(moe(_images()).logits - dense(_images()).logits).max() > 1e-2


def test_continued_training_from_the_upcycled_model_is_deterministic(tmp_path):
    """Two runs of 3 steps from two upcycled copies (same seed, router noise on): bit-identical parameters."""
    from moe_course.data import load_dataset
    from moe_course.train import TrainConfig, train

    dataset = load_dataset("digits", image_size=16, seed=0)
    config = _moe(k=1, router_order="topk_then_softmax", capacity_ratio=2.0)
    train_config = TrainConfig(steps=3, batch_size=8, learning_rate=1e-3, warmup_steps=1, log_every=1,
                               eval_every=0, checkpoint_every=3)
    dense = ViT(DENSE.replace(num_classes=dataset.num_classes), rngs=nnx.Rngs(0))
    config = config.replace(num_classes=dataset.num_classes)
    runs = [train(config, dataset, train_config, workdir=tmp_path / str(i), progress=False,
                  init_model=upcycle(dense, config, seed=1)).model for i in range(2)]
    first, second = (nnx.state(run, nnx.Param) for run in runs)
    assert jax.tree.all(jax.tree.map(np.array_equal, first, second))
    experts = np.asarray(first["blocks"][1]["mlp"]["experts"]["fc1_kernel"][...])
    assert not np.array_equal(experts[0], np.asarray(dense.blocks[1].mlp.fc1.kernel[...]))  # it trained


@pytest.mark.parametrize("change, message", [
    (dict(width=48), "width=48 of config 'upcycled' differs from the dense model's width=32"),
    (dict(patch_size=8), "patch_size=8 .* differs .* patch_size=4"),
    (dict(depth=4), r"puts MoE layers in blocks \[3\], where the dense model 'dense' has no block \(depth=2"),
    (dict(gelu="tanh"), "gelu='tanh'"),
    (dict(num_classes=3), "num_classes=3"),
])
def test_a_mismatched_config_is_refused_before_anything_is_built(change, message, monkeypatch):
    monkeypatch.setattr(upcycle_module, "VMoE", None)  # building would fail with a TypeError instead
    with pytest.raises(ValueError, match=message):
        upcycle(ViT(DENSE, rngs=nnx.Rngs(0)), _moe().replace(**change))


def test_only_a_dense_vit_upcycles_to_a_vmoe_config():
    moe = VMoE(_moe(), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="model is a VMoE; upcycling starts from a dense ViT"):
        upcycle(moe, _moe())
    soft = SoftMoEConfig(**{**DENSE.__dict__, "num_experts": E})
    with pytest.raises(ValueError, match="config is a SoftMoEConfig"):
        upcycle(ViT(DENSE, rngs=nnx.Rngs(0)), soft)


def test_big_visions_vit_s16_i1k_checkpoint_fits_the_i1k_vmoe_presets():
    """docs/scale-out.md's full-scale command: big_vision's vit_s16_i1k_*.npz (sincos2d, GAP, pre-logits, no
    position embeddings saved) read as a config from its parameter shapes alone (zero-stride arrays) fits every
    ``vmoe-s/16-i1k-*`` preset at 224 px, with big_vision's [-1, 1] pixels."""
    from moe_course.configs.vmoe import VMOE_I1K_PRESETS
    from moe_course.models.upcycling import check_upcyclable
    from moe_course.reference import vit_config_from_big_vision

    shapes = {"embedding/kernel": (16, 16, 3, 384), "embedding/bias": (384,), "head/kernel": (384, 1000),
              "pre_logits/kernel": (384, 384)}
    for block in range(12):
        shapes[f"Transformer/encoderblock_{block}/MultiHeadDotProductAttention_0/query/kernel"] = (384, 6, 64)
        shapes[f"Transformer/encoderblock_{block}/MlpBlock_0/Dense_0/kernel"] = (384, 1536)
    arrays = {name: np.broadcast_to(np.float32(0), shape) for name, shape in shapes.items()}
    dense = vit_config_from_big_vision(arrays, image_size=224).replace(value_range="signed")
    assert len(VMOE_I1K_PRESETS) == 4
    for preset in VMOE_I1K_PRESETS.values():
        check_upcyclable(dense, preset)


def test_the_pytorch_twin_upcycles_to_the_same_function():
    """``moe_course.torch.models.upcycle``: a twin dense ViT upcycled (top-1 with the softmax after it, C = E) computes
    the twin dense model's logits, and its parameters are the JAX upcycling's of the same weights and seed."""
    torch = pytest.importorskip("torch", reason="the PyTorch twins need torch (pip install 'moe-course[torch]')")
    from moe_course.torch.convert import from_torch, to_torch
    from moe_course.torch.models import upcycle as upcycle_twin

    dense = to_torch(_trained_looking_dense(seed=4))
    config = _moe(k=1, router_order="topk_then_softmax", capacity_ratio=4.0)
    twin = upcycle_twin(dense, config, seed=2)
    images = torch.from_numpy(np.array(_images())).permute(0, 3, 1, 2)
    with torch.no_grad():
        np.testing.assert_allclose(twin(images).logits.numpy(), dense(images).logits.numpy(), atol=2e-5, rtol=1e-5)
    ours = nnx.state(upcycle(from_torch(dense), config, seed=2), nnx.Param)
    assert jax.tree.all(jax.tree.map(np.array_equal, ours, nnx.state(from_torch(twin), nnx.Param)))
    with pytest.raises(ValueError, match="model is a VMoE; upcycling starts from a dense ViT twin"):
        upcycle_twin(twin, config)


def test_expert_distance_is_zero_for_copies_and_near_sqrt2_for_independent_draws():
    """``analysis.upcycling.expert_distance``: identical copies at step 0, random experts about sqrt(2) apart."""
    from moe_course.analysis.upcycling import expert_distance

    assert expert_distance(upcycle(_trained_looking_dense(), _moe())) == [0.0]
    (fresh,) = expert_distance(VMoE(_moe(), rngs=nnx.Rngs(0)))
    assert 1.2 < fresh < 1.6, fresh
    with pytest.raises(ValueError, match="without MoE layers"):
        expert_distance(_trained_looking_dense())


def test_importance_entropy_and_unserved_fraction_of_a_routing_record():
    """Shares of the combine weight over the experts (entropy / log E) and tokens no expert served, on records made
    by hand in both layouts: Tokens Choice (expert_index = the choices) and Experts Choice (index = arange(E))."""
    from moe_course.analysis.upcycling import importance_entropy, unserved_fraction
    from moe_course.layers.moe import RoutingRecord

    def record(index, gates, served):
        index, gates, served = (np.asarray(a)[None] for a in (index, gates, served))
        return RoutingRecord(index, gates.astype(np.float32), served, None, np.zeros((1, E), np.int32), 2)

    even = record([[0], [1], [2], [3]], [[0.5]] * 4, [[True]] * 4)  # 4 tokens, one per expert, equal gates
    assert importance_entropy(even) == pytest.approx(1.0) and unserved_fraction(even, batch=1) == 0
    one = record([[2], [2], [1], [0]], [[0.9], [0.9], [0.3], [0.3]], [[True], [True], [False], [False]])
    assert importance_entropy(one) == pytest.approx(0.0) and unserved_fraction(one, batch=1) == 0.5
    experts_choice = record(np.tile(np.arange(E), (4, 1)), np.eye(4) * 0.4, np.eye(4, dtype=bool))
    assert importance_entropy(experts_choice) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="serves no choice"):
        importance_entropy(record([[0]] * 4, [[0.5]] * 4, [[False]] * 4))


def test_token_normalized_experts_choice_computes_the_dense_function_for_every_served_token():
    """Expert Choice at the paper's C = 2 with combine_weights="token_normalized" (Komatsuzaki et al. 2023,
    Sec. 2.2): every token at least one expert took gets exactly the dense MLP's output from the MoE layer, and one
    no expert took gets 0; the raw router probabilities scale it instead. With C = E every expert takes every
    token, and the whole upcycled model's logits are the dense model's at step 0."""
    dense = _trained_looking_dense()
    ec = dict(allocation="experts_choice", k=1, capacity_ratio=2.0, combine_weights="token_normalized")
    tokens = jax.random.normal(jax.random.key(3), (2, 16, 32))
    dense_mlp = np.asarray(dense.blocks[1].mlp(tokens))
    for capacity_ratio in (2.0, 0.5):  # 0.5 leaves tokens no expert takes: the second branch is checked
        out = upcycle(dense, _moe(**{**ec, "capacity_ratio": capacity_ratio})).blocks[1].mlp(tokens)
        served = np.asarray(out.routing.served.any(-1)).reshape(2, 16)
        assert served.any() and (capacity_ratio == 2.0 or not served.all())
        np.testing.assert_allclose(np.asarray(out.output)[served], dense_mlp[served], atol=1e-5, rtol=1e-5)
        np.testing.assert_array_equal(np.asarray(out.output)[~served], 0.0)
    out = upcycle(dense, _moe(**ec)).blocks[1].mlp(tokens)
    served = np.asarray(out.routing.served.any(-1)).reshape(2, 16)
    raw = upcycle(dense, _moe(**{**ec, "combine_weights": "probabilities"})).blocks[1].mlp(tokens)
    assert np.abs(np.asarray(raw.output)[served] - dense_mlp[served]).max() > 1e-2
    moe = upcycle(dense, _moe(**{**ec, "capacity_ratio": float(E)}))
    gap = float(np.abs(np.asarray(moe(_images()).logits) - np.asarray(dense(_images()).logits)).max())
    print(f"max |logit difference| at step 0, token-normalised Expert Choice, every token served: {gap:.3g}")
    assert gap < 2e-5


def test_combine_weights_other_than_the_router_probabilities_need_experts_choice():
    with pytest.raises(ValueError, match="combine_weights='token_normalized' is only allowed with allocation="):
        _moe(combine_weights="token_normalized").validate()
    with pytest.raises(ValueError, match="combine_weights"):
        _moe(allocation="experts_choice", combine_weights="mean").validate()
