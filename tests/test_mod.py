"""Mixture-of-Depths routing and the MoD block (A-MoD, Gadhikar et al. 2024, Sec. 3)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from moe_course.layers import EncoderBlock, MoDBlock
from moe_course.routing import attention_router_scores, mod_capacity, mod_gate, mod_select, standard_router_scores

WIDTH, HEADS, MLP_DIM, TOKENS = 16, 2, 32, 12


def _x(batch=3, seed=0):
    return jax.random.normal(jax.random.key(seed), (batch, TOKENS, WIDTH))


def _attention(batch=3, seed=1):
    logits = jax.random.normal(jax.random.key(seed), (batch, HEADS, TOKENS, TOKENS)) * 2
    return jax.nn.softmax(logits, axis=-1)


def test_attention_scores_equal_a_literal_loop_over_heads_and_query_rows():
    attention = np.asarray(_attention())
    batch, heads, n, _ = attention.shape
    literal = np.zeros((batch, n))
    for b in range(batch):
        for i in range(n):  # token i's score: the attention it receives (Eq. 4)
            literal[b, i] = sum(attention[b, h, j, i] for h in range(heads) for j in range(n)) / (heads * n)
    np.testing.assert_allclose(attention_router_scores(jnp.asarray(attention)), literal, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(literal.sum(1), 1.0, rtol=1e-5)


def test_standard_scores_are_a_linear_map():
    x, w = _x(), jax.random.normal(jax.random.key(5), (WIDTH, 1))
    np.testing.assert_allclose(standard_router_scores(x, w), (x @ w)[..., 0], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="router_kernel has 8 inputs; x has width 16"):
        standard_router_scores(x, jnp.ones((8,)))


@pytest.mark.parametrize("capacity, kept", [(1.0, 12), (0.5, 6), (0.125, 2), (0.01, 1), (0.375, 4), (0.7, 8)])
def test_selection_keeps_round_c_times_p_top_tokens_in_token_order(capacity, kept):
    scores = jax.random.normal(jax.random.key(2), (4, TOKENS))
    selection = mod_select(scores, capacity)
    assert selection.index.shape == (4, kept) == (4, mod_capacity(TOKENS, capacity))
    assert (np.diff(np.asarray(selection.index), axis=1) > 0).all()
    for b in range(4):
        assert set(np.asarray(selection.index[b])) == set(np.argsort(-np.asarray(scores[b]), kind="stable")[:kept])
    assert (np.asarray(selection.processed).sum(1) == kept).all()


def test_selection_ties_go_to_the_earlier_token_and_the_class_token_can_be_kept():
    scores = jnp.zeros((1, TOKENS))
    assert mod_select(scores, 0.25).index.tolist() == [[0, 1, 2]]
    scores = jnp.arange(TOKENS, dtype=jnp.float32)[None]  # token 0 scores lowest
    assert mod_select(scores, 0.25, keep_first=True).index.tolist() == [[0, 10, 11]]


@pytest.mark.parametrize("capacity", [0, 0.0, -0.5, 1.5, True, "0.5", float("nan")])
def test_capacity_outside_zero_one_is_refused(capacity):
    with pytest.raises(ValueError, match=r"capacity=.* is not allowed; use a number in \(0, 1\]"):
        mod_capacity(TOKENS, capacity)


def _blocks(router, capacity, seed=0):
    mod = MoDBlock(WIDTH, HEADS, MLP_DIM, capacity=capacity, router=router, keep_first=False, num_tokens=TOKENS,
                   rngs=nnx.Rngs(seed))
    dense = EncoderBlock(WIDTH, HEADS, MLP_DIM, rngs=nnx.Rngs(seed))
    nnx.update(dense, nnx.state(mod.block))
    return mod, dense


@pytest.mark.parametrize("router", ["standard", "attention"])
def test_skipped_tokens_are_bit_identical_and_processed_ones_see_only_each_other(router):
    mod, dense = _blocks(router, 0.5)
    x, attention = _x(), _attention()
    y, _, record = mod(x, previous_attention=attention)
    skipped = ~np.asarray(record.processed)
    assert skipped.sum() == 3 * (TOKENS - 6)
    assert (np.asarray(y)[skipped] == np.asarray(x)[skipped]).all()  # bitwise, not approximately
    for b in range(3):  # the processed tokens: the dense block run on them alone, its update times the gate
        index = np.asarray(record.index[b])
        alone, _, _ = dense(x[b:b + 1, index])
        gate = np.asarray(record.gate[b])[:, None]
        expected = np.asarray(x[b, index]) + gate * (np.asarray(alone[0]) - np.asarray(x[b, index]))
        np.testing.assert_allclose(np.asarray(y[b, index]), expected, rtol=1e-5, atol=1e-5)
    if router == "attention":
        assert (np.asarray(record.gate) == 1).all()


def test_attention_routing_at_capacity_one_equals_the_dense_block():
    mod, dense = _blocks("attention", 1.0)
    x = _x()
    y, maps, _ = mod(x, previous_attention=_attention(), return_attention=True)
    y_dense, maps_dense, _ = dense(x, return_attention=True)
    np.testing.assert_allclose(y, y_dense, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(maps, maps_dense, rtol=1e-6, atol=1e-7)


def test_standard_routing_gates_the_update_and_trains_the_router():
    mod, _ = _blocks("standard", 0.5)
    x = _x()

    def loss(model):
        y, _, _ = model(x)
        return jnp.sum(y**2)

    grads = nnx.grad(loss)(mod)
    router_grad = np.asarray(grads.router.kernel[...])
    assert np.abs(router_grad).sum() > 0, "no gradient reaches W_r"
    _, _, record = mod(x)
    np.testing.assert_allclose(record.gate, mod_gate(jnp.take_along_axis(record.scores, record.index, 1)))
    assert ((np.asarray(record.gate) > 0) & (np.asarray(record.gate) < 1)).all()


def test_returned_maps_are_full_size_with_zeros_for_skipped_tokens():
    mod, _ = _blocks("attention", 0.5)
    _, maps, record = mod(_x(), previous_attention=_attention(), return_attention=True)
    assert maps.shape == (3, HEADS, TOKENS, TOKENS)
    processed = np.asarray(record.processed)
    np.testing.assert_allclose(np.asarray(maps).sum(-1)[processed[:, None, :].repeat(HEADS, 1)], 1.0, rtol=1e-5)
    skipped = ~processed
    assert (np.asarray(maps).transpose(0, 2, 1, 3)[skipped] == 0).all()  # a skipped token attends to nothing
    assert (np.asarray(maps).transpose(0, 3, 1, 2)[skipped] == 0).all()  # and receives nothing


def test_attention_routing_needs_the_previous_maps_and_router_names_are_checked():
    mod, _ = _blocks("attention", 0.5)
    with pytest.raises(ValueError, match="previous_attention"):
        mod(_x())
    with pytest.raises(ValueError, match="router='learned' is not allowed; use one of 'standard', 'attention'"):
        MoDBlock(WIDTH, HEADS, MLP_DIM, capacity=0.5, router="learned", keep_first=False, num_tokens=TOKENS,
                 rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="capacity=2"):
        MoDBlock(WIDTH, HEADS, MLP_DIM, capacity=2, router="standard", keep_first=False, num_tokens=TOKENS,
                 rngs=nnx.Rngs(0))


def test_the_compiled_block_computes_less_at_lower_capacity():
    """XLA's own FLOP count of the compiled forward pass falls with C (the masked-after pitfall would not)."""
    x, attention = _x(8), _attention(8)
    flops = {}
    for capacity in (1.0, 0.5, 0.125):
        mod, _ = _blocks("attention", capacity)
        graphdef, state = nnx.split(mod)
        forward = jax.jit(lambda state, x, a: nnx.merge(graphdef, state)(x, previous_attention=a)[0])
        flops[capacity] = forward.lower(state, x, attention).compile().cost_analysis()["flops"]
    assert flops[0.5] < 0.6 * flops[1.0] and flops[0.125] < 0.25 * flops[1.0], flops
