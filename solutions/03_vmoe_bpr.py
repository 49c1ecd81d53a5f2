# %% [markdown]
# # Assignment 3: Batch Prioritized Routing
#
# When the expert buffers are too small for all choices (capacity ratio C < 1), vanilla routing drops the
# choices of whichever tokens come last in the group. Batch Prioritized Routing (BPR, V-MoE Sec. 4.1,
# App. C Algorithm 2) lets the tokens the router is most sure about go first. You write the priority order
# and the BPR allocation in NumPy; the graded tests compare them with `moe_course.routing`.
#
# Run `moe-course course validate 03_vmoe_bpr.ipynb` before you hand in.

# %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
import numpy as np

rng = np.random.default_rng(0)

# %% [markdown]
# ## 1. Priority order (2 points)
#
# A token's priority score is its largest gate (`score="max"`) or the sum of its k gates (`score="sum"`).
# `priority_order(gates, score)` gets gates `(groups, tokens, k)` and returns `(groups, tokens)`: for every
# group, the token indices from the highest score to the lowest; equal scores keep the group order (lower
# token index first).

# %% nbgrader={"grade": false, "grade_id": "priority_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def priority_order(gates, score="max"):
    ### BEGIN SOLUTION
    scores = gates.max(axis=-1) if score == "max" else gates.sum(axis=-1)
    return np.argsort(-scores, axis=1, kind="stable")
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "priority_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
gates = np.array([[[0.2, 0.1], [0.5, 0.0], [0.2, 0.2]]])
assert priority_order(gates, "max").tolist() == [[1, 0, 2]], "highest max gate first, ties in group order"
assert priority_order(gates, "sum").tolist() == [[1, 2, 0]]
### BEGIN HIDDEN TESTS
import moe_course.course.answers as _answers  # the grader compares the outputs with moe_course.routing
_answers.record("priority_tests", priority_order)
### END HIDDEN TESTS

# %% [markdown]
# ## 2. BPR allocation (4 points)
#
# Algorithm 2: for i = 1..k, for every token in PRIORITY order, the token's TOP-i choice takes the next free
# slot of its expert, or is dropped when the buffer is full. `bpr_slots(expert_index, gates, capacity,
# num_experts, score)` returns each choice's slot `(groups, tokens, k)` in token order (not priority
# order), -1 for a dropped choice. Use your `priority_order`.

# %% nbgrader={"grade": false, "grade_id": "bpr_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def bpr_slots(expert_index, gates, capacity, num_experts, score="max"):
    ### BEGIN SOLUTION
    groups, tokens, k = expert_index.shape
    order = priority_order(gates, score)
    slot = np.full(expert_index.shape, -1)
    for g in range(groups):
        fill = np.zeros(num_experts, int)
        for i in range(k):
            for t in order[g]:
                e = expert_index[g, t, i]
                if fill[e] < capacity:
                    slot[g, t, i] = fill[e]
                    fill[e] += 1
    return slot
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "bpr_tests", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
choices = np.array([[[0, 1], [0, 1], [0, 1]]])
gates = np.array([[[0.4, 0.3], [0.7, 0.2], [0.5, 0.1]]])
slots = bpr_slots(choices, gates, 2, 2)
assert slots.tolist() == [[[-1, -1], [0, 0], [1, 1]]], f"token 0 has the lowest priority, got {slots.tolist()}"
### BEGIN HIDDEN TESTS
import moe_course.course.answers as _answers  # the grader compares the outputs with moe_course.routing
_answers.record("bpr_tests", bpr_slots)
### END HIDDEN TESTS

# %% [markdown]
# ## 3. What BPR buys (1 point)
#
# `dropped_fraction(slots)` is the fraction of the TOP-1 choices (`slots[..., 0]`) that were dropped. With
# the same routing and a small capacity, BPR drops as many TOP-1 choices as vanilla routing, but the ones it
# drops belong to tokens with low gates. Compute it.

# %% nbgrader={"grade": false, "grade_id": "dropped_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def dropped_fraction(slots):
    ### BEGIN SOLUTION
    return float(np.mean(slots[..., 0] < 0))
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "dropped_tests", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
assert dropped_fraction(np.array([[[0, -1], [-1, -1], [1, 0], [-1, 2]]])) == 0.5
### BEGIN HIDDEN TESTS
import moe_course.course.answers as _answers  # the grader compares the outputs with moe_course.routing
_answers.record("dropped_tests", dropped_fraction)
### END HIDDEN TESTS
