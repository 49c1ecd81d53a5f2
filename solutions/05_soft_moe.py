# %% [markdown]
# # Assignment 5: Soft MoE dispatch and combine
#
# Soft MoE (Puigcerver et al., Sec. 2) replaces the discrete router by two softmaxes of one logit matrix:
# every slot is a weighted average of all tokens (dispatch), every output token a weighted average of all
# slot outputs (combine). You write the logits, both weight matrices and the whole layer in NumPy for
# tokens `x` of shape `(groups, tokens, width)` and per-slot parameters `phi` of shape `(width, slots)`; the
# graded tests compare them with `moe_course.routing.soft`.
#
# Run `moe-course course validate 05_soft_moe.ipynb` before you hand in.

# %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
import numpy as np

rng = np.random.default_rng(0)
EPS = 1e-6  # added to the squared norm before the square root, as the library does


def softmax(z, axis):
    z = z - z.max(axis=axis, keepdims=True)
    return np.exp(z) / np.exp(z).sum(axis=axis, keepdims=True)


# %% [markdown]
# ## 1. Router logits (2 points)
#
# The logits are `scale * cos(x_t, phi_j)`: every token is divided by its L2 norm over the width, every
# column of `phi` by its own, each as `v / sqrt(sum(v**2) + EPS)`, and the product is multiplied by `scale`.
# `soft_logits(x, phi, scale)` returns `(groups, tokens, slots)`.

# %% nbgrader={"grade": false, "grade_id": "logits_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def soft_logits(x, phi, scale=1.0):
    ### BEGIN SOLUTION
    x_unit = x / np.sqrt((x**2).sum(axis=-1, keepdims=True) + EPS)
    phi_unit = phi / np.sqrt((phi**2).sum(axis=0, keepdims=True) + EPS)
    return scale * np.einsum("gtd,ds->gts", x_unit, phi_unit)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "logits_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
x, phi = rng.normal(size=(2, 6, 4)), rng.normal(size=(4, 3))
logits = soft_logits(x, phi)
assert logits.shape == (2, 6, 3), f"expected (2, 6, 3), got {logits.shape}"
assert np.all(np.abs(logits) <= 1.0 + 1e-9), "cosines lie in [-1, 1]"
assert np.allclose(soft_logits(3 * x, phi, 2.0), 2 * logits), "scale multiplies; token norms do not matter"
### BEGIN HIDDEN TESTS
import moe_course.course.answers as _answers  # the grader compares the outputs with moe_course.routing.soft
_answers.record("logits_tests", soft_logits)
### END HIDDEN TESTS

# %% [markdown]
# ## 2. Dispatch and combine weights (3 points)
#
# Dispatch weights `D`: the softmax of the logits over the TOKENS, for every slot (Eq. 1). Combine weights
# `C`: the softmax over all SLOTS, for every token (Eq. 3). Both `(groups, tokens, slots)`.

# %% nbgrader={"grade": false, "grade_id": "weights_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def dispatch_weights(logits):
    ### BEGIN SOLUTION
    return softmax(logits, axis=1)
    ### END SOLUTION


def combine_weights(logits):
    ### BEGIN SOLUTION
    return softmax(logits, axis=2)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "weights_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
assert np.allclose(dispatch_weights(logits).sum(axis=1), 1.0), "each slot averages the tokens"
assert np.allclose(combine_weights(logits).sum(axis=2), 1.0), "each token averages the slots"
### BEGIN HIDDEN TESTS
import moe_course.course.answers as _answers  # the grader compares the outputs with moe_course.routing.soft
_answers.record("weights_tests", (dispatch_weights, combine_weights))
### END HIDDEN TESTS

# %% [markdown]
# ## 3. The whole layer (4 points)
#
# `soft_moe(x, phi, expert_weights, scale)`: slots `X~ = D^T X` per group (the RAW tokens, not the
# normalised ones), expert i applies its matrix `expert_weights[i]` (shape `(width, width_out)`) to its
# `slots_per_expert = slots / experts` consecutive slots (slot j belongs to expert `j // slots_per_expert`),
# and the output is `Y = C Y~`, shape `(groups, tokens, width_out)`.

# %% nbgrader={"grade": false, "grade_id": "layer_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def soft_moe(x, phi, expert_weights, scale=1.0):
    ### BEGIN SOLUTION
    logits = soft_logits(x, phi, scale)
    slots = np.einsum("gts,gtd->gsd", dispatch_weights(logits), x)
    num_experts = expert_weights.shape[0]
    per_expert = slots.shape[1] // num_experts
    owner = np.arange(slots.shape[1]) // per_expert
    outputs = np.einsum("gsd,sdo->gso", slots, expert_weights[owner])
    return np.einsum("gts,gso->gto", combine_weights(logits), outputs)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "layer_tests", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
weights = rng.normal(size=(3, 4, 2))
y = soft_moe(x, phi, weights)
assert y.shape == (2, 6, 2), f"expected (2, 6, 2), got {y.shape}"
mixed = soft_moe(x, phi, np.stack([np.eye(4)] * 3))  # identity experts: averages of averages of tokens
assert np.all(mixed <= x.max(axis=1, keepdims=True) + 1e-9), "with identity experts no output leaves the tokens' range"
assert np.all(mixed >= x.min(axis=1, keepdims=True) - 1e-9), "with identity experts no output leaves the tokens' range"
### BEGIN HIDDEN TESTS
import moe_course.course.answers as _answers  # the grader compares the outputs with moe_course.routing.soft
_answers.record("layer_tests", soft_moe)
### END HIDDEN TESTS
