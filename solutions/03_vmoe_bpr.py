# %% [markdown]
# # Assignment 3: Batch Prioritized Routing
#
# When the expert buffers are too small for all choices (capacity ratio C < 1), vanilla routing drops the
# choices of whichever tokens come last in the group. Batch Prioritized Routing (BPR, V-MoE Sec. 4.1,
# App. C Algorithm 2) lets the tokens the router is most sure about go first. You write the priority order,
# predict how many choices BPR drops, then say who BPR serves in another way than the chapter's loop; you fix
# the routing groups of an evaluation, and explain which choices the two routings drop (graded by your
# instructor). The graded tests compare your answers with `moe_course`.
#
# Check your work with `moe-course check 03_vmoe_bpr.ipynb` (the visible tests, with the base install).

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
print("ok: priority_order by max and by sum, ties in group order")
### BEGIN HIDDEN TESTS
import moe_course.course.answers as _answers  # the grader compares the outputs with moe_course.routing
_answers.record("priority_tests", priority_order)
### END HIDDEN TESTS

# %% [markdown]
# ## 2. Predict first (2 points)
#
# Before you write who BPR serves (task 3): a group of 12 tokens is routed TOP-1 to 3 experts: 7 tokens
# choose expert 0, 3 choose expert 1 and 2 choose expert 2, with gates all different. Every buffer has
# `capacity = 4` slots. How many of the 12 choices does BPR drop? (And vanilla routing -- more, fewer, the
# same? Think about it; the graded number is BPR's.) Write the number now; the check after the last task
# counts it with your `bpr_top1_served`.
#
# In the cell below, replace `raise NotImplementedError()` with `PREDICTED_DROPPED = your number`.

# %% nbgrader={"grade": false, "grade_id": "dropped_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
### BEGIN SOLUTION
PREDICTED_DROPPED = 3
### END SOLUTION

# %% [markdown]
# ## 3. Who BPR serves, without the loop (3 points)
#
# Chapter 2 wrote BPR as a loop that fills the buffers one token at a time. For TOP-1 routing (k = 1) there
# is a shorter way to say who gets a slot: a token is served exactly when fewer than `capacity` tokens of
# its group chose the same expert AND come before it in priority order (a larger gate, or an equal gate and
# a lower token index). `bpr_top1_served(expert_index, gates, capacity)` gets each token's expert and gate,
# both `(groups, tokens)`, and returns a boolean `(groups, tokens)`: True where BPR serves the token. Write it
# without a loop over tokens (hint: compare every token with every other token of its group).

# %% nbgrader={"grade": false, "grade_id": "served_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def bpr_top1_served(expert_index, gates, capacity):
    ### BEGIN SOLUTION
    tokens = expert_index.shape[1]
    earlier = np.arange(tokens)[None, :, None] < np.arange(tokens)[None, None, :]  # [j, i]: j before i in the group
    ahead = (gates[:, :, None] > gates[:, None, :]) | ((gates[:, :, None] == gates[:, None, :]) & earlier)
    rivals = ahead & (expert_index[:, :, None] == expert_index[:, None, :])
    return rivals.sum(axis=1) < capacity
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "served_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
experts = np.array([[0, 0, 0, 1, 0]])
gates = np.array([[0.4, 0.9, 0.4, 0.3, 0.5]])
served = bpr_top1_served(experts, gates, 2)
assert served.tolist() == [[False, True, False, True, True]], f"expert 0 serves tokens 1 and 4; got {served.tolist()}"
assert bpr_top1_served(experts, gates, 3).tolist() == [[True, True, False, True, True]], "equal gates: token 0 first"
print("ok: bpr_top1_served keeps each expert's highest gates, equal gates in group order")
### BEGIN HIDDEN TESTS
import moe_course.course.answers as _answers  # the grader compares the outputs with moe_course.routing
_answers.record("served_tests", bpr_top1_served)
### END HIDDEN TESTS

# %% [markdown]
# ## 4. Debug: routing groups for an evaluation (2 points)
#
# A V-MoE routes a group of images together, so which images share a group matters at evaluation too.
# `evaluation_groups(labels, group_size, seed)` below is meant to cut a split into the routing groups the
# course's evaluation uses: `(groups, group_size)` image indices, the images taken in the evaluation's fixed
# shuffled order -- for seed `s` that order is `np.random.default_rng([s, 0xE7A1]).permutation(n)`, what
# `moe_course.data.base.eval_batches` walks -- and a last incomplete group left out. It runs and returns the
# right shape, but it holds one bug, a failure mode chapter 3 describes (it costs the chapter's V-MoE about
# three points of accuracy). Run the test below it, find the bug and fix it in the cell.

# %% nbgrader={"grade": false, "grade_id": "order_debug", "locked": false, "schema_version": 3, "solution": true, "task": false}
### BEGIN HANDOUT
def evaluation_groups(labels, group_size, seed):
    n = len(labels)
    order = np.arange(n)  # the split's images, in the order they are stored
    usable = n - n % group_size  # a last incomplete group is left out
    return order[:usable].reshape(-1, group_size)
### END HANDOUT
### BEGIN SOLUTION
def evaluation_groups(labels, group_size, seed):
    n = len(labels)
    order = np.random.default_rng([seed, 0xE7A1]).permutation(n)  # the evaluation's fixed shuffled order
    usable = n - n % group_size  # a last incomplete group is left out
    return order[:usable].reshape(-1, group_size)
### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "evaluation_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
stored = np.repeat(np.arange(4), 8)  # a test split stored sorted by class, as the digits' is: 4 classes x 8
groups = evaluation_groups(stored, 8, 0)
assert groups.shape == (4, 8), f"expected 4 groups of 8, got {groups.shape}"
assert sorted(groups.ravel().tolist()) == list(range(32)), "every image once"
classes = [len(set(stored[group].tolist())) for group in groups]
assert min(classes) > 1, f"classes per group: {classes} -- a group of one class wants the same experts"
print(f"ok: evaluation_groups mixes the classes: {classes} classes in the 4 groups")
### BEGIN HIDDEN TESTS
import moe_course.course.answers as _answers  # the grader compares with moe_course.data.base.eval_batches
_answers.record("evaluation_tests", evaluation_groups)
### END HIDDEN TESTS

# %% [markdown]
# ## 5. Explain: which choices are dropped (2 points, graded by the instructor)
#
# At a capacity ratio C = 0.5 about half of the choices in a group find no slot, with vanilla routing and
# with BPR alike. Which choices does each of them drop, and why does the trained V-MoE of chapter 3 keep far
# more of its accuracy with BPR's drops than with vanilla's? Answer in three to six sentences in the cell
# below (replace `YOUR ANSWER HERE`).

# %% [markdown] nbgrader={"grade": true, "grade_id": "drops_explain", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# Vanilla routing fills the buffers in the group's token order, so it drops the choices of whichever tokens
# come last -- the last images of the group and the bottom patches of each image -- whatever they hold. BPR
# sorts the choices by priority, the router's largest gate, and drops the least confident ones first. The
# router is most confident on the patches that matter (on the digit: chapter 3 section 3 draws them) and least
# on background, so BPR's dropped tokens carry little of the class; the residual path carries every dropped
# token on unchanged, so dropping background costs little, while vanilla also drops whole informative images.
#
# Rubric (2 points): 1 point for the two orders (vanilla: position in the group; BPR: lowest priority score /
# gate first); 1 point for why BPR costs less: its drops are the uninformative (background) patches the router
# is unsure about, while vanilla's fall on whatever comes last, informative or not. Mentioning the residual
# path is good but not needed; 0 for "BPR drops fewer tokens" (at the same C both drop about the same number).
# ### END SOLUTION

# %% [markdown]
# **The check of your prediction (task 2).** It counts, with your `bpr_top1_served`, the choices BPR drops.

# %% nbgrader={"grade": true, "grade_id": "dropped_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
routed = rng.permutation(np.array([0] * 7 + [1] * 3 + [2] * 2))[None]
counted = int((~bpr_top1_served(routed, rng.random(size=(1, 12)), 4)).sum())
assert PREDICTED_DROPPED == counted, f"you predicted {PREDICTED_DROPPED}, bpr_top1_served drops {counted}"
print(f"ok: predicted {PREDICTED_DROPPED} dropped choices; bpr_top1_served drops {counted}")
### BEGIN HIDDEN TESTS
import moe_course.course.answers as _answers  # the grader counts with moe_course.routing
_answers.record("dropped_tests", lambda: PREDICTED_DROPPED)
### END HIDDEN TESTS
