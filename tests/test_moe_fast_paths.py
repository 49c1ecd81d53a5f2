"""The faster formulations of issue 11 (item 6) against the readable references they replace."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from moe_course.layers.experts import Experts
from moe_course.routing import allocate, top_k_routing
from moe_course.routing.allocation import inverse_permutation


def test_experts_equal_each_expert_as_a_plain_mlp():
    experts = Experts(3, 4, 8, rngs=nnx.Rngs(0))
    buffers = jax.random.normal(jax.random.key(2), (2, 3, 5, 4))  # (groups, experts, capacity, width)
    out = experts(buffers)
    for e in range(3):
        h = jax.nn.gelu(buffers[:, e] @ experts.fc1_kernel[...][e] + experts.fc1_bias[...][e], approximate=False)
        np.testing.assert_allclose(out[:, e], h @ experts.fc2_kernel[...][e] + experts.fc2_bias[...][e],
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("seed", range(3))
def test_inverse_permutation_equals_argsort(seed):
    order = jax.vmap(lambda k: jax.random.permutation(k, 50))(jax.random.split(jax.random.key(seed), 4))
    assert np.array_equal(inverse_permutation(order), jnp.argsort(order, axis=1))


@pytest.mark.parametrize("method", ["vanilla", "bpr"])
def test_priority_rank_is_the_argsort_of_the_processing_order(method):
    logits = jax.random.randint(jax.random.key(3), (2, 40, 4), 0, 3).astype(jnp.float32)  # many ties
    route = top_k_routing(logits, 2)
    allocation = allocate(route.expert_index, route.gates, 12, 4, method=method)
    order = jnp.argsort(allocation.priority_rank, axis=1)  # token processed r-th
    assert np.array_equal(jnp.argsort(order, axis=1), allocation.priority_rank)
    if method == "bpr":  # highest max-gate first, ties by lower token index (a stable sort)
        assert np.array_equal(order, jnp.argsort(-route.gates.max(-1), axis=1, stable=True))
