"""Dispatch and combine: the one-hot einsum reference and the gather implementation agree, values and gradients."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moe_course.routing import (
    apply_experts,
    batch_prioritized_allocation,
    buffer_token_index,
    combine,
    dispatch,
    dispatch_tensor,
    experts_choice_allocation,
    experts_choice_as_allocation,
    skip_patch_allocation,
    top_k_routing,
    vanilla_allocation,
)

G, T, D, D_OUT, E = 3, 12, 3, 4, 4

# Gradients run under jax.jit: on CPU one XLA compilation of the whole backward pass is much cheaper than
# compiling each of its operations one by one. Forward passes run op by op, reusing compiled operations
# across tests of the same shapes.


def make_expert_fn(seed=0):
    """E different affine maps + tanh; the bias makes empty slots produce non-zero outputs, which must be ignored."""
    kw, kb = jax.random.split(jax.random.key(seed))
    w = jax.random.normal(kw, (E, D, D_OUT))
    b = jax.random.normal(kb, (E, D_OUT))
    return lambda z: jnp.tanh(jnp.einsum("gebd,edf->gebf", z, w) + b[None, :, None, :])


def routed_allocation(k, capacity, method="bpr", seed=1):
    logits = jax.random.normal(jax.random.key(seed), (G, T, E))
    out = top_k_routing(logits, k, jax.random.key(seed + 1))
    if method == "vanilla":
        return vanilla_allocation(out.expert_index, out.gates, capacity, E)
    if method == "skip_patch":
        return skip_patch_allocation(out.expert_index, out.gates, capacity, E, keep_fraction=0.6)
    return batch_prioritized_allocation(out.expert_index, out.gates, capacity, E)


# (k, capacity, method); 12 tokens over 4 experts: every case drops choices. Few distinct shapes keep the
# number of XLA compilations (the bulk of the run time on CPU) small.
CASES = [(1, 2, "bpr"), (2, 2, "vanilla"), (2, 3, "bpr"), (3, 2, "skip_patch")]


@pytest.mark.parametrize("k, capacity, method", CASES)
def test_dispatch_and_combine_match_literal_loops(k, capacity, method):
    allocation = routed_allocation(k, capacity, method)
    x = jax.random.normal(jax.random.key(3), (G, T, D))
    index, slot, gates = map(np.asarray, (allocation.expert_index, allocation.slot, allocation.gates))
    x_np = np.asarray(x)
    expected_in = np.zeros((G, E, capacity, D), np.float32)
    for g in range(G):
        for t in range(T):
            for j in range(k):
                if slot[g, t, j] >= 0:
                    expected_in[g, index[g, t, j], slot[g, t, j]] = x_np[g, t]
    y = jax.random.normal(jax.random.key(4), (G, E, capacity, D_OUT))
    y_np = np.asarray(y)
    expected_out = np.zeros((G, T, D_OUT), np.float32)
    for g in range(G):
        for t in range(T):
            for j in range(k):
                if slot[g, t, j] >= 0:
                    expected_out[g, t] += gates[g, t, j] * y_np[g, index[g, t, j], slot[g, t, j]]
    for implementation in ("gather", "einsum"):
        np.testing.assert_allclose(dispatch(x, allocation, implementation=implementation), expected_in, rtol=1e-6)
        np.testing.assert_allclose(combine(y, allocation, implementation=implementation), expected_out,
                                   rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("k, capacity, method", CASES)
def test_einsum_and_gather_agree_in_outputs_and_gradients(k, capacity, method):
    allocation = routed_allocation(k, capacity, method)
    assert not np.asarray(allocation.served).all()  # every case drops some choices
    x = jax.random.normal(jax.random.key(5), (G, T, D))
    cotangent = jax.random.normal(jax.random.key(6), (G, T, D_OUT))
    expert_fn = make_expert_fn()

    def loss(x, gates, implementation):
        routed = dataclasses.replace(allocation, gates=gates)
        return jnp.sum(apply_experts(x, routed, expert_fn, implementation=implementation) * cotangent)

    backward = jax.jit(jax.grad(loss, argnums=(0, 1)), static_argnums=2)
    outs = {i: apply_experts(x, allocation, expert_fn, implementation=i) for i in ("gather", "einsum")}
    np.testing.assert_allclose(outs["gather"], outs["einsum"], rtol=1e-5, atol=1e-6)
    grads = {i: backward(x, allocation.gates, i) for i in ("gather", "einsum")}
    np.testing.assert_allclose(grads["gather"][0], grads["einsum"][0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grads["gather"][1], grads["einsum"][1], rtol=1e-5, atol=1e-6)
    # Dropped choices: no gradient to their gates; fully dropped tokens: output 0 and no gradient to x.
    served = np.asarray(allocation.served)
    assert np.all(np.asarray(grads["gather"][1])[~served] == 0)
    assert np.abs(np.asarray(grads["gather"][1])[served]).min() > 0
    dropped_tokens = ~served.any(-1)
    assert np.all(np.asarray(outs["gather"])[dropped_tokens] == 0)
    assert np.all(np.asarray(grads["gather"][0])[dropped_tokens] == 0)


def test_fully_dropped_tokens_exist_in_the_low_capacity_case():
    allocation = routed_allocation(1, 2, "bpr")  # 12 tokens, 4 x 2 slots
    assert (~np.asarray(allocation.served).any(-1)).sum() >= 2


def test_gradient_reaches_the_router_logits_with_k1():
    x = jax.random.normal(jax.random.key(7), (G, T, D))
    expert_fn = make_expert_fn(1)

    def loss(logits, implementation):
        out = top_k_routing(logits, 1, jax.random.key(0))
        allocation = batch_prioritized_allocation(out.expert_index, out.gates, 2, E)
        return jnp.sum(apply_experts(x, allocation, expert_fn, implementation=implementation) ** 2)

    logits = jax.random.normal(jax.random.key(8), (G, T, E))
    grad = jax.jit(jax.grad(loss), static_argnums=1)
    g_gather, g_einsum = grad(logits, "gather"), grad(logits, "einsum")
    np.testing.assert_allclose(g_gather, g_einsum, rtol=1e-5, atol=1e-6)
    assert np.abs(np.asarray(g_gather)).sum() > 1e-3


def test_buffer_token_index_and_dispatch_tensor_describe_the_same_buffers():
    allocation = routed_allocation(2, 3, "bpr")
    buffers = np.asarray(buffer_token_index(allocation))
    tensor = np.asarray(dispatch_tensor(allocation))  # (G, T, E, B)
    assert tensor.shape == (G, T, E, 3)
    for g in range(G):
        for e in range(E):
            for b in range(3):
                column = tensor[g, :, e, b]
                if buffers[g, e, b] == T:  # empty slot
                    assert column.sum() == 0
                else:
                    np.testing.assert_array_equal(column, np.eye(T)[buffers[g, e, b]])
    np.testing.assert_array_equal((buffers < T).sum(-1), allocation.expert_fill)


def test_experts_choice_through_the_same_dispatchers():
    probs = jax.nn.softmax(jax.random.normal(jax.random.key(9), (G, T, E)))
    choice = experts_choice_allocation(probs, 3)
    allocation = experts_choice_as_allocation(choice, T)
    x = jax.random.normal(jax.random.key(10), (G, T, D))
    expert_fn = make_expert_fn(2)
    # Direct: every expert processes its chosen tokens; each token sums weight * output over the experts that took it.
    chosen_x = jnp.take_along_axis(x[:, None], choice.token_index[..., None], axis=2)  # (G, E, B, D)
    y = np.asarray(expert_fn(chosen_x))
    token_index, weights = np.asarray(choice.token_index), np.asarray(choice.weights)
    expected = np.zeros((G, T, D_OUT), np.float32)
    for g in range(G):
        for e in range(E):
            for b in range(3):
                expected[g, token_index[g, e, b]] += weights[g, e, b] * y[g, e, b]
    for implementation in ("gather", "einsum"):
        np.testing.assert_allclose(apply_experts(x, allocation, expert_fn, implementation=implementation), expected,
                                   rtol=1e-5, atol=1e-6)


def test_jit_and_invalid_inputs():
    allocation = routed_allocation(2, 2, "bpr")
    x = jax.random.normal(jax.random.key(11), (G, T, D))
    expert_fn = make_expert_fn()
    jitted = jax.jit(lambda x, a: apply_experts(x, a, expert_fn))
    np.testing.assert_allclose(jitted(x, allocation), apply_experts(x, allocation, expert_fn), rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="implementation="):
        dispatch(x, allocation, implementation="sparse")
    with pytest.raises(ValueError, match="x has shape"):
        dispatch(x[:, :5], allocation)
    with pytest.raises(ValueError, match="expert_outputs has shape"):
        combine(jnp.zeros((G, E, 3, D_OUT)), allocation, implementation="einsum")
