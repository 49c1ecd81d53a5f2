# %% [markdown]
# # Assignment 5: what Soft MoE's slots see
#
# Soft MoE (Puigcerver et al., Sec. 2) replaces the discrete router by two softmaxes of one logit matrix
# `scale * cos(x_t, phi_s)`: every slot is a weighted average of all tokens (dispatch, the softmax over the
# tokens), every output token a weighted average of all slot outputs (combine, the softmax over the slots).
# Chapter 5 wrote the layer out for one small group. Here you measure what the slots see, for tokens `x` of
# shape `(groups, tokens, width)` and per-slot parameters `phi` of shape `(width, slots)`: how many tokens a
# slot really averages, and which token a slot copies when the scale grows large; then you predict how the
# layer responds when the tokens are scaled. The graded tests compare with `moe_course.routing.soft`.
#
# Check your work with `moe-course check 05_soft_moe.ipynb` (the visible tests, with the base install).

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
# ## 3. Predict, then run (2 points)
#
# Double every token, `x -> 2 * x`, and keep `phi` and the experts (plain matrices, one slot each). By what
# factor does the output of the Soft MoE layer change? (Think about what the logits, the dispatch and combine
# weights and the slots do.) Write the factor BEFORE you run the check, which measures it with the layer as
# chapter 5 writes it.
#
# In the cell below, replace `raise NotImplementedError()` with `PREDICTED_FACTOR = your number`.

# %% nbgrader={"grade": false, "grade_id": "factor_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
### BEGIN SOLUTION
PREDICTED_FACTOR = 2.0
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "factor_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
experts = rng.normal(size=(3, 4, 2))  # one (width, width_out) matrix per slot


def soft_layer(tokens):  # chapter 5's Soft MoE for one group (tokens, width), slot s -> expert s
    unit_tokens = tokens / np.linalg.norm(tokens, axis=1, keepdims=True)
    logits = unit_tokens @ (phi / np.linalg.norm(phi, axis=0, keepdims=True))
    slots = softmax(logits, axis=0).T @ tokens
    return softmax(logits, axis=1) @ np.einsum("sd,sdo->so", slots, experts)


measured = float(np.linalg.norm(soft_layer(2 * x[0])) / np.linalg.norm(soft_layer(x[0])))
assert abs(PREDICTED_FACTOR - measured) < 1e-3, f"you predicted {PREDICTED_FACTOR}, the output changes {measured:.4f}x"
print(f"ok: predicted a factor {PREDICTED_FACTOR}, the layer's output changes by {measured:.4f}")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader measures it with moe_course.routing.soft
_answers.record("factor_tests", lambda: PREDICTED_FACTOR)
### END HIDDEN TESTS
