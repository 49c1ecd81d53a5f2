# %% [markdown]
# # Assignment 2: your sparse MoE layer, in JAX
#
# Chapter 2 built a sparse Mixture-of-Experts layer from its parts. Here you write it yourself in `jax.numpy`,
# one piece per task, and put the pieces together into the whole layer: the router's TOP-k, the expert capacity,
# the allocation of buffer slots (vectorised: no Python loop over tokens), dispatch and combine (einsums), the
# experts, the importance and load losses -- and then `moe_layer`, which must give the same outputs, drop the same
# tokens and give the same auxiliary loss as the library's `moe_course.layers.SparseMoE` on the same parameters.
# Finally you take the router's gradient of your own layer with `jax.grad` in both gate orders. On the way you
# predict which tokens an untrained router loses, fix a gate function that takes its softmax at the wrong
# moment, and explain why tokens are dropped (graded by your instructor). Replace every
# `raise NotImplementedError()` with your code; the visible tests compare with the library on your machine, and
# further tests run when your notebook is graded (there the library is absent: write the JAX yourself).
#
# Work in your own copy: `moe-course exercise 02` puts it in `mywork/02_moe_layer.ipynb`. Check it with
# `moe-course check mywork/02_moe_layer.ipynb` (the visible tests, with the base install; from the repository's
# root or any folder in it).
#
# **Shapes and the parameter tree.** Tokens are routed in groups: router logits are `(groups, tokens, experts)`,
# the choices `(groups, tokens, k)`, expert buffers `(groups, experts, capacity, width)`. A `SparseMoE`'s
# parameters, `nnx.to_pure_dict(nnx.state(layer, nnx.Param))`, are a plain dict (D = width, H = the experts'
# hidden width, E = experts):
#
# ```
# params["router"]["kernel"]          (D, E)      logits = x @ kernel (no bias)
# params["experts"]["fc1_kernel"]     (E, D, H)   expert e: gelu(x @ fc1_kernel[e] + fc1_bias[e]) @ fc2_kernel[e]
# params["experts"]["fc1_bias"]       (E, H)                + fc2_bias[e]   (the exact GELU)
# params["experts"]["fc2_kernel"]     (E, H, D)
# params["experts"]["fc2_bias"]       (E, D)
# ```
#
# The cell below makes such layers from the library when it is installed (`library_moe`, every parameter drawn
# at random), keeps your prediction as first written (`freeze`) and compares arrays (`differs`).

# %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from moe_course.course.inside.notebook import close, differs, predictions

freeze = predictions("02_moe_layer.predictions.json")  # freeze(name, value): the first answer counts

rng = np.random.default_rng(0)
try:  # the course library: on your machine the visible tests compare with it; grading compares outside
    from flax import nnx

    from moe_course.layers import SparseMoE
    LIBRARY = True
except ImportError:
    LIBRARY = False
SMALL = dict(width=8, hidden=16, num_experts=4, k=2, capacity_ratio=1.0, group_size=2)


@functools.cache
def library_moe(seed=0, **fields):
    """(the library's SparseMoE of the SMALL settings with ``fields`` changed -- vanilla allocation, evaluation
    without router noise -- every parameter redrawn at random; its parameter tree as a plain dict of arrays)."""
    s = {**SMALL, **fields}
    layer = SparseMoE(s.pop("width"), s.pop("hidden"), s.pop("num_experts"), allocation="vanilla", **s,
                      rngs=nnx.Rngs(seed))
    draw = np.random.default_rng(seed)
    for _, param in nnx.iter_graph(layer):
        if isinstance(param, nnx.Param):
            param[...] = jnp.asarray(0.3 * draw.normal(size=param.shape), param[...].dtype) + param[...]
    return layer, nnx.to_pure_dict(nnx.state(layer, nnx.Param))


def groups_of(layer, x):
    """The library layer's routing groups of x (batch, tokens, D) -> (groups, group_size * tokens, D), and their
    router logits."""
    groups = jnp.asarray(x).reshape(-1, layer.group_size * x.shape[1], x.shape[2])
    return groups, layer.router(groups)


# %% [markdown]
# ## 1. TOP-k routing (2 points)
#
# V-MoE routes with `TOP_k(softmax(logits))`: the softmax over the experts comes first, then the k largest
# probabilities are kept, unchanged, as the gates. `top_k_routing(logits, k)` returns `(expert_index, gates)`,
# both `(groups, tokens, k)`, the largest first; among equal probabilities the lower expert index comes first
# (`jax.lax.top_k` does both).

# %% nbgrader={"grade": false, "grade_id": "topk_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def top_k_routing(logits, k):
    ### BEGIN SOLUTION
    probs = jax.nn.softmax(jnp.asarray(logits, jnp.float32), axis=-1)
    gates, expert_index = jax.lax.top_k(probs, k)
    return expert_index, gates
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "topk_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
index, gates = top_k_routing(np.log(np.array([[[0.1, 0.6, 0.3]]])), 2)
assert np.asarray(index).tolist() == [[[1, 2]]], f"expected experts [1, 2], got {np.asarray(index).tolist()}"
assert np.allclose(gates, [[[0.6, 0.3]]]), f"the gates are the probabilities themselves, got {gates}"
assert np.asarray(top_k_routing(np.zeros((1, 1, 4)), 2)[0]).tolist() == [[[0, 1]]], "ties go to the lower expert"
print("ok: top_k_routing keeps the softmax probabilities of the k largest, ties to the lower expert")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares the outputs with moe_course.routing
_answers.record("topk_tests", top_k_routing)
### END HIDDEN TESTS

# %% [markdown]
# ## 2. Expert capacity (2 points)
#
# Every expert has a buffer of `B = round(k * tokens * C / E)` slots per group (V-MoE Sec. 2.4), where a half
# rounds up (2.5 -> 3) and the buffer holds at least one slot. `expert_capacity(k, tokens, capacity_ratio,
# num_experts)` returns that integer (plain Python: it is bookkeeping, known before any array exists). Mind
# floating point: `40 * 0.1 / 4` is `1.0000000000000002`, which must count as the 1 it stands for.

# %% nbgrader={"grade": false, "grade_id": "capacity_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def expert_capacity(k, tokens, capacity_ratio, num_experts):
    ### BEGIN SOLUTION
    return max(1, math.floor(k * tokens * capacity_ratio / num_experts + 0.5 + 1e-9))
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "capacity_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
assert expert_capacity(2, 16, 1.0, 8) == 4
assert expert_capacity(1, 10, 1.0, 4) == 3, "2.5 rounds up to 3"
assert expert_capacity(1, 4, 0.1, 8) == 1, "at least one slot"
print("ok: expert_capacity on 3 cases (plain, a half rounding up, at least one slot)")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares the outputs with moe_course.routing
_answers.record("capacity_tests", expert_capacity)
### END HIDDEN TESTS

# %% [markdown]
# ## 3. Predict first (2 points)
#
# Before you write the allocation (task 4; read its description first), and without running anything: a router
# that has learned nothing yet -- its kernel all zeros, so every token gets the probability 1/4 for each of
# E = 4 experts. One group of 16 tokens is routed with k = 2 and capacity ratio C = 1 (so B = 8 slots per
# expert) by the vanilla allocation of task 4 (ties to the lower expert, as in task 1). How many of the 16
# tokens get NO expert at all (both choices dropped)?
#
# In the cell below, replace `raise NotImplementedError()` with `PREDICTED_UNSERVED = <an integer>`. The cell
# under it records your first answer in `02_moe_layer.predictions.json` beside this notebook; the check after
# task 4 reports a changed one (the first answer counts).

# %% nbgrader={"grade": false, "grade_id": "unserved_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
### BEGIN SOLUTION
PREDICTED_UNSERVED = 8
### END SOLUTION

# %% nbgrader={"grade": false, "grade_id": "unserved_record", "locked": true, "schema_version": 3, "solution": false, "task": false}
print(freeze("PREDICTED_UNSERVED", globals().get("PREDICTED_UNSERVED")))

# %% [markdown]
# ## 4. The allocation, vectorised (4 points)
#
# V-MoE's vanilla allocation (App. C, Algorithm 1) fills the buffers greedily in two nested loops: for i = 1..k,
# for every token in group order, the token's TOP-i choice takes the next free slot of its expert, or is dropped
# when that expert's B slots are full. So all TOP-1 choices are placed before any TOP-2 choice. Write it without
# a Python loop over tokens: lay the choices out in that order (all TOP-1 choices of the group, then all TOP-2
# ...), and a cumulative sum of their one-hot experts over that order tells each choice how many earlier choices
# went to the same expert -- its position in the expert's buffer. `allocate(expert_index, capacity,
# num_experts)` gets `(groups, tokens, k)` int choices and returns the slots `(groups, tokens, k)` int: the
# choice's position in its expert's buffer, `0 .. capacity - 1`, or `-1` where it was dropped.

# %% nbgrader={"grade": false, "grade_id": "allocate_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def allocate(expert_index, capacity, num_experts):
    ### BEGIN SOLUTION
    groups, tokens, k = expert_index.shape
    choices = jnp.swapaxes(jnp.asarray(expert_index), 1, 2).reshape(groups, k * tokens)  # TOP-1s, then TOP-2s
    one_hot = jax.nn.one_hot(choices, num_experts, dtype=jnp.int32)  # (G, k*T, E)
    position = jnp.sum(jnp.cumsum(one_hot, axis=1) * one_hot, axis=-1) - 1  # earlier choices of the same expert
    slot = jnp.where(position < capacity, position, -1)
    return jnp.swapaxes(slot.reshape(groups, k, tokens), 1, 2)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "allocate_tests", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
# 3 tokens, k = 2, 2 slots per expert: the three TOP-1 choices (experts 0, 0, 1) come first, so token 2's TOP-2
# choice of expert 0 finds its buffer full, while token 0's TOP-2 choice of expert 1 still gets a slot.
slot = np.asarray(allocate(np.array([[[0, 1], [0, 2], [1, 0]]]), 2, 3))
assert slot.shape == (1, 3, 2), f"expected shape (1, 3, 2), got {slot.shape}"
assert slot.tolist() == [[[0, 1], [1, 0], [0, -1]]], f"TOP-1 choices first, then TOP-2: got {slot.tolist()}"
if LIBRARY:
    from moe_course.routing import vanilla_allocation

    index = np.stack([rng.permutation(5)[:2] for _ in range(2 * 12)]).reshape(2, 12, 2)
    close(allocate(index, 3, 5), vanilla_allocation(index, np.ones(index.shape, np.float32), 3, 5).slot, "slots", 0)
    print("ok: allocate places TOP-1 choices before TOP-2 and equals the library's vanilla allocation")
else:
    print("ok: allocate places TOP-1 choices before TOP-2 (grading compares it with the library)")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares the slots with moe_course.routing
_answers.record("allocate_tests", allocate)
### END HIDDEN TESTS

# %% [markdown]
# **The check of your prediction (task 3).** It routes the untrained router's 16 tokens with the library's layer
# (where it is installed); your answer was recorded before you wrote task 4.

# %% nbgrader={"grade": true, "grade_id": "unserved_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
print(freeze("PREDICTED_UNSERVED", PREDICTED_UNSERVED))
assert int(PREDICTED_UNSERVED) == PREDICTED_UNSERVED >= 0, "the prediction is a non-negative integer"
if LIBRARY:
    untrained = SparseMoE(8, 16, 4, k=2, capacity_ratio=1.0, group_size=1, allocation="vanilla", rngs=nnx.Rngs(0))
    untrained.router.kernel[...] = jnp.zeros_like(untrained.router.kernel[...])
    served = untrained(jnp.asarray(rng.normal(size=(1, 16, 8)), jnp.float32)).routing.served
    assert PREDICTED_UNSERVED == int((~np.asarray(served).any(-1)).sum()), (
        "not what the layer does: follow the TOP-1 round, then the TOP-2 round, token by token")
    print("ok: your prediction is the number of tokens the untrained router leaves without an expert")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader routes with moe_course.layers.SparseMoE
_answers.record("unserved_tests", lambda: int(PREDICTED_UNSERVED))
### END HIDDEN TESTS

# %% [markdown]
# ## 5. Dispatch (2 points)
#
# The dispatch tensor of GShard and V-MoE is one-hot, `(groups, tokens, experts, capacity)`: 1 where token t
# sits in slot b of expert e, else 0 (a dropped choice, slot -1, has no 1 anywhere). `dispatch(x, expert_index,
# slot, num_experts, capacity)` builds it from the choices and their slots and returns the expert buffers
# `(groups, experts, capacity, D)` of tokens `x` `(groups, tokens, D)` with one `jnp.einsum`; empty slots hold 0.

# %% nbgrader={"grade": false, "grade_id": "dispatch_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def dispatch(x, expert_index, slot, num_experts, capacity):
    ### BEGIN SOLUTION
    experts = jax.nn.one_hot(expert_index, num_experts, dtype=jnp.float32)  # (G, T, k, E)
    slots = jax.nn.one_hot(slot, capacity, dtype=jnp.float32)  # (G, T, k, B); slot -1 gives zeros
    return jnp.einsum("gtke,gtkb,gtd->gebd", experts, slots, jnp.asarray(x, jnp.float32))
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "dispatch_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
x = rng.normal(size=(1, 3, 4)).astype(np.float32)
index, slot = np.array([[[0, 1], [0, 2], [1, 0]]]), np.array([[[0, 1], [1, 0], [0, -1]]])
buffers = np.asarray(dispatch(x, index, slot, 3, 2))
assert buffers.shape == (1, 3, 2, 4), f"expected shape (1, 3, 2, 4), got {buffers.shape}"
assert np.allclose(buffers[0, 1], x[0, [2, 0]]), "expert 1's slots hold token 2 (its TOP-1) and token 0 (its TOP-2)"
assert np.allclose(buffers[0, 2, 1], 0), "an empty slot holds zeros"
print("ok: dispatch puts every served choice's token into its expert's slot, zeros elsewhere")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares with moe_course.routing.dispatch
_answers.record("dispatch_tests", dispatch)
### END HIDDEN TESTS

# %% [markdown]
# ## 6. Combine (2 points)
#
# `combine(expert_outputs, expert_index, slot, gates)` gets the experts' outputs `(groups, experts, capacity,
# D)`, the choices and slots `(groups, tokens, k)` and the gates `(groups, tokens, k)`, and returns `(groups,
# tokens, D)`: for every token the sum over its served choices of `gate * expert_output[expert, slot]`; a dropped
# choice adds nothing. One einsum with the combine tensor (the dispatch tensor weighted by each choice's gate).

# %% nbgrader={"grade": false, "grade_id": "combine_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def combine(expert_outputs, expert_index, slot, gates):
    ### BEGIN SOLUTION
    _, num_experts, capacity, _ = expert_outputs.shape
    experts = jax.nn.one_hot(expert_index, num_experts, dtype=jnp.float32)
    slots = jax.nn.one_hot(slot, capacity, dtype=jnp.float32)
    return jnp.einsum("gtk,gtke,gtkb,gebd->gtd", gates, experts, slots, expert_outputs)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "combine_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
outputs = rng.normal(size=(1, 3, 2, 4)).astype(np.float32)
weights = np.array([[[0.5, 0.25], [0.75, 0.125], [0.625, 0.375]]], np.float32)
mixed = np.asarray(combine(outputs, index, slot, weights))
assert mixed.shape == (1, 3, 4), f"expected shape (1, 3, 4), got {mixed.shape}"
assert np.allclose(mixed[0, 0], 0.5 * outputs[0, 0, 0] + 0.25 * outputs[0, 1, 1]), "token 0: both choices, gated"
assert np.allclose(mixed[0, 2], 0.625 * outputs[0, 1, 0]), "token 2's dropped TOP-2 choice adds nothing"
print("ok: combine sums the gated outputs of every token's served choices")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares with moe_course.routing.dispatch
_answers.record("combine_tests", combine)
### END HIDDEN TESTS

# %% [markdown]
# ## 7. The experts (2 points)
#
# `experts(params, buffers)` gets `params["experts"]` of the tree (above) and buffers `(groups, E, capacity, D)`
# and returns the same shape: buffer e goes through expert e's MLP, `gelu(x @ fc1_kernel[e] + fc1_bias[e]) @
# fc2_kernel[e] + fc2_bias[e]`, with the exact GELU (`jax.nn.gelu(..., approximate=False)`). Write one expert's MLP
# for one buffer and let `jax.vmap` map it over the experts: axis 0 of every parameter, axis 1 of the buffers.

# %% nbgrader={"grade": false, "grade_id": "experts_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def experts(params, buffers):
    ### BEGIN SOLUTION
    def one_expert(p, x):  # p: one expert's parameters; x: its buffers (groups, capacity, D)
        h = jax.nn.gelu(x @ p["fc1_kernel"] + p["fc1_bias"], approximate=False)
        return h @ p["fc2_kernel"] + p["fc2_bias"]

    return jax.vmap(one_expert, in_axes=(0, 1), out_axes=1)(params, jnp.asarray(buffers))
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "experts_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
if LIBRARY:
    layer, params = library_moe()
    buffers = rng.normal(size=(2, SMALL["num_experts"], 3, SMALL["width"])).astype(np.float32)
    close(experts(params["experts"], buffers), layer.experts(jnp.asarray(buffers)), "experts' output", 1e-4)
    print("ok: experts equals the library's Experts")
else:
    print("the library is not installed here: grading compares experts with it")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares with moe_course.layers.experts
_answers.record("experts_tests", experts)
### END HIDDEN TESTS

# %% [markdown]
# ## 8. Importance loss (2 points)
#
# `Imp_e` is the sum over a group's tokens of the softmax probability of expert e (of the clean logits); the
# importance loss is its squared coefficient of variation over the experts, `var / mean^2` (population
# variance), averaged over the groups (V-MoE App. A.2). `importance_loss(logits)`: `(groups, tokens, experts)`
# -> a scalar. Return a JAX scalar, not a Python `float`: your layer's gradient (task 12) is traced through it.

# %% nbgrader={"grade": false, "grade_id": "importance_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def importance_loss(logits):
    ### BEGIN SOLUTION
    importance = jnp.sum(jax.nn.softmax(logits, axis=-1), axis=1)
    return jnp.mean(jnp.var(importance, axis=-1) / jnp.mean(importance, axis=-1) ** 2)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "importance_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
assert abs(float(importance_loss(jnp.zeros((2, 5, 4))))) < 1e-12, "balanced probabilities: no loss"
assert float(importance_loss(jnp.array([[[9.0, 0.0], [9.0, 0.0]]]))) > 0.9, "one expert takes everything"
print("ok: importance_loss is 0 when balanced and large when one expert takes everything")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares the outputs with moe_course.routing
_answers.record("importance_tests", importance_loss)
### END HIDDEN TESTS

# %% [markdown]
# ## 9. Load loss (2 points)
#
# For a token, let `threshold` be the k-th largest NOISY logit. The probability that expert e would still be
# selected if its noise were drawn again is `p_e = 1 - Phi((threshold - logit_e) / sigma)`, with the clean logit
# and `Phi` the standard normal CDF (`jax.scipy.stats.norm.cdf`). `load_e` sums `p_e` over the group's tokens;
# the load loss is its squared coefficient of variation, averaged over groups. `load_loss(logits, noisy_logits,
# k, sigma)` -> a JAX scalar.

# %% nbgrader={"grade": false, "grade_id": "load_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def load_loss(logits, noisy_logits, k, sigma):
    ### BEGIN SOLUTION
    threshold = jax.lax.top_k(jnp.asarray(noisy_logits), k)[0][..., -1:]
    load = jnp.sum(1.0 - jax.scipy.stats.norm.cdf((threshold - logits) / sigma), axis=1)
    return jnp.mean(jnp.var(load, axis=-1) / jnp.mean(load, axis=-1) ** 2)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "load_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
clean = rng.normal(size=(2, 8, 4)).astype(np.float32)
value = load_loss(clean, clean + 0.25 * rng.normal(size=clean.shape).astype(np.float32), 2, 0.25)
assert np.ndim(value) == 0 and float(value) >= 0.0, f"a non-negative scalar, got {value!r}"
print(f"ok: load_loss returns a non-negative scalar ({float(value):.4f} here)")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares the outputs with moe_course.routing
_answers.record("load_tests", load_loss)
### END HIDDEN TESTS

# %% [markdown]
# ## 10. Debug: the gates of the chosen experts (2 points)
#
# `sparse_gates(logits, k)` below is meant to give the gate matrix of a V-MoE layer: router logits `(groups,
# tokens, experts)` in, the same shape out, each token's k chosen experts holding their gates as V-MoE computes
# them (`TOP_k(softmax(logits))`, your task 1) and every other expert 0. It runs and picks the right experts, but
# it holds one bug, a failure mode chapter 2 shows -- with k = 1 it would leave the router without a gradient.
# Run the test below it, find the bug and fix it in the cell.

# %% nbgrader={"grade": false, "grade_id": "softmax_debug", "locked": false, "schema_version": 3, "solution": true, "task": false}
### BEGIN HANDOUT
def sparse_gates(logits, k):
    chosen, top = jax.lax.top_k(logits, k)  # the k largest logits: the k chosen experts
    weights = jax.nn.softmax(chosen, axis=-1)  # the softmax
    return jnp.sum(jax.nn.one_hot(top, logits.shape[-1]) * weights[..., None], axis=-2)
### END HANDOUT
### BEGIN SOLUTION
def sparse_gates(logits, k):
    probs = jax.nn.softmax(logits, axis=-1)  # the softmax, over all experts first
    weights, top = jax.lax.top_k(probs, k)  # then the k largest: the k chosen experts
    return jnp.sum(jax.nn.one_hot(top, logits.shape[-1]) * weights[..., None], axis=-2)
### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "gates_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
gates = np.asarray(sparse_gates(jnp.log(jnp.array([[[0.1, 0.6, 0.3]]])), 1))
assert gates.shape == (1, 1, 3), f"expected shape (1, 1, 3), got {gates.shape}"
assert (gates > 0).sum() == 1 and gates[0, 0, 1] > 0, f"k = 1 keeps expert 1 only, got {gates.tolist()}"
assert np.isclose(gates[0, 0, 1], 0.6), f"the gate of expert 1 is its probability 0.6, got {gates[0, 0, 1]:.3f}"
print("ok: sparse_gates keeps expert 1 with its probability 0.6 as the gate (k = 1)")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares the outputs with moe_course.routing
_answers.record("gates_tests", sparse_gates)
### END HIDDEN TESTS

# %% [markdown]
# ## 11. Your MoE layer (4 points)
#
# `moe_layer(params, x, k, capacity_ratio, group_size, order="softmax_then_topk")` is the whole layer, as
# `SparseMoE(..., allocation="vanilla")` computes it in evaluation (no router noise): tokens `x` `(batch, tokens,
# D)` are cut into routing groups of `group_size` images, `(batch / group_size, group_size * tokens, D)` (the
# images of a group one after the other); the router's logits are `groups @ params["router"]["kernel"]`; the
# gates are your task 1's with `order="softmax_then_topk"`, or a softmax over the k largest logits alone with
# `order="topk_then_softmax"` (Shazeer et al.'s order); the capacity is task 2's for the group's tokens; then
# allocate, dispatch, the experts (`params["experts"]`) and combine. Return `(output, served, aux_loss)`: the
# output `(batch, tokens, D)`, `served` `(groups, group tokens, k)` bool (True where the choice got a slot: the
# library's `MoEOutput.routing.served`), and the layer's auxiliary loss, `0.01 * (0.5 * L_imp + 0.5 * L_load)`
# (V-MoE's lambda = 0.01 and Eq. 7) with the clean logits standing for the noisy ones (no noise is drawn in
# evaluation) and `sigma = 1 / E`, the library's default noise std. Use your functions of tasks 1-9.

# %% nbgrader={"grade": false, "grade_id": "layer_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def moe_layer(params, x, k, capacity_ratio, group_size, order="softmax_then_topk"):
    ### BEGIN SOLUTION
    batch, tokens, width = x.shape
    groups = jnp.reshape(x, (batch // group_size, group_size * tokens, width))
    logits = groups @ params["router"]["kernel"]
    num_experts = logits.shape[-1]
    if order == "softmax_then_topk":
        expert_index, gates = top_k_routing(logits, k)
    else:
        top, expert_index = jax.lax.top_k(logits, k)
        gates = jax.nn.softmax(top, axis=-1)
    capacity = expert_capacity(k, groups.shape[1], capacity_ratio, num_experts)
    slot = allocate(expert_index, capacity, num_experts)
    buffers = experts(params["experts"], dispatch(groups, expert_index, slot, num_experts, capacity))
    output = combine(buffers, expert_index, slot, gates).reshape(batch, tokens, width)
    aux = 0.01 * (0.5 * importance_loss(logits) + 0.5 * load_loss(logits, logits, k, 1.0 / num_experts))
    return output, slot >= 0, aux
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "layer_tests", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
x = rng.normal(size=(4, 6, SMALL["width"])).astype(np.float32)
if LIBRARY:
    for k, ratio in ((2, 1.0), (1, 1.0)):
        layer, params = library_moe(k=k, capacity_ratio=ratio)
        output, served, aux = moe_layer(params, x, k, ratio, SMALL["group_size"])
        theirs = layer(jnp.asarray(x))
        close(served, theirs.routing.served, f"served choices (k = {k}, C = {ratio})", 0)
        close(output, theirs.output, f"output (k = {k}, C = {ratio})", 1e-4)
        close(aux, theirs.aux_loss, f"aux loss (k = {k}, C = {ratio})", 1e-6)
    print("ok: moe_layer equals the library's SparseMoE: the outputs, the dropped choices and the aux loss")
else:
    print("the library is not installed here: grading compares moe_layer with it")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares with moe_course.layers.SparseMoE
_answers.record("layer_tests", moe_layer)
### END HIDDEN TESTS

# %% [markdown]
# ## 12. The router's gradient, in both orders (3 points)
#
# Chapter 2 says that with k = 1 Shazeer et al.'s order gives the router no gradient. See it on your own layer:
# `router_gradient(params, x, w, capacity_ratio, group_size, order)` returns the gradient of `sum(output * w)`
# (the output of your `moe_layer` with k = 1; `w` has the output's shape; the aux loss left out) with respect to
# `params["router"]["kernel"]`, computed with `jax.grad`, shape `(D, E)`.

# %% nbgrader={"grade": false, "grade_id": "gradient_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def router_gradient(params, x, w, capacity_ratio, group_size, order):
    ### BEGIN SOLUTION
    def loss(kernel):
        routed = {**params, "router": {"kernel": kernel}}
        return jnp.sum(moe_layer(routed, x, 1, capacity_ratio, group_size, order)[0] * w)

    return jax.grad(loss)(jnp.asarray(params["router"]["kernel"]))
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "gradient_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
w = rng.normal(size=x.shape).astype(np.float32)
if LIBRARY:
    for order in ("softmax_then_topk", "topk_then_softmax"):
        layer, params = library_moe(k=1, router_order=order)
        mine = router_gradient(params, x, w, SMALL["capacity_ratio"], SMALL["group_size"], order)
        grads = nnx.grad(lambda model: jnp.sum(model(jnp.asarray(x)).output * w))(layer)
        close(mine, nnx.to_pure_dict(grads)["router"]["kernel"], f"router gradient ({order})", 1e-4)
        print(f"{order}: the router's gradient has norm {float(jnp.linalg.norm(mine)):.4g}")
    print("ok: router_gradient equals the library layer's gradient in both orders")
else:
    print("the library is not installed here: grading compares router_gradient with it")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares with moe_course.layers.SparseMoE
_answers.record("gradient_tests", router_gradient)
### END HIDDEN TESTS

# %% [markdown]
# ## 13. Explain: dropped tokens (2 points, graded by the instructor)
#
# At a capacity ratio C = 1 every expert has exactly as many slots as the tokens would need if the router
# spread its choices evenly, yet your layer drops tokens even then (task 11's tests route a group at C = 1). Why?
# And what happens to a token whose every choice was dropped -- what does the MoE layer output for it, and where
# does its information go on? Answer in three to six sentences in the cell below (replace `YOUR ANSWER HERE`).

# %% [markdown] nbgrader={"grade": true, "grade_id": "dropped_explain", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# C = 1 gives each expert `k * tokens / E` slots: enough only if the router's choices are spread evenly. They
# are not: the router sends more choices to some experts than to others (its preferences, noise, an untrained
# or specialised router), so a popular expert's buffer fills and the choices that come after are dropped,
# while other experts keep empty slots. The balancing losses (importance, load) push towards even use but
# never make it exact. A dropped choice adds nothing: a token with all its choices dropped gets a zero MoE
# output, and the residual connection carries its input unchanged to the next block, so it is not lost, only
# not processed by an expert in this layer.
#
# Rubric (2 points): 1 point for uneven demand -- some experts chosen by more tokens than their B slots
# (imbalance; capacity is set by the average); 1 point for the dropped token's path: zero contribution from the
# layer, carried on by the residual (skip) connection. 0 for "the capacity is too small" without the
# imbalance, or for "the token is deleted / removed from the sequence".
# ### END SOLUTION
