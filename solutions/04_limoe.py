# %% [markdown]
# # Assignment 4: LIMoE's router losses, in JAX
#
# LIMoE (Mustafa et al. 2022) keeps the router healthy per modality with two entropy losses (Eq. 2, Sec.
# 2.2.2): a local one that makes each token confident about its expert, and a (thresholded) global one that
# makes a modality as a whole spread over several experts; and it adds the router z-loss, which the chapter
# does not write out. You write the three in `jax.numpy`, then put them together into the auxiliary loss of
# a LIMoE MoE layer -- computed from the router of the library's `MultimodalMoE` with its own parameters --
# which must equal the layer's `aux_loss`. On the way you predict a global loss before you write it, fix a
# modality's mean router distribution that lets padding in, and explain why LIMoE needs the entropy losses
# at all (graded by your instructor). The visible tests compare with `moe_course` where it is installed;
# further tests run when your notebook is graded (there the library is absent: write the JAX yourself).
#
# Conventions as in the library: router logits `(groups, tokens, experts)`, a boolean `mask` `(groups,
# tokens)` selecting the tokens of one modality; each loss is computed per group over its selected tokens,
# then averaged over the groups that have any (0 when no group has one). Entropies are in nats, `0 log 0 = 0`.
#
# Work in your own copy: `moe-course exercise 04` puts it in `mywork/04_limoe.ipynb`. Check it with
# `moe-course check mywork/04_limoe.ipynb` (the visible tests, with the base install; from the repository's
# root or any folder in it).
#
# **The given code.** `router_logits(params, x, group_size)` is the router of a LIMoE MoE layer: the tokens
# `x` `(batch, tokens, D)` of `group_size` consecutive examples form one routing group, `(groups, group_size *
# tokens, D)`, and their logits are `tokens @ params["router"]["kernel"]` (`(D, experts)`, no bias); the
# router distribution of a token is their softmax over the experts. `library_moe` makes the library's
# `MultimodalMoE` of a small config with every parameter drawn at random, and its parameter tree
# `nnx.to_pure_dict(nnx.state(layer, nnx.Param))` (`params["router"]["kernel"]` and the experts'). `freeze`
# keeps your prediction as first written.

# %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
import functools

import jax
import jax.numpy as jnp
import numpy as np

from moe_course.course.inside.notebook import predictions

freeze = predictions("04_limoe.predictions.json")  # freeze(name, value): the first answer counts

rng = np.random.default_rng(0)
try:  # the course library: on your machine the visible tests compare with it; grading compares outside
    from flax import nnx

    from moe_course.layers.multimodal_moe import MultimodalMoE
    from moe_course.routing import global_entropy_loss as library_global_loss, local_entropy_loss as library_local_loss
    LIBRARY = True
except ImportError:
    LIBRARY = False
# The small LIMoE layer: its aux loss is weight x the mean of 4 terms -- the z-loss over all real tokens, the
# global entropy of the images (threshold TAUS["image"]), the local and global entropy of the text.
LOSSES = {"image": ("global_entropy",), "text": ("local_entropy", "global_entropy")}
TAUS = {"image": float(np.log(3.5)), "text": float(np.log(3.8))}
SMALL = dict(width=8, hidden=16, num_experts=4, k=1, capacity_ratio=1.0, group_size=2, aux_loss_weight=0.04)


def router_logits(params, x, group_size):
    """(groups, group_size * tokens, experts): the router logits of tokens x (batch, tokens, D)."""
    batch, tokens, width = x.shape
    return jnp.reshape(x, (batch // group_size, group_size * tokens, width)) @ params["router"]["kernel"]


@functools.cache
def library_moe(seed=0):
    """(the library's MultimodalMoE of SMALL, LOSSES and TAUS with every parameter redrawn at random; its
    parameter tree as a plain dict of arrays)."""
    layer = MultimodalMoE(SMALL["width"], SMALL["hidden"], SMALL["num_experts"], losses=LOSSES, taus=TAUS,
                          joint=("z_loss",), **{k: v for k, v in SMALL.items() if k not in ("width", "hidden",
                                                                                         "num_experts")},
                          rngs=nnx.Rngs(seed))
    draw = np.random.default_rng(seed)
    for _, param in nnx.iter_graph(layer):
        if isinstance(param, nnx.Param):
            param[...] = jnp.asarray(draw.normal(size=param.shape), param[...].dtype)
    return layer, nnx.to_pure_dict(nnx.state(layer, nnx.Param))


# %% [markdown]
# ## 1. Entropy (1 point)
#
# `entropy(probs)`: `H(p) = -sum_e p_e log p_e` over the last axis, in nats, with `0 log 0 = 0` (no NaN for
# a one-hot distribution). `(..., experts)` -> `(...)`. Use `jax.numpy`.

# %% nbgrader={"grade": false, "grade_id": "entropy_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def entropy(probs):
    ### BEGIN SOLUTION
    return -jnp.sum(probs * jnp.log(jnp.where(probs > 0, probs, 1.0)), axis=-1)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "entropy_tests", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
assert np.isclose(entropy(jnp.full(4, 0.25)), np.log(4)), "uniform over 4 experts: log 4"
assert entropy(jnp.array([1.0, 0.0, 0.0])) == 0.0, "one-hot: 0, and no NaN"
print("ok: entropy is log 4 for a uniform distribution over 4 experts and 0 for a one-hot one")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares the outputs with moe_course.routing.entropy
_answers.record("entropy_tests", entropy)
### END HIDDEN TESTS

# %% [markdown]
# ## 2. Local entropy loss (2 points)
#
# `local_entropy_loss(logits, mask)`: for every group, the mean over its selected tokens of the entropy of
# the token's router distribution `softmax(logits)`; then the mean over the groups that have selected
# tokens (0 when none has). Small when every token is sure which expert it wants. Returns a scalar.

# %% nbgrader={"grade": false, "grade_id": "local_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def local_entropy_loss(logits, mask):
    ### BEGIN SOLUTION
    h = entropy(jax.nn.softmax(logits, axis=-1))
    counts = jnp.sum(mask, axis=1)
    per_group = jnp.sum(h * mask, axis=1) / jnp.maximum(counts, 1)
    return jnp.sum(jnp.where(counts > 0, per_group, 0.0)) / jnp.maximum(jnp.sum(counts > 0), 1)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "local_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
everything = jnp.ones((2, 3), bool)
assert np.isclose(local_entropy_loss(jnp.zeros((2, 3, 4)), everything), np.log(4)), "uniform routers: log E"
assert local_entropy_loss(jnp.array([[[50.0, 0.0]] * 3] * 2), everything) < 1e-6, "confident routers: ~0"
if LIBRARY:
    logits, mask = jnp.asarray(2 * rng.normal(size=(3, 6, 4)), jnp.float32), jnp.asarray(rng.random((3, 6)) < 0.5)
    mask = mask.at[1].set(False).at[0, 0].set(True)  # a group without the modality, unequal counts in the others
    assert np.isclose(local_entropy_loss(logits, mask), library_local_loss(logits, mask), atol=1e-5), (
        "your loss differs from the library's on a mask with an empty group: per group first, then over groups?")
print("ok: local_entropy_loss is log E for uniform routers and ~0 for confident ones")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares the outputs with moe_course.routing.entropy
_answers.record("local_tests", local_entropy_loss)
### END HIDDEN TESTS

# %% [markdown]
# ## 3. Predict first (2 points)
#
# Before you write the global entropy loss (task 4; read its description first) and without running
# anything: two routing groups hold 8 text tokens each. In the first, 6 tokens go with certainty to expert
# 0 and 2 with certainty to expert 1; in the second, every token's router is uniform over all 8 experts.
# What is the text's thresholded global entropy loss with `tau = log 4`? Write the number (to 3 decimals).
#
# In the cell below, replace `raise NotImplementedError()` with `PREDICTED_LOSS = your number`. The cell
# under it records your first answer in `04_limoe.predictions.json` beside this notebook; the check after
# task 4 reports a changed one (the first answer counts).

# %% nbgrader={"grade": false, "grade_id": "global_prediction_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
### BEGIN SOLUTION
PREDICTED_LOSS = 0.412
### END SOLUTION

# %% nbgrader={"grade": false, "grade_id": "global_prediction_record", "locked": true, "schema_version": 3, "solution": false, "task": false}
print(freeze("PREDICTED_LOSS", globals().get("PREDICTED_LOSS")))

# %% [markdown]
# ## 4. Global entropy loss (3 points)
#
# For every group, the modality's marginal distribution `p~` is the mean of `softmax(logits)` over its
# selected tokens. Without a threshold (`tau=None`) the loss is `-H(p~)`; with a threshold `tau` it is
# `max(0, tau - H(p~))`, which stops pushing once the marginal entropy reaches `tau` (with `tau = log S` the
# modality must use at least about S experts; any `tau <= 0` turns the loss off, as an entropy is never
# negative). Mean over the groups that have selected tokens (0 when none has). Returns a scalar.

# %% nbgrader={"grade": false, "grade_id": "global_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def global_entropy_loss(logits, mask, tau=None):
    ### BEGIN SOLUTION
    probs = jax.nn.softmax(logits, axis=-1)
    counts = jnp.sum(mask, axis=1)
    marginal = jnp.sum(probs * mask[..., None], axis=1) / jnp.maximum(counts, 1)[:, None]
    h = entropy(marginal)
    per_group = -h if tau is None else jnp.maximum(0.0, tau - h)
    return jnp.sum(jnp.where(counts > 0, per_group, 0.0)) / jnp.maximum(jnp.sum(counts > 0), 1)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "global_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
one_expert = jnp.array([[[50.0, 0.0, 0.0, 0.0]] * 3])
assert np.isclose(global_entropy_loss(jnp.zeros((1, 3, 4)), jnp.ones((1, 3), bool)), -np.log(4)), "uniform: -log E"
assert np.isclose(global_entropy_loss(one_expert, jnp.ones((1, 3), bool), tau=np.log(2)), np.log(2), atol=1e-6)
assert global_entropy_loss(jnp.zeros((1, 3, 4)), jnp.ones((1, 3), bool), tau=np.log(2)) == 0.0, "above tau: 0"
print("ok: global_entropy_loss without a threshold, above it and below it")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares the outputs with moe_course.routing.entropy
_answers.record("global_tests", global_entropy_loss)
### END HIDDEN TESTS

# %% [markdown]
# **The check of your prediction (task 3).** It computes the loss with the library's `global_entropy_loss`
# where it is installed; your answer was recorded before you wrote task 4.

# %% nbgrader={"grade": true, "grade_id": "global_prediction_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
print(freeze("PREDICTED_LOSS", PREDICTED_LOSS))
if LIBRARY:
    two_groups = np.zeros((2, 8, 8), np.float32)
    two_groups[0, :6, 0] = two_groups[0, 6:, 1] = 50.0
    library_loss = library_global_loss(jnp.asarray(two_groups), jnp.ones((2, 8), bool), tau=np.log(4))
    assert abs(PREDICTED_LOSS - library_loss) < 1e-3, (
        "not the library's loss: a marginal per group, its entropy against tau, then the mean over the groups")
    print("ok: your prediction is the library's thresholded global loss of the two groups")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader computes it with moe_course.routing.entropy
_answers.record("global_prediction_tests", lambda: float(PREDICTED_LOSS))
### END HIDDEN TESTS

# %% [markdown]
# ## 5. The router z-loss (2 points)
#
# LIMoE can train with one more router loss that the chapter does not write out, the z-loss of ST-MoE (Zoph
# et al. 2022, [arXiv:2202.08906](https://arxiv.org/abs/2202.08906); LIMoE App. B.1): for every token, the
# square of `logsumexp` of its router logits over the experts; per group the mean over the selected tokens;
# then the mean over the groups that have any (0 when none has). It keeps the logits small, which keeps the
# router's softmax numerically safe. `router_z_loss(logits, mask)` -> a scalar. Compute `logsumexp` so that
# large logits do not overflow (subtract each token's largest logit first and add it back).

# %% nbgrader={"grade": false, "grade_id": "z_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def router_z_loss(logits, mask):
    ### BEGIN SOLUTION
    top = jnp.max(logits, axis=-1)
    z = (top + jnp.log(jnp.sum(jnp.exp(logits - top[..., None]), axis=-1))) ** 2
    counts = jnp.sum(mask, axis=1)
    per_group = jnp.sum(z * mask, axis=1) / jnp.maximum(counts, 1)
    return jnp.sum(jnp.where(counts > 0, per_group, 0.0)) / jnp.maximum(jnp.sum(counts > 0), 1)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "z_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
assert np.isclose(router_z_loss(jnp.zeros((2, 3, 4)), jnp.ones((2, 3), bool)), np.log(4) ** 2), "zero logits: (log E)^2"
huge = jnp.array([[[1000.0, 0.0], [0.0, 0.0]]])
assert np.isclose(router_z_loss(huge, jnp.array([[True, False]])), 1000.0**2), "no overflow; only selected tokens count"
assert router_z_loss(huge, jnp.zeros((1, 2), bool)) == 0.0, "no selected token: 0"
print("ok: router_z_loss on zero logits, on a huge logit with a mask, and with nothing selected")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares the outputs with moe_course.routing.losses
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
    probs = jax.nn.softmax(logits, axis=-1)  # (groups, tokens, experts)
    return jnp.mean(probs, axis=1)  # the mean over the group's tokens
### END HANDOUT
### BEGIN SOLUTION
def modality_marginal(logits, mask):
    probs = jax.nn.softmax(logits, axis=-1)  # (groups, tokens, experts)
    return jnp.sum(probs * mask[..., None], axis=1) / jnp.sum(mask, axis=1)[:, None]  # the selected tokens' mean
### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "marginal_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# A caption of 2 real pieces (one leaning to each expert) padded to 4 with id 0, whose padding all routes alike.
caption = jnp.log(jnp.array([[[0.25, 0.75], [0.75, 0.25], [0.9, 0.1], [0.9, 0.1]]]))
real = jnp.array([[True, True, False, False]])
marginal = modality_marginal(caption, real)
assert marginal.shape == (1, 2), f"expected shape (1, 2), got {marginal.shape}"
assert np.allclose(marginal.sum(-1), 1), "every row sums to 1"
assert np.allclose(marginal[0, 0], marginal[0, 1]), "one real piece leans to each expert: the row must be even"
print("ok: modality_marginal averages the caption's 2 real pieces only")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares the outputs with moe_course.routing.entropy
_answers.record("marginal_tests", modality_marginal)
### END HIDDEN TESTS

# %% [markdown]
# ## 7. The aux loss of a LIMoE MoE layer (3 points)
#
# `limoe_aux_loss(params, x, modality, group_size, taus, weight)` is the auxiliary loss of a LIMoE MoE layer
# (the library's `MultimodalMoE` with the losses of `LOSSES` and a joint z-loss, App. B.1), computed from the
# layer's router alone. `params` is the layer's parameter tree (only `params["router"]["kernel"]` is needed),
# `x` its input tokens `(batch, tokens, D)`, `modality` `(batch, tokens)` int: 0 image, 1 text, -1 padding,
# `taus` `{"image": tau, "text": tau}`. Take the logits from the given `router_logits` and bring `modality`
# into the same routing groups; then four terms, each one of your functions on the logits:
# the z-loss over all real tokens (padding not counted), the thresholded global entropy loss of the image
# tokens, and the local and the thresholded global entropy loss of the text tokens. The aux loss is `weight`
# times the MEAN of the four terms (the paper's "final aggregated auxiliary loss"). Returns a scalar; it
# must equal the layer's `aux_loss` for any parameters.

# %% nbgrader={"grade": false, "grade_id": "aux_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def limoe_aux_loss(params, x, modality, group_size, taus, weight):
    ### BEGIN SOLUTION
    logits = router_logits(params, x, group_size)
    modality = jnp.reshape(modality, logits.shape[:2])
    terms = [router_z_loss(logits, modality >= 0), global_entropy_loss(logits, modality == 0, tau=taus["image"]),
             local_entropy_loss(logits, modality == 1), global_entropy_loss(logits, modality == 1, tau=taus["text"])]
    return weight * jnp.mean(jnp.stack(terms))
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "aux_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
if LIBRARY:
    layer, params = library_moe()
    x = jnp.asarray(rng.normal(size=(4, 6, SMALL["width"])), jnp.float32)
    modality = jnp.array([[0, 0, 0, 1, 1, -1], [0, 0, 0, 1, -1, -1]] * 2)  # 3 patches, a caption, its padding
    theirs = layer(x, modality=modality, token_mask=modality >= 0).aux_loss
    mine = limoe_aux_loss(params, x, modality, SMALL["group_size"], TAUS, SMALL["aux_loss_weight"])
    assert np.shape(mine) == (), f"the aux loss is a scalar, got shape {np.shape(mine)}"
    assert np.isclose(mine, theirs, rtol=1e-4, atol=1e-7), "your aux loss differs from the layer's aux_loss"
    print("ok: limoe_aux_loss equals the library's MultimodalMoE aux_loss, padding left out")
else:
    print("the library is not installed here: grading compares limoe_aux_loss with it")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares with moe_course.layers.multimodal_moe
_answers.record("aux_tests", limoe_aux_loss)
### END HIDDEN TESTS

# %% [markdown]
# ## 8. Explain: why entropy losses per modality (2 points, graded by the instructor)
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
