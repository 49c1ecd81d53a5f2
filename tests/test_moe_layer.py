"""The sparse MoE layer against a literal per-token computation, and its routing controls."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from moe_course.layers.moe import SparseMoE

pytestmark = pytest.mark.filterwarnings("ignore::moe_course.routing.CapacityRoundingWarning")


def _layer(**kw):
    settings = dict(k=2, capacity_ratio=2.0, group_size=2, allocation="vanilla")
    settings.update(kw)
    return SparseMoE(8, 16, 4, rngs=nnx.Rngs(0), **settings)


def _x(batch=4, tokens=5, seed=0):
    return jax.random.normal(jax.random.key(seed), (batch, tokens, 8))


def _literal(layer, x):
    """sum over served choices of gate * expert(token), one token at a time, from the layer's own record."""
    out = layer(x)
    rec = out.routing
    p = {n: np.asarray(getattr(layer.experts, n)[...]) for n in ("fc1_kernel", "fc1_bias", "fc2_kernel", "fc2_bias")}
    gelu = lambda h: np.asarray(jax.nn.gelu(jnp.asarray(h), approximate=False))
    groups = np.asarray(x).reshape(rec.expert_index.shape[0], -1, x.shape[-1])
    y = np.zeros_like(groups)
    for g in range(groups.shape[0]):
        for t in range(groups.shape[1]):
            for i in range(rec.expert_index.shape[2]):
                if rec.served[g, t, i]:
                    e = int(rec.expert_index[g, t, i])
                    h = gelu(groups[g, t] @ p["fc1_kernel"][e] + p["fc1_bias"][e])
                    y[g, t] += float(rec.gates[g, t, i]) * (h @ p["fc2_kernel"][e] + p["fc2_bias"][e])
    return np.asarray(out.output), y.reshape(x.shape)


@pytest.mark.parametrize("capacity_ratio", [2.0, 0.3])
@pytest.mark.parametrize("allocation", ["vanilla", "bpr"])
def test_output_is_gate_weighted_sum_of_served_experts(capacity_ratio, allocation):
    layer = _layer(capacity_ratio=capacity_ratio, allocation=allocation)
    got, want = _literal(layer, _x())
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    served = np.asarray(layer(_x()).routing.served)
    assert served.all() if capacity_ratio == 2.0 else not served.all()


def test_einsum_and_gather_dispatch_agree():
    x = _x()
    gather, einsum = _layer(capacity_ratio=0.5), _layer(capacity_ratio=0.5, dispatch="einsum")
    np.testing.assert_allclose(gather(x).output, einsum(x).output, rtol=1e-6, atol=1e-6)


def test_evaluation_is_deterministic_and_training_adds_router_noise():
    layer, x = _layer(capacity_ratio=0.5), _x()
    np.testing.assert_array_equal(layer(x).output, layer(x).output)
    a = layer(x, deterministic=False, rngs=nnx.Rngs(1)).routing.gates
    b = layer(x, deterministic=False, rngs=nnx.Rngs(2)).routing.gates
    assert not np.allclose(a, b)


def test_aux_loss_is_weighted_and_router_gets_gradients_with_k1():
    layer, x = _layer(k=1, capacity_ratio=1.0), _x()
    graphdef, params = nnx.split(layer, nnx.Param)

    def loss(params):
        out = nnx.merge(graphdef, params)(x, deterministic=False, rngs=nnx.Rngs(3))
        return out.output.sum() + out.aux_loss

    grads = jax.grad(loss)(params)
    assert float(jnp.abs(grads["router"]["kernel"][...]).sum()) > 0
    out = layer(x, deterministic=False, rngs=nnx.Rngs(3))
    assert 0 < float(out.aux_loss) < 0.01 * 10


def test_routing_record_shapes_and_fill():
    layer = _layer(capacity_ratio=0.5)
    rec = layer(_x()).routing
    assert rec.expert_index.shape == rec.gates.shape == rec.served.shape == (2, 10, 2)
    assert rec.priority_rank.shape == (2, 10) and rec.expert_fill.shape == (2, 4)
    np.testing.assert_array_equal(np.asarray(rec.expert_fill).sum(1), np.asarray(rec.served).sum((1, 2)))
    assert (np.asarray(rec.expert_fill) <= rec.capacity).all()


def test_experts_choice_serves_exactly_capacity_per_expert():
    rec = _layer(allocation="experts_choice", capacity_ratio=1.0).__call__(_x()).routing
    np.testing.assert_array_equal(np.asarray(rec.expert_fill), rec.capacity)


def test_batch_must_be_a_multiple_of_group_size():
    with pytest.raises(ValueError, match="batch=3 is not a multiple of group_size=2"):
        _layer()(_x(batch=3))
