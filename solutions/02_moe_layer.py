# %% [markdown]
# # Assignment 2: the sparse MoE layer's router, capacity, allocation and losses
#
# Chapter 2 built a sparse Mixture-of-Experts layer from its parts. You write five pieces in NumPy: TOP-k
# routing, the expert capacity, the importance and load losses (V-MoE App. A.2), and one allocation the
# chapter does not write out, Experts Choice -- but first you predict what Experts Choice does with a router
# that has learned nothing. Then you fix a gate function that takes its softmax at the wrong moment, and
# explain in words why tokens are dropped (graded by your instructor). Shapes follow the library: `(groups, tokens, experts)` for router
# logits, `(groups, tokens, k)` for the choices. Replace every `raise NotImplementedError()`; the visible
# tests help, further tests compare your functions with `moe_course.routing` when your notebook is graded.
#
# Check your work with `moe-course check 02_moe_layer.ipynb` (the visible tests, with the base install).

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
print("ok: top_k_routing keeps the softmax probabilities of the k largest, ties to the lower expert")
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
print("ok: expert_capacity on 3 cases (plain, a half rounding up, at least one slot)")
### BEGIN HIDDEN TESTS
import moe_course.course.answers as _answers  # the grader compares the outputs with moe_course.routing
_answers.record("capacity_tests", expert_capacity)
### END HIDDEN TESTS

# %% [markdown]
# ## 3. Predict first (2 points)
#
# Before you write Experts Choice (task 4, read its description first): a router that has learned nothing
# gives every token the same probability for every expert (all logits equal). A group of 16 tokens is routed
# with Experts Choice over 4 experts, each taking `capacity = 4` tokens. How many of the 16 tokens get NO
# expert at all? Write the number now; the check after the last task counts it with your `experts_choice`.
#
# In the cell below, replace `raise NotImplementedError()` with `PREDICTED_UNSERVED = your number`.

# %% nbgrader={"grade": false, "grade_id": "unserved_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
### BEGIN SOLUTION
PREDICTED_UNSERVED = 12
### END SOLUTION

# %% [markdown]
# ## 4. Experts Choice (4 points)
#
# The chapter's allocations let every TOKEN choose its experts and drop what does not fit. Experts Choice
# routing (Zhou et al. 2022, [arXiv:2202.09368](https://arxiv.org/abs/2202.09368)) turns this around: every
# EXPERT takes the `capacity` tokens of the group with the highest router probability for it, so no buffer
# overflows, but a token may be taken by several experts or by none. `experts_choice(probs, capacity)` gets
# router probabilities `(groups, tokens, experts)` and returns the slots `(groups, tokens, experts)`: where
# token t sits in expert e's buffer (0 for the token with expert e's highest probability, 1 for the next,
# ..., among equal probabilities the lower token index first), or -1 when expert e did not take token t.
# Hint: sort each expert's tokens, then ask where each token ended up in that order.

# %% nbgrader={"grade": false, "grade_id": "experts_choice_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def experts_choice(probs, capacity):
    ### BEGIN SOLUTION
    per_expert = probs.transpose(0, 2, 1)
    order = np.argsort(-per_expert, axis=-1, kind="stable")
    place = np.argsort(order, axis=-1)
    return np.where(place < capacity, place, -1).transpose(0, 2, 1)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "experts_choice_tests", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
probs = np.array([[[0.7, 0.3], [0.2, 0.8], [0.6, 0.4]]])  # 3 tokens, 2 experts
slot = experts_choice(probs, 2)
assert slot.shape == (1, 3, 2), f"expected shape (1, 3, 2), got {slot.shape}"
assert slot.tolist() == [[[0, -1], [-1, 0], [1, 1]]], f"expert 0 takes tokens 0, 2, expert 1 1, 2: {slot.tolist()}"
tied = experts_choice(np.full((1, 4, 2), 0.5), 2)
assert tied.tolist() == [[[0, 0], [1, 1], [-1, -1], [-1, -1]]], f"ties: the lower token first; got {tied.tolist()}"
print("ok: experts_choice puts each expert's top tokens in its slots, ties to the lower token")
### BEGIN HIDDEN TESTS
import moe_course.course.answers as _answers  # the grader compares the outputs with moe_course.routing
_answers.record("experts_choice_tests", experts_choice)
### END HIDDEN TESTS

# %% [markdown]
# ## 5. Importance loss (2 points)
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
print("ok: importance_loss is 0 when balanced and large when one expert takes everything")
### BEGIN HIDDEN TESTS
import moe_course.course.answers as _answers  # the grader compares the outputs with moe_course.routing
_answers.record("importance_tests", importance_loss)
### END HIDDEN TESTS

# %% [markdown]
# ## 6. Load loss (3 points)
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
print(f"ok: load_loss returns a non-negative float ({value:.4f} here)")
### BEGIN HIDDEN TESTS
import moe_course.course.answers as _answers  # the grader compares the outputs with moe_course.routing
_answers.record("load_tests", load_loss)
### END HIDDEN TESTS

# %% [markdown]
# ## 7. Debug: the gates of the chosen experts (2 points)
#
# `sparse_gates(logits, k)` below is meant to give the gate matrix of a V-MoE layer: router logits `(groups,
# tokens, experts)` in, the same shape out, each token's k chosen experts holding their gates as V-MoE
# computes them (`TOP_k(softmax(logits))`, your task 1) and every other expert 0. It runs and picks the right
# experts, but it holds one bug, a failure mode chapter 2 shows -- with k = 1 it would leave the router
# without a gradient. Run the test below it, find the bug and fix it in the cell.

# %% nbgrader={"grade": false, "grade_id": "softmax_debug", "locked": false, "schema_version": 3, "solution": true, "task": false}
### BEGIN HANDOUT
def sparse_gates(logits, k):
    top = np.argsort(-logits, axis=-1, kind="stable")[..., :k]  # the k largest logits: the k chosen experts
    chosen = np.take_along_axis(logits, top, axis=-1)
    weights = np.exp(chosen - chosen.max(axis=-1, keepdims=True))
    weights = weights / weights.sum(axis=-1, keepdims=True)  # the softmax
    gates = np.zeros_like(logits)
    np.put_along_axis(gates, top, weights, axis=-1)
    return gates
### END HANDOUT
### BEGIN SOLUTION
def sparse_gates(logits, k):
    probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs = probs / probs.sum(axis=-1, keepdims=True)  # the softmax, over all experts first
    top = np.argsort(-probs, axis=-1, kind="stable")[..., :k]  # then the k largest: the k chosen experts
    gates = np.zeros_like(logits)
    np.put_along_axis(gates, top, np.take_along_axis(probs, top, axis=-1), axis=-1)
    return gates
### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "gates_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
gates = sparse_gates(np.log(np.array([[[0.1, 0.6, 0.3]]])), 1)
assert gates.shape == (1, 1, 3), f"expected shape (1, 1, 3), got {gates.shape}"
assert (gates > 0).sum() == 1 and gates[0, 0, 1] > 0, f"k = 1 keeps expert 1 only, got {gates.tolist()}"
assert np.isclose(gates[0, 0, 1], 0.6), f"the gate of expert 1 is its probability 0.6, got {gates[0, 0, 1]:.3f}"
print("ok: sparse_gates keeps expert 1 with its probability 0.6 as the gate (k = 1)")
### BEGIN HIDDEN TESTS
import moe_course.course.answers as _answers  # the grader compares the outputs with moe_course.routing
_answers.record("gates_tests", sparse_gates)
### END HIDDEN TESTS

# %% [markdown]
# ## 8. Explain: dropped tokens (2 points, graded by the instructor)
#
# At a capacity ratio C = 1 every expert has exactly as many slots as the tokens would need if the router
# spread its choices evenly, yet chapter 2's layer drops tokens even then. Why? And what happens to a token
# whose every choice was dropped -- what does the MoE layer output for it, and where does its information go
# on? Answer in three to six sentences in the cell below (replace `YOUR ANSWER HERE`).

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

# %% [markdown]
# **The check of your prediction (task 3).** It counts, with your `experts_choice`, the tokens no expert takes.

# %% nbgrader={"grade": true, "grade_id": "unserved_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
uniform = np.full((1, 16, 4), 0.25)
counted = int((experts_choice(uniform, 4) < 0).all(axis=-1).sum())
assert PREDICTED_UNSERVED == counted, f"you predicted {PREDICTED_UNSERVED}, experts_choice leaves out {counted} tokens"
print(f"ok: predicted {PREDICTED_UNSERVED} tokens without an expert; experts_choice leaves {counted}")
### BEGIN HIDDEN TESTS
import moe_course.course.answers as _answers  # the grader counts with moe_course.routing
_answers.record("unserved_tests", lambda: PREDICTED_UNSERVED)
### END HIDDEN TESTS
