# %% [markdown]
# # Assignment 6: Mixture-of-Depths routing
#
# A Mixture-of-Depths block processes only the `round(C * P)` highest-scoring of an image's P tokens; the
# others skip it. A-MoD (Gadhikar et al., Sec. 3) scores a token by the attention it received in the
# previous block, with no router parameters. You write the capacity, both routing scores and the selection
# in NumPy; the graded tests compare them with `moe_course.routing.mod`.
#
# Run `moe-course course validate 06_mod.ipynb` before you hand in.

# %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
import numpy as np

rng = np.random.default_rng(0)

# %% [markdown]
# ## 1. Routing scores (3 points)
#
# Standard routing (A-MoD Eq. 1): a linear router, `r_i = x_i . w` for tokens `x` `(batch, tokens, width)`
# and a weight vector `w` `(width,)`. Attention routing (Eq. 4): `r_i` is the attention token i receives,
# averaged over the heads and the query rows of the previous block's maps `(batch, heads, queries, keys)`.
# Both return `(batch, tokens)`.

# %% nbgrader={"grade": false, "grade_id": "scores_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def standard_scores(x, w):
    ### BEGIN SOLUTION
    return x @ w
    ### END SOLUTION


def attention_scores(attention):
    ### BEGIN SOLUTION
    return attention.mean(axis=(1, 2))
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "scores_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
maps = rng.random(size=(2, 3, 5, 5))
maps = maps / maps.sum(axis=-1, keepdims=True)
scores = attention_scores(maps)
assert scores.shape == (2, 5), f"expected (2, 5), got {scores.shape}"
assert np.allclose(scores.sum(axis=-1), 1.0), "an image's attention scores sum to 1"
assert standard_scores(np.ones((1, 2, 3)), np.array([1.0, 2.0, 3.0])).tolist() == [[6.0, 6.0]]
### BEGIN HIDDEN TESTS
import moe_course.course.answers as _answers  # the grader compares the outputs with moe_course.routing.mod
_answers.record("scores_tests", (standard_scores, attention_scores))
### END HIDDEN TESTS

# %% [markdown]
# ## 2. Capacity (1 point)
#
# `mod_capacity(tokens, capacity)`: how many tokens a block processes, `round(capacity * tokens)` with
# Python's `round`, at least 1.

# %% nbgrader={"grade": false, "grade_id": "capacity_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def mod_capacity(tokens, capacity):
    ### BEGIN SOLUTION
    return max(1, round(capacity * tokens))
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "capacity_tests", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
assert mod_capacity(64, 0.125) == 8 and mod_capacity(3, 0.1) == 1
### BEGIN HIDDEN TESTS
import moe_course.course.answers as _answers  # the grader compares the outputs with moe_course.routing.mod
_answers.record("capacity_tests", mod_capacity)
### END HIDDEN TESTS

# %% [markdown]
# ## 3. Selection (4 points)
#
# `mod_select(scores, capacity, keep_first)` returns `(index, processed)`: `index` `(batch, selected)` holds
# the positions of the `mod_capacity(tokens, capacity)` highest-scoring tokens of every image IN ASCENDING
# ORDER (so the processed tokens keep their order); `processed` `(batch, tokens)` is True at those
# positions. Equal scores go to the earlier token. With `keep_first=True` token 0 (the class token) is
# always selected, and counts towards the budget.

# %% nbgrader={"grade": false, "grade_id": "select_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def mod_select(scores, capacity, keep_first=False):
    ### BEGIN SOLUTION
    batch, tokens = scores.shape
    ranked = scores.astype(float).copy()
    if keep_first:
        ranked[:, 0] = np.inf
    top = np.argsort(-ranked, axis=1, kind="stable")[:, :mod_capacity(tokens, capacity)]
    index = np.sort(top, axis=1)
    processed = np.zeros((batch, tokens), bool)
    np.put_along_axis(processed, index, True, axis=1)
    return index, processed
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "select_tests", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
index, processed = mod_select(np.array([[0.1, 0.5, 0.2, 0.9]]), 0.5)
assert index.tolist() == [[1, 3]] and processed.tolist() == [[False, True, False, True]], (index, processed)
assert mod_select(np.array([[0.1, 0.5, 0.2, 0.9]]), 0.5, keep_first=True)[0].tolist() == [[0, 3]]
### BEGIN HIDDEN TESTS
import moe_course.course.answers as _answers  # the grader compares the outputs with moe_course.routing.mod
_answers.record("select_tests", mod_select)
### END HIDDEN TESTS
