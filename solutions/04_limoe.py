# %% [markdown]
# # Assignment 4: LIMoE's router losses
#
# LIMoE (Mustafa et al. 2022) keeps the router healthy per modality with two entropy losses (Eq. 2, Sec.
# 2.2.2): a local one that makes each token confident about its expert, and a (thresholded) global one that
# makes a modality as a whole spread over several experts; and it adds the router z-loss, which the chapter
# does not write out. You write the three in NumPy and predict one value of the global loss before you write
# it; you fix a modality's mean router distribution that lets padding in, and explain why LIMoE needs the
# entropy losses at all (graded by your instructor). The graded tests compare your answers with
# `moe_course.routing`.
#
# Conventions as in the library: router logits `(groups, tokens, experts)`, a boolean `mask` `(groups,
# tokens)` selecting the tokens of one modality; each loss is computed per group over its selected tokens,
# then averaged over the groups that have any (0 when no group has one). Entropies are in nats, `0 log 0 = 0`.
#
# Check your work with `moe-course check 04_limoe.ipynb` (the visible tests, with the base install).

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
# ## 3. Predict first (2 points)
#
# Before you write the global entropy loss (task 4, read its description first): the 8 text tokens of a group
# all go, each with certainty, to one of only 2 of the 8 experts: 4 tokens to expert 0, 4 to expert 1. What
# is the thresholded global entropy loss with `tau = log 4`? Write the number (to 3 decimals) now; the check
# after the last task computes it with your `global_entropy_loss`.
#
# In the cell below, replace `raise NotImplementedError()` with `PREDICTED_LOSS = your number`.

# %% nbgrader={"grade": false, "grade_id": "global_prediction_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
### BEGIN SOLUTION
PREDICTED_LOSS = 0.693
### END SOLUTION

# %% [markdown]
# ## 4. Global entropy loss (3 points)
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
# ## 5. The router z-loss (2 points)
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
# ## 6. Debug: a modality's mean router distribution (2 points)
#
# The global entropy loss looks at `p~_m`, the mean router distribution of one modality's tokens in a group
# (LIMoE Sec. 2.2.2, below Eq. 2; the library's `marginal_probs`). `modality_marginal(logits, mask)` below is
# meant to compute it: router logits `(groups, tokens, experts)` and the modality's `mask` `(groups, tokens)`
# in (every group has at least one token of the modality), `(groups, experts)` out, each row the mean of the
# softmax over the experts of that group's selected tokens. Its rows do sum to 1, but it holds one bug, a
# failure mode chapter 4 warns about. Run the test below it, find the bug and fix it in the cell.

# %% nbgrader={"grade": false, "grade_id": "padding_debug", "locked": false, "schema_version": 3, "solution": true, "task": false}
### BEGIN HANDOUT
def modality_marginal(logits, mask):
    probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs = probs / probs.sum(axis=-1, keepdims=True)  # (groups, tokens, experts)
    return probs.mean(axis=1)  # the mean over the group's tokens
### END HANDOUT
### BEGIN SOLUTION
def modality_marginal(logits, mask):
    probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs = probs / probs.sum(axis=-1, keepdims=True)  # (groups, tokens, experts)
    return (probs * mask[..., None]).sum(axis=1) / mask.sum(axis=1)[:, None]  # the mean over the selected tokens
### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "marginal_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# A caption of 2 real pieces (one leaning to each expert) padded to 4 with id 0, whose padding all routes alike.
caption = np.log(np.array([[[0.25, 0.75], [0.75, 0.25], [0.9, 0.1], [0.9, 0.1]]]))
real = np.array([[True, True, False, False]])
marginal = modality_marginal(caption, real)
assert marginal.shape == (1, 2), f"expected shape (1, 2), got {marginal.shape}"
assert np.allclose(marginal, [[0.5, 0.5]]), f"the 2 real pieces average to [0.5 0.5], got {marginal.round(3).tolist()}"
print("ok: modality_marginal averages the caption's 2 real pieces only: [0.5 0.5]")
### BEGIN HIDDEN TESTS
import moe_course.course.answers as _answers  # the grader compares the outputs with moe_course.routing.entropy
_answers.record("marginal_tests", modality_marginal)
### END HIDDEN TESTS

# %% [markdown]
# ## 7. Explain: why entropy losses per modality (2 points, graded by the instructor)
#
# A LIMoE already trains with the classic auxiliary losses of V-MoE (importance and load), which keep the
# experts evenly used. In the paper's setting -- far more image tokens than text tokens (196 against 16 for
# B/16) -- why are they not enough for the text, and what do the local and the global entropy loss on the
# text tokens each add? Answer in three to six sentences in the cell below (replace `YOUR ANSWER HERE`).

# %% [markdown] nbgrader={"grade": true, "grade_id": "entropy_explain", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# The classic losses are computed over all tokens of both modalities together (modality-agnostic). With about
# 12 image tokens per text token, the experts look evenly used as long as the images spread over them, even if
# all text tokens go to one expert -- whose buffer then overflows, so most text is dropped (LIMoE Sec. 2.2.1:
# routing "still appears balanced" while text fails). The local entropy loss, per text token, makes each token
# confident about one expert (low entropy of p(experts | x)); the global entropy loss on the text's mean
# distribution makes the text as a whole spread over several experts (high entropy of p~_text, at least the
# threshold tau = log S, a soft minimum of S experts), so text gets experts and slots of its own.
#
# Rubric (2 points): 1 point for why the classic losses miss it -- computed over all tokens, dominated by the
# many image tokens, so text can collapse onto one expert (and be dropped) while the totals look balanced;
# 1 point for the two entropy losses' roles -- local: each token confident (low per-token entropy); global:
# the modality spread over several experts (high entropy of the mean, thresholded). 0 for "they balance the
# load" without the per-modality point.
# ### END SOLUTION

# %% [markdown]
# **The check of your prediction (task 3).** It computes the loss with your `global_entropy_loss`.

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
