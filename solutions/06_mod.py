# %% [markdown]
# # Assignment 6: Mixture-of-Depths routing
#
# A Mixture-of-Depths block processes only the `round(C * P)` highest-scoring of an image's P tokens; the
# others skip it. You write the capacity and the selection in NumPy, predict how many patch tokens a block
# processes before your selection counts them, fix a block whose gate is unbounded, write the gradient that
# reaches a standard router's weights through the gate (which chapter 6 left to `jax.grad`), and explain what
# another gate would do; the graded tests compare your answers with `moe_course.routing.mod`. 15 points: 13
# graded automatically, 2 (task 6) by your instructor.
#
# Work in your own copy: `moe-course exercise 06` puts it in `mywork/06_mod.ipynb`. Check it with
# `moe-course check mywork/06_mod.ipynb` (the visible tests, with the base install; from the repository's root
# or any folder in it).

# %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
import numpy as np

rng = np.random.default_rng(0)

# %% [markdown]
# ## 1. Capacity (1 point)
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
print("ok: mod_capacity on 2 cases (8 of 64; at least 1)")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares the outputs with moe_course.routing.mod
_answers.record("capacity_tests", mod_capacity)
### END HIDDEN TESTS

# %% [markdown]
# ## 2. Predict first (2 points)
#
# A ViT-B/16 at 224 x 224 pixels has 196 patch tokens plus the class token: P = 197. A Mixture-of-Depths block
# with capacity C = 0.125 and `keep_first=True` (the class token always processed). How many PATCH tokens (not
# counting the class token) does the block process per image? Write the number NOW, before you write the
# selection in task 3: the check after task 3 counts it with your `mod_select`.
#
# In the cell below, replace `raise NotImplementedError()` with `PREDICTED_PATCHES = your number`.

# %% nbgrader={"grade": false, "grade_id": "patches_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
### BEGIN SOLUTION
PREDICTED_PATCHES = 24
### END SOLUTION

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
print("ok: mod_select keeps the top tokens in ascending order, and token 0 with keep_first")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares the outputs with moe_course.routing.mod
_answers.record("select_tests", mod_select)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "patches_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
index, processed = mod_select(rng.random(size=(2, 197)), 0.125, keep_first=True)
counted = int(processed[0, 1:].sum())
assert PREDICTED_PATCHES == counted, f"you predicted {PREDICTED_PATCHES}, mod_select processes {counted} patch tokens"
print(f"ok: predicted {PREDICTED_PATCHES} patch tokens; mod_select processes {counted} (and the class token)")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader counts with moe_course.routing.mod
_answers.record("patches_tests", lambda: PREDICTED_PATCHES)
### END HIDDEN TESTS

# %% [markdown]
# ## 4. Debug: a block that blows up (2 points)
#
# `mod_block(x, w, update, capacity)` below is the routed part of a Mixture-of-Depths block with standard routing,
# as public MoD code wrote it: `x` and `update` `(batch, tokens, width)` (`update[b, i]` is what the block would
# add to token i), the router's weights `w` `(width,)`; it returns the tokens after the block, `(batch, tokens,
# width)`. It runs and processes the right tokens -- and one line is the blow-up chapter 6 warns about where it
# asks where the scores come from: with large router weights the processed tokens grow without limit. Run the test
# below it, find the line and fix it in the cell as the course's library does (change as little as you can).

# %% nbgrader={"grade": false, "grade_id": "block_debug", "locked": false, "schema_version": 3, "solution": true, "task": false}
### BEGIN HANDOUT
def mod_block(x, w, update, capacity):
    r = x @ w  # (batch, tokens): A-MoD Eq. 1
    processed = mod_select(r, capacity)[1]
    gate = r  # multiplies the update, so that w receives a gradient (A-MoD Eq. 2)
    return x + np.where(processed, gate, 0.0)[..., None] * update
### END HANDOUT
### BEGIN SOLUTION
def mod_block(x, w, update, capacity):
    r = x @ w  # (batch, tokens): A-MoD Eq. 1
    processed = mod_select(r, capacity)[1]
    gate = 1.0 / (1.0 + np.exp(-r))  # bounded (the library's mod_gate); w still receives a gradient
    return x + np.where(processed, gate, 0.0)[..., None] * update
### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "block_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
x, update = rng.normal(size=(2, 3, 8, 4))
w = rng.normal(size=4)
for factor in (1.0, 100.0):  # router weights grown a hundredfold
    moved = np.linalg.norm(mod_block(x, factor * w, update, 0.5) - x, axis=-1)
    assert np.all(moved <= np.linalg.norm(update, axis=-1) + 1e-9), \
        f"with router weights x{factor:g} a token moved {moved.max():.1f}, more than its whole update"
    kept = mod_select(x @ w, 0.5)[1]
    assert np.array_equal(mod_block(x, factor * w, update, 0.5)[~kept], x[~kept]), "skipped tokens must not change"
print("ok: mod_block moves no token by more than its update, even with router weights x100; skipped tokens stay")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares the outputs with moe_course.routing.mod
_answers.record("block_tests", mod_block)
### END HIDDEN TESTS

# %% [markdown]
# ## 5. The router's gradient, by hand (4 points)
#
# Chapter 6 let `jax.grad` find that the router weights `w` get a gradient only through the gate. Here you
# write that gradient yourself. With standard routing `r_i = x_i . w`, a block keeps the `mod_capacity`
# highest-scoring tokens of each image (your `mod_select`, without `keep_first`); a kept token leaves the
# block as `y_i = x_i + sigmoid(r_i) * u_i`, where `u_i` is the block's update of that token, and a skipped
# token as `y_i = x_i`. `router_gradient(x, w, update, grad_out, capacity)` gets `x` and `update` `(batch,
# tokens, width)`, `w` `(width,)` and `grad_out` `(batch, tokens, width)`, the gradient of the loss with
# respect to `y`, and returns `dL/dw`, `(width,)`, summed over the batch. The update does not depend on `w`,
# and which tokens are kept does not change under a small change of `w`.

# %% nbgrader={"grade": false, "grade_id": "gradient_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def router_gradient(x, w, update, grad_out, capacity):
    ### BEGIN SOLUTION
    r = x @ w
    kept = mod_select(r, capacity)[1]
    gate = 1.0 / (1.0 + np.exp(-r))
    d_r = np.where(kept, (grad_out * update).sum(axis=-1) * gate * (1.0 - gate), 0.0)
    return np.einsum("bt,btd->d", d_r, x)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "gradient_tests", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
x, update, grad_out = rng.normal(size=(3, 2, 8, 4))
w = rng.normal(size=4)


def loss(w):  # L = sum(y * grad_out): its gradient with respect to y is grad_out
    r = x @ w
    kept = mod_select(r, 0.5)[1]
    return float(((x + np.where(kept, 1.0 / (1.0 + np.exp(-r)), 0.0)[..., None] * update) * grad_out).sum())


numeric = np.array([(loss(w + 1e-6 * e) - loss(w - 1e-6 * e)) / 2e-6 for e in np.eye(4)])
mine = router_gradient(x, w, update, grad_out, 0.5)
assert mine.shape == (4,), f"expected shape (4,), got {np.shape(mine)}"
assert np.allclose(mine, numeric, atol=1e-5), f"router_gradient {mine} differs from finite differences {numeric}"
print("ok: router_gradient equals finite differences of the loss on 2 images of 8 tokens")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares with jax.grad through moe_course.routing.mod
_answers.record("gradient_tests", router_gradient)
### END HIDDEN TESTS


# %% [markdown]
# ## 6. Explain (2 points, graded by your instructor)
#
# A colleague bounds the gate of task 4 differently: `gate = np.clip(r, 0, 1)` instead of your fix. In three to
# six sentences: does this change which tokens the block processes? What happens to the router's learning --
# use your `router_gradient`: which tokens still send a gradient to `w`, at initialisation and later? Write your
# answer in the cell below, in place of `YOUR ANSWER HERE`.

# %% [markdown] nbgrader={"grade": true, "grade_id": "gate_explain", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# The choice does not change: the block selects by the score `r` itself, before any gate, so the processed tokens
# are the same with either gate. The learning does: the gradient reaching `w` through a token is
# `(grad_out . u) * gate'(r) * x`, and the clipped gate's derivative is 0 wherever `r < 0` or `r > 1`. A processed
# token with a negative score gets gate 0 -- its update is thrown away -- and sends no gradient, so the router
# cannot learn to raise it; one with `r > 1` sends none either. At initialisation the scores are spread around 0,
# so about half the processed tokens are silent (and their updates lost); later, scores pushed above 1 freeze.
# The sigmoid's derivative is positive everywhere, so every processed token keeps teaching the router.
#
# Rubric (2 points): 1 point for "the selection uses r, not the gate: the same tokens are processed". 1 point for
# the gradient argument: the clip's derivative vanishes outside [0, 1], so those processed tokens send no
# gradient to w (naming the negative scores at initialisation, or the lost updates at gate 0, is enough). No
# point for "clipping is also bounded, so it is fine" without the gradient.
# ### END SOLUTION
