# %% [markdown]
# # Assignment 4: LIMoE's entropy losses and the contrastive loss
#
# LIMoE (Mustafa et al. 2022) trains one sparse model on images and texts together with a contrastive loss
# (Eq. 1), and keeps the router healthy per modality with two entropy losses (Eq. 2, Sec. 2.2.2): a local
# one that makes each token confident about its expert, and a (thresholded) global one that makes a
# modality as a whole spread over several experts. You write them in NumPy; the graded tests compare them
# with `moe_course.routing.entropy` and `moe_course.train.contrastive`.
#
# Conventions as in the library: router logits `(groups, tokens, experts)`, a boolean `mask` `(groups,
# tokens)` selecting the tokens of one modality; each loss is computed per group over its selected tokens,
# then averaged over the groups that have any (0 when no group has one). Entropies are in nats, `0 log 0 = 0`.
#
# Run `moe-course course validate 04_limoe.ipynb` before you hand in.

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
### BEGIN HIDDEN TESTS
import moe_course.course.answers as _answers  # the grader compares the outputs with moe_course.routing.entropy
_answers.record("global_tests", global_entropy_loss)
### END HIDDEN TESTS

# %% [markdown]
# ## 4. Contrastive loss (3 points)
#
# For n image-text pairs with L2-normalised embeddings (rows of `image` and `text`, `(n, d)`), the
# similarity logits are `s_jk = <image_j, text_k> * exp(log_temperature)`. The loss (LIMoE Eq. 1, as CLIP)
# is the mean over pairs of half the cross-entropy of picking text j for image j among all texts (softmax
# over a row) plus half that of picking image j for text j among all images (softmax over a column).
# `contrastive_loss(image, text, log_temperature)` -> a float.

# %% nbgrader={"grade": false, "grade_id": "contrastive_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def contrastive_loss(image, text, log_temperature):
    ### BEGIN SOLUTION
    logits = image @ text.T * np.exp(log_temperature)
    rows = logits - logits.max(axis=1, keepdims=True)
    cols = logits - logits.max(axis=0, keepdims=True)
    log_rows = rows - np.log(np.exp(rows).sum(axis=1, keepdims=True))
    log_cols = cols - np.log(np.exp(cols).sum(axis=0, keepdims=True))
    pairs = np.arange(len(logits))
    return float(-0.5 * log_rows[pairs, pairs].mean() - 0.5 * log_cols[pairs, pairs].mean())
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "contrastive_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
unit = np.eye(3)
assert contrastive_loss(unit, unit, np.log(100.0)) < 1e-6, "matching pairs far apart from the rest: ~0"
assert np.isclose(contrastive_loss(unit, np.ones((3, 3)) / np.sqrt(3), 0.0), np.log(3)), "no preference: log n"
### BEGIN HIDDEN TESTS
import moe_course.course.answers as _answers  # the grader compares the outputs with moe_course.train.contrastive
_answers.record("contrastive_tests", contrastive_loss)
### END HIDDEN TESTS
