# %% [markdown]
# # Assignment 4: LIMoE's router losses
#
# LIMoE (Mustafa et al. 2022) keeps the router healthy per modality with two entropy losses (Eq. 2, Sec.
# 2.2.2): a local one that makes each token confident about its expert, and a (thresholded) global one that
# makes a modality as a whole spread over several experts; and it adds the router z-loss, which the chapter
# does not write out. You write the three in NumPy and predict one value of the global loss; the graded
# tests compare them with `moe_course.routing`.
#
# Conventions as in the library: router logits `(groups, tokens, experts)`, a boolean `mask` `(groups,
# tokens)` selecting the tokens of one modality; each loss is computed per group over its selected tokens,
# then averaged over the groups that have any (0 when no group has one). Entropies are in nats, `0 log 0 = 0`.
#
# Work in your own copy: `moe-course exercise 04` puts it in `mywork/04_limoe.ipynb`. Check it with
# `moe-course check mywork/04_limoe.ipynb` (the visible tests, with the base install; from the repository's
# root or any folder in it).

# %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
import numpy as np

rng = np.random.default_rng(0)


def softmax(z, axis=-1):
    z = z - z.max(axis=axis, keepdims=True)
    return np.exp(z) / np.exp(z).sum(axis=axis, keepdims=True)


# %% [markdown]
# ## 1. Entropy (1 point)
#
# `entropy(probs)`: `H(p) = -sum_e p_e log p_e` over the last axis, in nats, with `0 log 0 = 0` (no NaN for
# a one-hot distribution). `(..., experts)` -> `(...)`.

# %% nbgrader={"grade": false, "grade_id": "entropy_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def entropy(probs):
    ### BEGIN SOLUTION
    safe = np.where(probs > 0, probs, 1.0)
    return -np.sum(probs * np.log(safe), axis=-1)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "entropy_tests", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
assert np.isclose(entropy(np.full(4, 0.25)), np.log(4)), "uniform over 4 experts: log 4"
assert entropy(np.array([1.0, 0.0, 0.0])) == 0.0, "one-hot: 0, and no NaN"
print("ok: entropy is log 4 for a uniform distribution over 4 experts and 0 for a one-hot one")
### BEGIN HIDDEN TESTS
import moe_course.course.answers as _answers  # the grader compares the outputs with moe_course.routing.entropy
_answers.record("entropy_tests", entropy)
### END HIDDEN TESTS

# %% [markdown]
# ## 2. Local entropy loss (2 points)
#
# `local_entropy_loss(logits, mask)`: for every group, the mean over its selected tokens of the entropy of
# the token's router distribution `softmax(logits)`; then the mean over the groups that have selected
# tokens. Small when every token is sure which expert it wants.

# %% nbgrader={"grade": false, "grade_id": "local_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def local_entropy_loss(logits, mask):
    ### BEGIN SOLUTION
    h = entropy(softmax(logits))
    counts = mask.sum(axis=1)
    present = counts > 0
    if not present.any():
        return 0.0
    per_group = (h * mask).sum(axis=1) / np.maximum(counts, 1)
    return float(per_group[present].mean())
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "local_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
everything = np.ones((2, 3), bool)
assert np.isclose(local_entropy_loss(np.zeros((2, 3, 4)), everything), np.log(4)), "uniform routers: log E"
assert local_entropy_loss(np.array([[[50.0, 0.0]] * 3] * 2), everything) < 1e-6, "confident routers: ~0"
print("ok: local_entropy_loss is log E for uniform routers and ~0 for confident ones")
### BEGIN HIDDEN TESTS
import moe_course.course.answers as _answers  # the grader compares the outputs with moe_course.routing.entropy
_answers.record("local_tests", local_entropy_loss)
### END HIDDEN TESTS

# %% [markdown]
# ## 3. Global entropy loss (3 points)
#
# For every group, the modality's marginal distribution `p~` is the mean of `softmax(logits)` over its
# selected tokens. Without a threshold (`tau=None`) the loss is `-H(p~)`; with a threshold `tau` it is
# `max(0, tau - H(p~))`, which stops pushing once the marginal entropy reaches `tau` (with `tau = log S` the
# modality must use at least about S experts; any `tau <= 0` turns the loss off, as an entropy is never
# negative). Mean over the groups that have selected tokens.

# %% nbgrader={"grade": false, "grade_id": "global_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def global_entropy_loss(logits, mask, tau=None):
    ### BEGIN SOLUTION
    probs = softmax(logits)
    counts = mask.sum(axis=1)
    present = counts > 0
    if not present.any():
        return 0.0
    marginal = (probs * mask[..., None]).sum(axis=1) / np.maximum(counts, 1)[:, None]
    h = entropy(marginal)
    per_group = -h if tau is None else np.maximum(0.0, tau - h)
    return float(per_group[present].mean())
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "global_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
one_expert = np.array([[[50.0, 0.0, 0.0, 0.0]] * 3])
assert np.isclose(global_entropy_loss(np.zeros((1, 3, 4)), np.ones((1, 3), bool)), -np.log(4))
assert np.isclose(global_entropy_loss(one_expert, np.ones((1, 3), bool), tau=np.log(2)), np.log(2), atol=1e-6)
assert global_entropy_loss(np.zeros((1, 3, 4)), np.ones((1, 3), bool), tau=np.log(2)) == 0.0
print("ok: global_entropy_loss without a threshold, above it and below it")
### BEGIN HIDDEN TESTS
import moe_course.course.answers as _answers  # the grader compares the outputs with moe_course.routing.entropy
_answers.record("global_tests", global_entropy_loss)
### END HIDDEN TESTS

# %% [markdown]
# ## 4. The router z-loss (2 points)
#
# LIMoE trains with one more router loss that the chapter does not write out, the z-loss of ST-MoE (Zoph et
# al. 2022, [arXiv:2202.08906](https://arxiv.org/abs/2202.08906); LIMoE App. B.1): for every token, the
# square of `logsumexp` of its router logits over the experts; per group the mean over the selected tokens;
# then the mean over the groups that have any (0 when none has). It keeps the logits small, which keeps the
# router's softmax numerically safe. `router_z_loss(logits, mask)` -> a float. Compute `logsumexp` so that
# large logits do not overflow (subtract each token's largest logit first and add it back).

# %% nbgrader={"grade": false, "grade_id": "z_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def router_z_loss(logits, mask):
    ### BEGIN SOLUTION
    top = logits.max(axis=-1)
    z = (top + np.log(np.exp(logits - top[..., None]).sum(axis=-1))) ** 2
    counts = mask.sum(axis=1)
    if not (counts > 0).any():
        return 0.0
    per_group = (z * mask).sum(axis=1) / np.maximum(counts, 1)
    return float(per_group[counts > 0].mean())
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "z_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
assert np.isclose(router_z_loss(np.zeros((2, 3, 4)), np.ones((2, 3), bool)), np.log(4) ** 2), "zero logits: (log E)^2"
huge = np.array([[[1000.0, 0.0], [0.0, 0.0]]])
assert np.isclose(router_z_loss(huge, np.array([[True, False]])), 1000.0**2), "no overflow; only selected tokens count"
assert router_z_loss(huge, np.zeros((1, 2), bool)) == 0.0, "no selected token: 0"
print("ok: router_z_loss on zero logits, on a huge logit with a mask, and with nothing selected")
### BEGIN HIDDEN TESTS
import moe_course.course.answers as _answers  # the grader compares the outputs with moe_course.routing.losses
_answers.record("z_tests", router_z_loss)
### END HIDDEN TESTS

# %% [markdown]
# ## 5. Predict, then run (2 points)
#
# The 8 text tokens of a group all go, each with certainty, to one of only 2 of the 8 experts: 4 tokens to
# expert 0, 4 to expert 1. What is the thresholded global entropy loss with `tau = log 4`? Write the number
# (to 3 decimals) BEFORE you run the check, which computes it with your `global_entropy_loss`.
#
# In the cell below, replace `raise NotImplementedError()` with `PREDICTED_LOSS = your number`.

# %% nbgrader={"grade": false, "grade_id": "global_prediction_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
### BEGIN SOLUTION
PREDICTED_LOSS = 0.693
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "global_prediction_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
two_experts = np.zeros((1, 8, 8))
two_experts[0, :4, 0] = two_experts[0, 4:, 1] = 50.0
computed = global_entropy_loss(two_experts, np.ones((1, 8), bool), tau=np.log(4))
assert abs(PREDICTED_LOSS - computed) < 1e-3, f"you predicted {PREDICTED_LOSS}, your loss gives {computed:.4f}"
print(f"ok: predicted {PREDICTED_LOSS}, global_entropy_loss computes {computed:.4f}")
### BEGIN HIDDEN TESTS
import moe_course.course.answers as _answers  # the grader computes it with moe_course.routing.entropy
_answers.record("global_prediction_tests", lambda: PREDICTED_LOSS)
### END HIDDEN TESTS
