"""Non-finite values are never hidden: routing functions, both dispatch implementations, the MoE layer, and the
checked (checkify) mode that names the layer and the routing group."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.experimental import checkify
from test_routing_allocation import literal_fill

from moe_course.configs.vmoe import ALLOCATIONS, DISPATCHES, VMoEConfig
from moe_course.layers.moe import SparseMoE
from moe_course.models import build_model
from moe_course.routing import allocate, combine, dispatch, top_k_routing
from moe_course.train.steps import make_eval_step

pytestmark = pytest.mark.filterwarnings("ignore::moe_course.routing.CapacityRoundingWarning")

G, T, E, D = 2, 8, 4, 3
BAD = [(0, 2, np.inf), (0, 5, np.nan), (1, 0, -np.inf)]  # (group, token, value in one logit)


def _poisoned_logits():
    logits = np.array(jax.random.normal(jax.random.key(0), (G, T, E)))
    for g, t, value in BAD:
        logits[g, t, 1] = value
    return jnp.asarray(logits)


def test_router_marks_nonfinite_tokens_instead_of_picking_experts_by_index():
    out = top_k_routing(_poisoned_logits(), 2)
    bad = np.zeros((G, T), bool)
    for g, t, _ in BAD:
        bad[g, t] = True
    assert np.isnan(np.asarray(out.gates)[bad]).all() and np.isnan(np.asarray(out.probs)[bad]).all()
    assert np.isfinite(np.asarray(out.gates)[~bad]).all()


@pytest.mark.parametrize("method", ["vanilla", "bpr", "skip_patch"])
def test_nonfinite_tokens_take_no_slot_and_the_rest_fill_as_the_literal_loop(method):
    out = top_k_routing(_poisoned_logits(), 2)
    keep = 0.75 if method == "skip_patch" else None
    allocation = allocate(out.expert_index, out.gates, 2, E, method=method, keep_fraction=keep)
    slot, index, gates = map(np.asarray, (allocation.slot, out.expert_index, out.gates))
    for g in range(G):
        finite = [t for t in range(T) if np.isfinite(gates[g, t]).all()]
        if method == "vanilla":
            order = finite
        else:  # BPR order of the finite tokens, highest max-gate first, ties in token order
            order = sorted(finite, key=lambda t: -gates[g, t].max())
            order = order[:max(1, int(np.floor(0.75 * T + 0.5)))] if method == "skip_patch" else order
        np.testing.assert_array_equal(slot[g], literal_fill(index[g], order, 2, E)[0])
    assert (np.asarray(allocation.priority_rank)[0, [2, 5]] >= T - 2).all() or method == "vanilla"


def _expert_fn(z):
    return jnp.tanh(z) + 1.0  # empty slots give non-zero outputs, which must not leak


@pytest.mark.parametrize("method", ["vanilla", "bpr"])
def test_dispatch_implementations_agree_and_confine_nonfinite_values(method):
    logits = jax.random.normal(jax.random.key(1), (G, T, E))
    out = top_k_routing(logits, 2)
    allocation = allocate(out.expert_index, out.gates, 2, E, method=method)
    served = np.asarray(allocation.served).any(-1)
    dropped = ~served
    x = np.array(jax.random.normal(jax.random.key(2), (G, T, D)))
    t_served = int(np.argmax(served[0]))
    t_dropped = int(np.argmax(dropped[1]))
    assert dropped[1, t_dropped], "the case needs a fully dropped token"
    x[0, t_served, 1] = np.nan
    x[1, t_dropped, 0] = np.inf
    results = {}
    for impl in ("gather", "einsum"):
        buffers = dispatch(jnp.asarray(x), allocation, implementation=impl)
        buffers_out = _expert_fn(buffers).at[1, 0, 0, 2].set(jnp.inf)  # one non-finite expert output
        results[impl] = (np.asarray(buffers), np.asarray(combine(buffers_out, allocation, implementation=impl)))
    np.testing.assert_array_equal(results["gather"][0], results["einsum"][0])  # NaN == NaN here
    np.testing.assert_allclose(results["gather"][1], results["einsum"][1], rtol=1e-6, atol=1e-6)  # NaN == NaN
    buffers, y = results["gather"]
    # Dispatch: only the slots holding the NaN token get a NaN, and only in that feature.
    assert np.isnan(buffers).sum() == np.asarray(allocation.served)[0, t_served].sum()
    # Combine: NaN exactly in the tokens served by a slot whose output is non-finite.
    holder = np.asarray(allocation.served) & (np.asarray(allocation.expert_index) == 0) & (np.asarray(allocation.slot) == 0)
    poisoned = np.zeros((G, T), bool)
    poisoned[0, t_served] = True
    poisoned[1] |= holder[1].any(-1)
    assert np.array_equal(~np.isfinite(y).all(-1), poisoned)


@pytest.mark.parametrize("dispatch_impl", DISPATCHES)
@pytest.mark.parametrize("allocation", ALLOCATIONS)
def test_layer_output_is_nan_exactly_for_the_nonfinite_token(allocation, dispatch_impl):
    layer = SparseMoE(8, 16, 4, k=2, capacity_ratio=0.5, group_size=2, allocation=allocation,
                      skip_keep_fraction=0.5 if allocation == "skip_patch" else 1.0, dispatch=dispatch_impl,
                      rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (4, 3, 8))
    clean = layer(x).output
    for value in (np.nan, np.inf):
        out = layer(x.at[1, 2, 3].set(value))
        y = np.asarray(out.output)
        assert np.isnan(y[1, 2]).all()
        mask = np.ones((4, 3), bool)
        mask[1, 2] = False
        assert np.isfinite(y[mask]).all()
        # The other group is untouched; the poisoned group's other tokens stay finite (computed above).
        np.testing.assert_array_equal(y[2:], np.asarray(clean)[2:])
        assert np.isnan(float(out.aux_loss)) or allocation == "experts_choice"


def test_checked_layer_names_the_layer_and_the_group():
    layer = SparseMoE(8, 16, 4, group_size=2, check_finite=True, layer_name="block 3 MoE", rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.key(1), (4, 3, 8))
    assert np.isfinite(np.asarray(layer(x).output)).all()
    with pytest.raises(ValueError, match=r"^block 3 MoE: non-finite \(NaN or inf\) features or router logits in "
                                         r"routing group 1 \(token 5 of the group, image 3 of the batch\)"):
        layer(x.at[3, 2, 0].set(jnp.nan))


def test_checked_model_steps_raise_under_jit():
    config = VMoEConfig(name="t", image_size=8, patch_size=4, channels=1, width=8, depth=2, heads=2, mlp_dim=16,
                        num_classes=3, pool="gap", num_experts=4, k=1, placement="every-2", group_size=2,
                        check_finite=True)
    graphdef, params, rest = nnx.split(build_model(config, rngs=nnx.Rngs(0)), nnx.Param, ...)
    step = make_eval_step(graphdef, checked=True)
    images = np.zeros((4, 8, 8, 1), np.float32)
    batch = {"image": images, "label": np.zeros(4, np.int32), "mask": np.ones(4, np.float32)}
    assert float(step(params, rest, batch)[2]) == 4
    images[2, 5, 5, 0] = np.nan  # image 2 = routing group 1
    with pytest.raises(checkify.JaxRuntimeError, match=r"^block 1 MoE: non-finite .* routing group 1 .*image 2 "):
        step(params, rest, batch)
    with pytest.raises(ValueError, match="checkify"):  # without checkify, jit refuses the check: never silent
        make_eval_step(graphdef)(params, rest, batch)
