# %% [markdown]
# # Assignment 5: what Soft MoE's slots see
#
# Soft MoE (Puigcerver et al., Sec. 2) replaces the discrete router by two softmaxes of one logit matrix
# `scale * cos(x_t, phi_s)`: every slot is a weighted average of all tokens (dispatch, the softmax over the
# tokens), every output token a weighted average of all slot outputs (combine, the softmax over the slots).
# Chapter 5 wrote the layer out for one small group. Here you measure what the slots see, for tokens `x` of
# shape `(groups, tokens, width)` and per-slot parameters `phi` of shape `(width, slots)`: how many tokens a
# slot really averages, and which token a slot copies when the scale grows large; you predict how the layer
# responds when the tokens are scaled, fix a layer that normalises what the paper does not, and explain what
# that mistake costs. The graded tests compare with `moe_course.routing.soft`. 13 points: 11 graded
# automatically, 2 (task 5) by your instructor.
#
# Work in your own copy: `moe-course exercise 05` puts it in `mywork/05_soft_moe.ipynb`. Check it with
# `moe-course check mywork/05_soft_moe.ipynb` (the visible tests, with the base install; from the repository's
# root or any folder in it).

# %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
import numpy as np

rng = np.random.default_rng(0)
EPS = 1e-6  # added to the squared norm before the square root, as the library does


def softmax(z, axis):
    z = z - z.max(axis=axis, keepdims=True)
    return np.exp(z) / np.exp(z).sum(axis=axis, keepdims=True)


# %% [markdown]
# ## 1. How many tokens does a slot average? (3 points)
#
# A slot's dispatch weights `D[:, s]` (the softmax of the logits over the TOKENS) say how much of each token
# goes into it. Their *effective number of tokens* is `1 / sum_t D[t, s]**2`: T when the slot averages all T
# tokens equally, 1 when it copies one token. `effective_tokens(logits)`: logits `(groups, tokens, slots)` ->
# `(groups, slots)`.

# %% nbgrader={"grade": false, "grade_id": "effective_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def effective_tokens(logits):
    ### BEGIN SOLUTION
    dispatch = softmax(logits, axis=1)
    return 1.0 / (dispatch**2).sum(axis=1)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "effective_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
assert np.allclose(effective_tokens(np.zeros((2, 6, 3))), 6.0), "equal logits: every slot averages all 6 tokens"
peaked = np.zeros((1, 6, 2))
peaked[0, 4, 0] = peaked[0, 1, 1] = 100.0
assert np.allclose(effective_tokens(peaked), 1.0), "one token far ahead: the slot copies it"
assert effective_tokens(rng.normal(size=(2, 5, 4))).shape == (2, 4)
print("ok: effective_tokens is 6 for equal logits, 1 for a slot that copies one token, shape (groups, slots)")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares the outputs with moe_course.routing.soft
_answers.record("effective_tests", effective_tokens)
### END HIDDEN TESTS

# %% [markdown]
# ## 2. The large-scale limit (3 points)
#
# The scale multiplies the cosines before the softmaxes; Soft MoE learns it. As it grows, every slot's
# dispatch weights pile up on one token: the slot becomes a copy of that token, as in a discrete router.
# `limit_tokens(x, phi)` returns `(groups, slots)`: for every slot, the index of the token it copies in that
# limit (among equal cosines, the lower token index). Cosines use the normalisation of the library, `v /
# sqrt(sum(v**2) + EPS)` for every token and every column of `phi`.

# %% nbgrader={"grade": false, "grade_id": "limit_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def limit_tokens(x, phi):
    ### BEGIN SOLUTION
    x_unit = x / np.sqrt((x**2).sum(axis=-1, keepdims=True) + EPS)
    phi_unit = phi / np.sqrt((phi**2).sum(axis=0, keepdims=True) + EPS)
    return np.argmax(np.einsum("gtd,ds->gst", x_unit, phi_unit), axis=-1)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "limit_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
x, phi = rng.normal(size=(2, 6, 4)), rng.normal(size=(4, 3))
chosen = limit_tokens(x, phi)
assert chosen.shape == (2, 3), f"expected (2, 3), got {chosen.shape}"
assert np.array_equal(limit_tokens(5 * x, phi), chosen), "token norms do not matter, only directions"
aligned = np.stack([np.eye(4)[:3] * 0.1, np.eye(4)[:3] * 7.0])  # token t points along axis t in both groups
assert limit_tokens(aligned, np.eye(4)[:, [2, 0]]).tolist() == [[2, 0], [2, 0]], "slot s copies the token along phi_s"
print("ok: limit_tokens picks, for every slot, the token most aligned with phi_s, whatever the token norms")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares the outputs with moe_course.routing.soft
_answers.record("limit_tests", limit_tokens)
### END HIDDEN TESTS

# %% [markdown]
# ## 3. Predict first (2 points)
#
# Double every token, `x -> 2 * x`, and keep `phi`, the scale and the experts (plain matrices, one slot each).
# By what factor does the output of the Soft MoE layer change? (Think about what the logits, the dispatch and
# combine weights and the slots do.) Write the factor NOW, before task 4: the check after task 4 measures it
# with the layer you fix there.
#
# In the cell below, replace `raise NotImplementedError()` with `PREDICTED_FACTOR = your number`.

# %% nbgrader={"grade": false, "grade_id": "factor_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
### BEGIN SOLUTION
PREDICTED_FACTOR = 2.0
### END SOLUTION

# %% [markdown]
# ## 4. Debug: a port of the layer (3 points)
#
# `soft_moe_layer(x, phi, scale, experts)` below is a Soft MoE layer as a public port of it was written: tokens
# `x` `(groups, tokens, width)`, `phi` `(width, slots)`, the scale (a number) and one linear expert per slot,
# `experts` `(slots, width, width_out)`; it returns `(groups, tokens, width_out)`. It runs, its shapes are right,
# its dispatch weights sum to 1 over the tokens and its combine weights over the slots -- and one line is not
# the paper's layer (Soft MoE Sec. 2.1, Eq. 1-3; google-research/vmoe `vmoe/projects/soft_moe/router.py`,
# `SoftRouter`; chapter 5, section 1 says which kind of mistake public ports made). Run the test below it, find
# the line and fix it in the cell (change as little as you can).

# %% nbgrader={"grade": false, "grade_id": "layer_debug", "locked": false, "schema_version": 3, "solution": true, "task": false}
### BEGIN HANDOUT
def soft_moe_layer(x, phi, scale, experts):
    x_unit = x / np.sqrt((x**2).sum(axis=-1, keepdims=True) + EPS)
    phi_unit = phi / np.sqrt((phi**2).sum(axis=0, keepdims=True) + EPS)
    logits = scale * np.einsum("gtd,ds->gts", x_unit, phi_unit)
    dispatch = softmax(logits, axis=1)  # over the tokens: every slot's weights sum to 1
    combine = softmax(logits, axis=2)  # over the slots: every token's weights sum to 1
    slots = np.einsum("gts,gtd->gsd", dispatch, x_unit)
    outputs = np.einsum("gsd,sdo->gso", slots, experts)  # slot s through expert s
    return np.einsum("gts,gso->gto", combine, outputs)
### END HANDOUT
### BEGIN SOLUTION
def soft_moe_layer(x, phi, scale, experts):
    x_unit = x / np.sqrt((x**2).sum(axis=-1, keepdims=True) + EPS)
    phi_unit = phi / np.sqrt((phi**2).sum(axis=0, keepdims=True) + EPS)
    logits = scale * np.einsum("gtd,ds->gts", x_unit, phi_unit)
    dispatch = softmax(logits, axis=1)  # over the tokens: every slot's weights sum to 1
    combine = softmax(logits, axis=2)  # over the slots: every token's weights sum to 1
    slots = np.einsum("gts,gtd->gsd", dispatch, x)  # the raw tokens: the normalisation is for the logits only
    outputs = np.einsum("gsd,sdo->gso", slots, experts)  # slot s through expert s
    return np.einsum("gts,gso->gto", combine, outputs)
### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "layer_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
experts = rng.normal(size=(3, 4, 2))  # one (width, width_out) matrix per slot
x, phi = rng.normal(size=(2, 6, 4)), rng.normal(size=(4, 3))
assert soft_moe_layer(x, phi, 1.0, experts).shape == (2, 6, 2)
one = 5.0 * rng.normal(size=(1, 1, 4))  # one token, one slot: the slot is the token, the output expert 0's
assert np.allclose(soft_moe_layer(one, phi[:, :1], 1.0, experts[:1]), one @ experts[0]), \
    "one token through one slot must come out as experts[0] applied to that token"
print("ok: soft_moe_layer's shapes, and one token through one slot comes out as the expert applied to it")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares the outputs with moe_course.routing.soft
_answers.record("layer_tests", soft_moe_layer)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "factor_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
assert np.allclose(soft_moe_layer(one, phi[:, :1], 1.0, experts[:1]), one @ experts[0]), \
    "task 4's layer still fails its test: fix it first -- this check measures the factor with your layer"
doubled, once = soft_moe_layer(2 * x, phi, 1.0, experts), soft_moe_layer(x, phi, 1.0, experts)
measured = float(np.linalg.norm(doubled) / np.linalg.norm(once))
assert abs(PREDICTED_FACTOR - measured) < 1e-3, f"you predicted {PREDICTED_FACTOR}, the output changes {measured:.4f}x"
print(f"ok: predicted a factor {PREDICTED_FACTOR}, the layer's output changes by {measured:.4f}")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader measures it with moe_course.routing.soft
_answers.record("factor_tests", lambda: PREDICTED_FACTOR)
### END HIDDEN TESTS

# %% [markdown]
# ## 5. Explain (2 points, graded by your instructor)
#
# The port of task 4 trains without an error, and its authors reported reasonable accuracy. In three to six
# sentences: what do its experts never see, why can neither the dispatch nor the combine weights give it back,
# and in which of this course's images would you expect it to matter? (Think of the digit canvases with
# clutter: which patches are faint, which strong?) Write your answer in the cell below, in place of `YOUR ANSWER
# HERE`.

# %% [markdown] nbgrader={"grade": true, "grade_id": "port_explain", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# The experts see only the tokens' directions, never their norms: every slot averages unit vectors, so a faint
# token and a strong one pointing the same way look alike. The dispatch and combine weights cannot give the norm
# back, because they are computed from cosines too (normalised tokens and columns of `phi`), so the whole routed
# path is invariant to a token's scale -- doubling the input leaves the output unchanged (factor 1, where the
# paper's layer gives 2). Only the residual connection still carries the magnitude. On the course's digit
# canvases, near-empty background patches (small norms) are blown up to the same size as the digit's strokes
# and the clutter, so the slots average them as equals and the experts cannot tell "faint" from "strong".
#
# Rubric (2 points): 1 point for "the experts see unit-norm tokens: the magnitude is lost" together with why the
# weights cannot restore it (they depend on cosines only, so the routed output is scale-invariant; naming the
# factor 1 vs 2 of tasks 3-4 is enough). 1 point for a concrete consequence in the course's data (faint
# background patches weigh as much as strokes or clutter) or for naming the residual as the only path of the
# magnitude. No point for "normalisation makes training unstable" without saying what is lost.
# ### END SOLUTION
