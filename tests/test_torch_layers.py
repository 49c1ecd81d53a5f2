"""The PyTorch layers (moe_course.torch.layers) equal the Flax NNX layers with converted weights.

Sparse MoE under every allocation, both dispatch implementations, k = 1..3, capacities that drop choices,
router noise (the JAX layer's own draw fed to PyTorch), a non-finite token; Soft MoE; MoD blocks with both
routers. Outputs, aux losses and routing records to 1e-5 (decisions exact), gradients of the input and of
every parameter to 1e-4.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the PyTorch twins need torch (pip install 'moe-course[torch]')")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

from moe_course import layers as jl  # noqa: E402
from moe_course.torch import layers as tl  # noqa: E402
from moe_course.torch.convert import torch_state_dict  # noqa: E402
from torch_twins import assert_param_grads, assert_same, assert_same_grad, randomize_nnx, to_torch  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::moe_course.routing.CapacityRoundingWarning")

WIDTH, HIDDEN, EXPERTS = 8, 12, 4


def twin_of(jax_layer, torch_layer):
    randomize_nnx(jax_layer)
    torch_layer.load_state_dict(torch_state_dict(jax_layer), strict=True)
    return torch_layer


def run_both(jax_layer, torch_layer, x, *, cotangent, jax_call, torch_call):
    """Forward both; backward ``sum(output * cotangent) + aux`` in both. Returns (jax out, jax grads wrt
    (layer, x), torch out, torch x with .grad)."""

    def loss(layer, x):
        out = jax_call(layer, x)
        return jnp.sum(out[0] * cotangent) + out[1], out

    (_, out), grads = nnx.value_and_grad(loss, argnums=(0, 1), has_aux=True)(jax_layer, jnp.asarray(x))
    xt = to_torch(x).requires_grad_()
    twin = torch_call(torch_layer, xt)
    ((twin[0] * to_torch(cotangent)).sum() + twin[1]).backward()
    return out, grads, twin, xt


SPARSE_CASES = [  # (allocation, k, capacity_ratio, dispatch)
    ("vanilla", 1, 1.0, "gather"), ("vanilla", 2, 0.5, "einsum"), ("bpr", 2, 0.5, "gather"),
    ("bpr", 3, 0.75, "einsum"), ("skip_patch", 2, 1.0, "gather"), ("experts_choice", 2, 0.5, "gather"),
    ("bpr", 3, 2.0, "gather"),
]


@pytest.mark.parametrize("allocation,k,capacity_ratio,dispatch,combine_weights",
                         [(*case, "probabilities") for case in SPARSE_CASES]
                         + [("experts_choice", 2, 0.5, "einsum", "token_normalized")])
@pytest.mark.parametrize("training", [False, True])
def test_sparse_moe(allocation, k, capacity_ratio, dispatch, combine_weights, training):
    settings = dict(k=k, capacity_ratio=capacity_ratio, group_size=2, allocation=allocation, dispatch=dispatch,
                    skip_keep_fraction=0.75, noise_std=0.3 if allocation == "bpr" else None,
                    combine_weights=combine_weights)
    ours = jl.SparseMoE(WIDTH, HIDDEN, EXPERTS, rngs=nnx.Rngs(0), **settings)
    twin = twin_of(ours, tl.SparseMoE(WIDTH, HIDDEN, EXPERTS, **settings)).train(training)
    rng = np.random.default_rng(k)
    x = rng.normal(size=(4, 5, WIDTH)).astype(np.float32)
    x[:, 1] = x[:, 2]  # identical tokens: tied router scores inside a group
    if not training:
        x[3, 4, 0] = np.nan  # a non-finite token: NaN there only, in both
    cotangent = rng.normal(size=x.shape).astype(np.float32)
    noise = jax.random.normal(nnx.Rngs(5)(), (2, 10, EXPERTS), jnp.float32)  # the draw the JAX layer makes
    jax_call = lambda layer, x: layer(x, deterministic=not training, rngs=nnx.Rngs(5) if training else None)
    torch_call = lambda layer, x: layer(x, noise=to_torch(noise) if training else None)
    out, grads, got, xt = run_both(ours, twin, x, cotangent=cotangent, jax_call=jax_call, torch_call=torch_call)
    assert_same(out.output, got.output, name="output")
    assert_same(out.aux_loss, got.aux_loss, name="aux_loss")
    for field in ("expert_index", "served", "priority_rank", "expert_fill"):
        if getattr(out.routing, field) is not None:
            assert_same(getattr(out.routing, field), getattr(got.routing, field), exact=True, name=field)
    assert got.routing.capacity == out.routing.capacity
    assert_same(out.routing.gates, got.routing.gates, name="gates")
    if capacity_ratio < 1 and allocation != "experts_choice":
        assert not bool(np.asarray(out.routing.served).all()), "the case must drop choices"
    if not training:
        return  # NaN in the loss: gradients are compared on the finite inputs below
    assert_same_grad(grads[1], xt.grad, name="d/dx")
    assert_param_grads(ours, grads[0], twin)


def test_sparse_moe_training_noise_from_generator_is_reproducible():
    twin = tl.SparseMoE(WIDTH, HIDDEN, EXPERTS, group_size=2, capacity_ratio=0.5).train()
    x = torch.randn(4, 5, WIDTH, generator=torch.Generator().manual_seed(0))
    a = twin(x, generator=torch.Generator().manual_seed(1))
    b = twin(x, generator=torch.Generator().manual_seed(1))
    c = twin.eval()(x)
    assert torch.equal(a.output, b.output) and torch.equal(a.routing.gates, b.routing.gates)
    assert not torch.equal(a.routing.gates, c.routing.gates)


def test_sparse_moe_errors_match():
    ours = jl.SparseMoE(WIDTH, HIDDEN, EXPERTS, group_size=2, check_finite=True, layer_name="block 1 MoE",
                        rngs=nnx.Rngs(0))
    twin = tl.SparseMoE(WIDTH, HIDDEN, EXPERTS, group_size=2, check_finite=True, layer_name="block 1 MoE")
    with pytest.raises(ValueError) as jax_err:
        ours(jnp.zeros((3, 5, WIDTH)))
    with pytest.raises(ValueError) as torch_err:
        twin(torch.zeros(3, 5, WIDTH))
    assert str(torch_err.value) == str(jax_err.value)
    x = np.zeros((4, 5, WIDTH), np.float32)
    x[2, 3, 1] = np.inf
    with pytest.raises(ValueError, match=r"block 1 MoE: non-finite .* routing group 1 \(token 3 of the group, "
                                         r"image 2 of the batch\)"):
        twin(to_torch(x))


@pytest.mark.parametrize("slots_per_expert", [1, 2])
def test_soft_moe(slots_per_expert):
    ours = jl.SoftMoE(WIDTH, HIDDEN, EXPERTS, slots_per_expert=slots_per_expert, rngs=nnx.Rngs(0))
    twin = twin_of(ours, tl.SoftMoE(WIDTH, HIDDEN, EXPERTS, slots_per_expert=slots_per_expert))
    rng = np.random.default_rng(slots_per_expert)
    x = rng.normal(size=(3, 6, WIDTH)).astype(np.float32)
    cotangent = rng.normal(size=x.shape).astype(np.float32)
    out, grads, got, xt = run_both(ours, twin, x, cotangent=cotangent,
                                   jax_call=lambda layer, x: layer(x), torch_call=lambda layer, x: layer(x))
    assert_same(out.output, got.output, name="output")
    assert_same(out.aux_loss, got.aux_loss, name="aux_loss")
    assert_same(out.routing.dispatch_weights, got.routing.dispatch_weights, name="D")
    assert_same(out.routing.combine_weights, got.routing.combine_weights, name="C")
    assert_same_grad(grads[1], xt.grad, name="d/dx")
    assert_param_grads(ours, grads[0], twin)


def test_soft_moe_phi_has_vmoes_fan_in():
    """A fresh twin draws phi with the JAX layer's spread: fan-in num_experts * width, as vmoe's mu."""
    torch.manual_seed(0)
    phi = tl.SoftMoE(64, 8, 32, slots_per_expert=4).phi.detach().numpy()
    assert abs(phi.std() * np.sqrt(32 * 64) - 1.0) < 0.1, phi.std()


@pytest.mark.parametrize("router,capacity,keep_first", [("standard", 0.5, False), ("standard", 0.25, True),
                                                         ("attention", 0.5, True), ("attention", 0.125, False)])
def test_mod_block(router, capacity, keep_first):
    tokens, heads = 8, 2
    settings = dict(capacity=capacity, router=router, keep_first=keep_first, num_tokens=tokens)
    ours = jl.MoDBlock(WIDTH, heads, HIDDEN, rngs=nnx.Rngs(0), **settings)
    twin = twin_of(ours, tl.MoDBlock(WIDTH, heads, HIDDEN, **settings))
    rng = np.random.default_rng(int(capacity * 8))
    x = rng.normal(size=(3, tokens, WIDTH)).astype(np.float32)
    maps = np.array(jax.nn.softmax(jnp.asarray(rng.normal(size=(3, heads, tokens, tokens)) * 3), axis=-1))
    maps[:, :, :, 2] = maps[:, :, :, 5]  # tied attention scores
    cotangent = rng.normal(size=x.shape).astype(np.float32)
    previous = maps.astype(np.float32) if router == "attention" else None

    def jax_call(layer, x):
        y, weights, record = layer(x, previous_attention=None if previous is None else jnp.asarray(previous),
                                   return_attention=True)
        return y, 0.0, weights, record

    def torch_call(layer, x):
        y, weights, record = layer(x, previous_attention=None if previous is None else to_torch(previous),
                                   return_attention=True)
        return y, 0.0, weights, record

    out, grads, got, xt = run_both(ours, twin, x, cotangent=cotangent, jax_call=jax_call, torch_call=torch_call)
    assert_same(out[0], got[0], name="output")
    assert_same(out[2], got[2], name="attention maps")
    for field in ("index", "processed"):
        assert_same(getattr(out[3], field), getattr(got[3], field), exact=True, name=field)
    for field in ("scores", "gate"):
        assert_same(getattr(out[3], field), getattr(got[3], field), name=field)
    skipped = ~np.asarray(out[3].processed)
    np.testing.assert_array_equal(got[0].detach().numpy()[skipped], x[skipped])  # untouched, bit for bit
    assert_same_grad(grads[1], xt.grad, name="d/dx")
    assert_param_grads(ours, grads[0], twin)
