# %% [markdown]
# # Assignment 2: the sparse MoE layer's router, capacity, allocation and losses
#
# Chapter 2 built a sparse Mixture-of-Experts layer from its parts. You write five of them in NumPy:
# TOP-k routing, the expert capacity, the vanilla allocation loop (V-MoE App. C, Algorithm 1), and the
# importance and load losses (App. A.2). Shapes follow the library: `(groups, tokens, experts)` for router
# logits, `(groups, tokens, k)` for the choices. Replace every `raise NotImplementedError()`; the visible
# tests help, further tests compare your functions with `moe_course.routing` when your notebook is graded.
#
# Run `moe-course course validate 02_moe_layer.ipynb` before you hand in.

# %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
import math

import numpy as np

rng = np.random.default_rng(0)

# %% [markdown]
# ## 1. TOP-k routing (3 points)
#
# V-MoE routes with `TOP_k(softmax(logits))`: the softmax over the experts comes first, then the k largest
# probabilities are kept, unchanged, as the gates. `top_k_routing(logits, k)` returns `(expert_index,
# gates)`, both `(groups, tokens, k)`, the largest first; among equal probabilities the lower expert index
# comes first (hint: a stable sort of the negated probabilities).

# %% nbgrader={"grade": false, "grade_id": "topk_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def top_k_routing(logits, k):
    ### BEGIN SOLUTION
    shifted = logits - logits.max(axis=-1, keepdims=True)
    probs = np.exp(shifted) / np.exp(shifted).sum(axis=-1, keepdims=True)
    expert_index = np.argsort(-probs, axis=-1, kind="stable")[..., :k]
    return expert_index, np.take_along_axis(probs, expert_index, axis=-1)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "topk_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
index, gates = top_k_routing(np.log(np.array([[[0.1, 0.6, 0.3]]])), 2)
assert index.tolist() == [[[1, 2]]], f"expected experts [1, 2], got {index.tolist()}"
assert np.allclose(gates, [[[0.6, 0.3]]]), f"the gates are the probabilities themselves, got {gates}"
assert top_k_routing(np.zeros((1, 1, 4)), 2)[0].tolist() == [[[0, 1]]], "ties go to the lower expert index"
### BEGIN HIDDEN TESTS
import moe_course.course.answers as _answers  # the grader compares the outputs with moe_course.routing
_answers.record("topk_tests", top_k_routing)
### END HIDDEN TESTS

# %% [markdown]
# ## 2. Expert capacity (2 points)
#
# Every expert has a buffer of `B = round(k * tokens * C / E)` slots per group (V-MoE Sec. 2.4), where a half
# rounds up (2.5 -> 3) and the buffer holds at least one slot. `expert_capacity(k, tokens, capacity_ratio,
# num_experts)` returns that integer.

# %% nbgrader={"grade": false, "grade_id": "capacity_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def expert_capacity(k, tokens, capacity_ratio, num_experts):
    ### BEGIN SOLUTION
    return max(1, math.floor(k * tokens * capacity_ratio / num_experts + 0.5 + 1e-9))
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "capacity_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
assert expert_capacity(2, 16, 1.0, 8) == 4
assert expert_capacity(1, 10, 1.0, 4) == 3, "2.5 rounds up to 3"
assert expert_capacity(1, 4, 0.1, 8) == 1, "at least one slot"
### BEGIN HIDDEN TESTS
import moe_course.course.answers as _answers  # the grader compares the outputs with moe_course.routing
_answers.record("capacity_tests", expert_capacity)
### END HIDDEN TESTS

# %% [markdown]
# ## 3. Vanilla allocation (4 points)
#
# Algorithm 1 of V-MoE fills the buffers in two nested loops: for i = 1..k, for every token in group order,
# the token's TOP-i choice takes the next free slot of its expert, or is dropped when that expert's buffer
# is full. `vanilla_slots(expert_index, capacity, num_experts)` returns, for every choice `(groups, tokens,
# k)`, its slot `0..capacity-1` in its expert's buffer, or -1 when it was dropped. Write the loops.

# %% nbgrader={"grade": false, "grade_id": "vanilla_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def vanilla_slots(expert_index, capacity, num_experts):
    ### BEGIN SOLUTION
    groups, tokens, k = expert_index.shape
    slot = np.full(expert_index.shape, -1)
    for g in range(groups):
        fill = np.zeros(num_experts, int)
        for i in range(k):
            for t in range(tokens):
                e = expert_index[g, t, i]
                if fill[e] < capacity:
                    slot[g, t, i] = fill[e]
                    fill[e] += 1
    return slot
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "vanilla_tests", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
choices = np.array([[[0, 1], [0, 2], [0, 1]]])  # three tokens, k = 2
slots = vanilla_slots(choices, 2, 3)
assert slots.tolist() == [[[0, 0], [1, 0], [-1, 1]]], f"got {slots.tolist()}"
### BEGIN HIDDEN TESTS
import moe_course.course.answers as _answers  # the grader compares the outputs with moe_course.routing
_answers.record("vanilla_tests", vanilla_slots)
### END HIDDEN TESTS

# %% [markdown]
# ## 4. Importance loss (2 points)
#
# `Imp_e` is the sum over a group's tokens of the softmax probability of expert e (of the clean logits);
# the importance loss is its squared coefficient of variation over the experts, `var / mean^2` (population
# variance), averaged over the groups. `importance_loss(logits)`: `(groups, tokens, experts)` -> a float.

# %% nbgrader={"grade": false, "grade_id": "importance_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def importance_loss(logits):
    ### BEGIN SOLUTION
    probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs = probs / probs.sum(axis=-1, keepdims=True)
    importance = probs.sum(axis=1)
    return float(np.mean(importance.var(axis=-1) / importance.mean(axis=-1) ** 2))
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "importance_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
assert abs(importance_loss(np.zeros((2, 5, 4)))) < 1e-12, "balanced probabilities: no loss"
assert importance_loss(np.array([[[9.0, 0.0], [9.0, 0.0]]])) > 0.9, "one expert takes everything"
### BEGIN HIDDEN TESTS
import moe_course.course.answers as _answers  # the grader compares the outputs with moe_course.routing
_answers.record("importance_tests", importance_loss)
### END HIDDEN TESTS

# %% [markdown]
# ## 5. Load loss (3 points)
#
# For a token, let `threshold` be the k-th largest NOISY logit. The probability that expert e would still be
# selected if its noise were drawn again is `p_e = 1 - Phi((threshold - logit_e) / sigma)`, with the clean
# logit and `Phi` the standard normal CDF (`math.erf` gives it: `Phi(z) = (1 + erf(z / sqrt(2))) / 2`).
# `load_e` sums `p_e` over the group's tokens; the load loss is its squared coefficient of variation,
# averaged over groups. `load_loss(logits, noisy_logits, k, sigma)` -> a float.

# %% nbgrader={"grade": false, "grade_id": "load_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def load_loss(logits, noisy_logits, k, sigma):
    ### BEGIN SOLUTION
    threshold = np.sort(noisy_logits, axis=-1)[..., -k][..., None]
    z = (threshold - logits) / sigma
    p = 1.0 - 0.5 * (1.0 + np.vectorize(math.erf)(z / math.sqrt(2.0)))
    load = p.sum(axis=1)
    return float(np.mean(load.var(axis=-1) / load.mean(axis=-1) ** 2))
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "load_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
clean = rng.normal(size=(2, 8, 4))
value = load_loss(clean, clean + 0.25 * rng.normal(size=clean.shape), 2, 0.25)
assert isinstance(value, float) and value >= 0.0, f"a non-negative float, got {value!r}"
### BEGIN HIDDEN TESTS
import moe_course.course.answers as _answers  # the grader compares the outputs with moe_course.routing
_answers.record("load_tests", load_loss)
### END HIDDEN TESTS
