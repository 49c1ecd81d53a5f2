# %% [markdown]
# # Assignment 5: your Soft MoE layer, in JAX
#
# Soft MoE (Puigcerver et al., Sec. 2, Eq. 1-3) replaces the discrete router by two softmaxes of one logit
# matrix `scale * cos(x_t, phi_s)`: every slot is a weighted average of all tokens (dispatch, the softmax over
# the tokens), every output token a weighted average of all slot outputs (combine, the softmax over the slots).
# Here you write the layer yourself in `jax.numpy`, one piece per task, on the library's own parameters -- the
# tree of a `moe_course.layers.SoftMoE` -- and put it into an encoder block in place of the MLP: your functions
# must give the same numbers as the library's `SoftMoE` and `EncoderBlock(..., mlp=SoftMoE(...))`. On the way
# you predict a count the notebook works out only after you wrote it down, fix a port that feeds the experts
# what the paper does not, and explain what that mistake costs. Replace every `raise NotImplementedError()`
# with your code; the visible tests compare with the library on your machine, and further tests are run when
# your notebook is graded (there the library is absent). 20 points: 18 graded automatically, 2 (task 8) by
# your instructor.
#
# Work in your own copy: `moe-course exercise 05` puts it in `mywork/05_soft_moe.ipynb`. Check it with
# `moe-course check mywork/05_soft_moe.ipynb` (the visible tests, with the base install; from the repository's
# root or any folder in it).
#
# **The parameter tree.** `nnx.to_pure_dict(nnx.state(layer, nnx.Param))` of a `SoftMoE(width=D, hidden=H,
# num_experts=E, slots_per_expert=p)`, with S = E * p slots (slot s belongs to expert s // p):
#
# ```
# params["phi"]                     (D, S)     one column per slot
# params["scale"]                   ()         the learned scale of the logits
# params["experts"]["fc1_kernel"]   (E, D, H),  ["fc1_bias"] (E, H)
# params["experts"]["fc2_kernel"]   (E, H, D),  ["fc2_bias"] (E, D)
# ```
#
# Tokens `x` are `(batch, tokens, D)`: every image is its own group (its slots average its own tokens only).
# An encoder block's tree has `"norm1"`, `"attn"`, `"norm2"` as in assignment 1 and the Soft MoE's tree under
# `"mlp"`. The cell below makes such trees from the library when it is installed, every parameter drawn at
# random, hands out assignment 1's LayerNorm and attention, and keeps your prediction as first written
# (`freeze`).

# %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
import functools

import jax
import jax.numpy as jnp
import numpy as np

from moe_course.course.inside.notebook import differs, predictions

freeze = predictions("05_soft_moe.predictions.json")  # freeze(name, value): the first answer counts

rng = np.random.default_rng(0)
EPS = 1e-6  # added to the squared norm before the square root, as the library does
try:  # the course library: on your machine the visible tests compare with it; grading compares outside
    from flax import nnx

    from moe_course.layers import EncoderBlock, SoftMoE
    LIBRARY = True
except ImportError:
    LIBRARY = False
SMALL = dict(width=12, hidden=24, num_experts=3, slots_per_expert=2)
HEADS = 3


def _randomised(module, seed):
    draw = np.random.default_rng(seed)
    for _, param in nnx.iter_graph(module):
        if isinstance(param, nnx.Param):
            param[...] = jnp.asarray(0.3 * draw.normal(size=param.shape), param[...].dtype) + param[...]
    return module, nnx.to_pure_dict(nnx.state(module, nnx.Param))


@functools.cache
def library_soft_moe(seed=0, **fields):
    """(the library's SoftMoE of the SMALL sizes with ``fields`` changed, every parameter redrawn; its tree)."""
    sizes = {**SMALL, **fields}
    return _randomised(SoftMoE(sizes.pop("width"), sizes.pop("hidden"), sizes.pop("num_experts"), **sizes,
                               rngs=nnx.Rngs(seed)), seed)


@functools.cache
def library_block(seed=0):
    """(the library's EncoderBlock whose MLP is a SMALL SoftMoE, every parameter redrawn; its tree)."""
    sizes = dict(SMALL)
    moe = SoftMoE(sizes["width"], sizes["hidden"], sizes["num_experts"], slots_per_expert=sizes["slots_per_expert"],
                  rngs=nnx.Rngs(seed))
    return _randomised(EncoderBlock(sizes["width"], HEADS, sizes["hidden"], mlp=moe, rngs=nnx.Rngs(seed)), seed)


# Given code from assignment 1: a LayerNorm and multi-head self-attention on a block's "attn" tree.
def layer_norm(x, scale, bias):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + 1e-6) * scale + bias


def self_attention(params, x, heads):
    b, t, width = x.shape
    q, k, v = ((x @ params[n]["kernel"] + params[n]["bias"]).reshape(b, t, heads, width // heads)
               for n in ("query", "key", "value"))
    maps = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(q.shape[-1]), axis=-1)
    mixed = jnp.einsum("bhqk,bkhd->bqhd", maps, v).reshape(b, t, width)
    return mixed @ params["out"]["kernel"] + params["out"]["bias"]


# %% [markdown]
# ## 1. The slot logits (3 points)
#
# `soft_logits(params, x)` returns the logits `(batch, tokens, S)`: `scale * <x_t / |x_t|, phi_s / |phi_s|>`,
# every token and every column of `phi` normalised as the library does, `v / sqrt(sum(v**2) + EPS)` (over the
# width), and the product scaled by `params["scale"]`.

# %% nbgrader={"grade": false, "grade_id": "logits_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def soft_logits(params, x):
    ### BEGIN SOLUTION
    x_unit = x / jnp.sqrt(jnp.sum(jnp.square(x), axis=-1, keepdims=True) + EPS)
    phi = params["phi"]
    phi_unit = phi / jnp.sqrt(jnp.sum(jnp.square(phi), axis=0, keepdims=True) + EPS)
    return params["scale"] * jnp.einsum("gtd,ds->gts", x_unit, phi_unit)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "logits_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
x = (rng.normal(size=(2, 5, SMALL["width"])) * rng.uniform(0.2, 5, size=(2, 5, 1))).astype(np.float32)
if LIBRARY:
    from moe_course.routing import soft_logits as library_logits

    layer, params = library_soft_moe()
    gap = differs(soft_logits(params, x), library_logits(x, params["phi"], params["scale"]))
    assert not isinstance(gap, str) and gap < 1e-5, f"your logits differ from the library's: {gap}"
    print("ok: soft_logits equals the library's logits (tokens of different norms, a drawn scale)")
else:
    print("the library is not installed here: grading compares soft_logits with it")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares the outputs with moe_course.routing.soft
_answers.record("logits_tests", soft_logits)
### END HIDDEN TESTS

# %% [markdown]
# ## 2. Debug: the slot inputs of a port (2 points)
#
# `slot_inputs(x, dispatch)` below computes the input slots `X~ = D^T X` (Eq. 1) as a public port of Soft MoE
# wrote it: tokens `x` `(batch, tokens, D)` and dispatch weights `(batch, tokens, S)` -> `(batch, S, D)`,
# every slot a weighted average of its image's tokens. It runs, its shapes are right -- and one line is not
# the paper's layer (Soft MoE Sec. 2.1; google-research/vmoe `vmoe/projects/soft_moe/router.py`; chapter 5,
# section 1 says which kind of mistake public ports made). Run the test below it, find the line and fix it in
# the cell (change as little as you can).

# %% nbgrader={"grade": false, "grade_id": "layer_debug", "locked": false, "schema_version": 3, "solution": true, "task": false}
### BEGIN HANDOUT
def slot_inputs(x, dispatch):
    x_unit = x / jnp.sqrt(jnp.sum(jnp.square(x), axis=-1, keepdims=True) + EPS)
    return jnp.einsum("gts,gtd->gsd", dispatch, x_unit)
### END HANDOUT
### BEGIN SOLUTION
def slot_inputs(x, dispatch):
    return jnp.einsum("gts,gtd->gsd", dispatch, x)  # the raw tokens: the normalisation is for the logits only
### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "slots_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
one = 5.0 * rng.normal(size=(1, 1, SMALL["width"])).astype(np.float32)  # one token, one slot
assert np.allclose(slot_inputs(one, np.ones((1, 1, 1), np.float32)), one, atol=1e-5), \
    "one token dispatched wholly to one slot must come out as that slot, unchanged"
print("ok: slot_inputs' slot of a single token is the token")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares the outputs with moe_course.routing.soft
_answers.record("slots_tests", slot_inputs)
### END HIDDEN TESTS

# %% [markdown]
# ## 3. Predict first (2 points)
#
# Before you write the dispatch weights (task 4), and without running anything: one 224 x 224 image goes
# through a ViT-B/16 (196 patch tokens, no class token, width 768) whose last 6 of its 12 blocks have a Soft
# MoE layer with 128 experts of one slot each, as in the paper's Soft MoE-B/16. How many dispatch weights
# (the numbers in all the dispatch matrices D, over those 6 layers) does its forward pass compute for that
# image? The notebook never runs this model; the check after task 4 counts one such layer's with your code.
#
# In the cell below, replace `raise NotImplementedError()` with `PREDICTED_DISPATCH_WEIGHTS = <an integer>`.
# The cell under it records your first answer in `05_soft_moe.predictions.json` beside this notebook; the
# check after task 4 reports a changed one (the first answer counts).

# %% nbgrader={"grade": false, "grade_id": "dispatch_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
### BEGIN SOLUTION
PREDICTED_DISPATCH_WEIGHTS = 6 * 196 * 128
### END SOLUTION

# %% nbgrader={"grade": false, "grade_id": "dispatch_record", "locked": true, "schema_version": 3, "solution": false, "task": false}
print(freeze("PREDICTED_DISPATCH_WEIGHTS", globals().get("PREDICTED_DISPATCH_WEIGHTS")))

# %% [markdown]
# ## 4. Dispatch and combine weights (2 points)
#
# `soft_weights(logits)` gets logits `(batch, tokens, S)` and returns the pair `(dispatch, combine)`, both
# `(batch, tokens, S)`: the dispatch weights D (Eq. 1), a softmax over the TOKENS for every slot, and the
# combine weights C (Eq. 3), a softmax over the SLOTS for every token.

# %% nbgrader={"grade": false, "grade_id": "weights_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def soft_weights(logits):
    ### BEGIN SOLUTION
    return jax.nn.softmax(logits, axis=1), jax.nn.softmax(logits, axis=2)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "weights_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
logits = 3 * rng.normal(size=(2, 7, 4)).astype(np.float32)
dispatch, combine = soft_weights(logits)
assert np.allclose(np.sum(dispatch, axis=1), 1, atol=1e-5), "every slot's dispatch weights sum to 1 over the tokens"
assert np.allclose(np.sum(combine, axis=2), 1, atol=1e-5), "every token's combine weights sum to 1 over the slots"
if LIBRARY:
    from moe_course.routing import soft_combine_weights, soft_dispatch_weights

    for what, mine, theirs in (("dispatch", dispatch, soft_dispatch_weights(logits)),
                               ("combine", combine, soft_combine_weights(logits))):
        gap = differs(mine, theirs)
        assert not isinstance(gap, str) and gap < 1e-6, f"your {what} weights differ from the library's: {gap}"
print("ok: soft_weights' dispatch columns and combine rows sum to 1" + (", equal to the library's" if LIBRARY else ""))
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares the outputs with moe_course.routing.soft
_answers.record("weights_tests", soft_weights)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "dispatch_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
print(freeze("PREDICTED_DISPATCH_WEIGHTS", PREDICTED_DISPATCH_WEIGHTS))
big = {"phi": rng.normal(size=(768, 128)).astype(np.float32), "scale": np.float32(1.0)}
one_layer, _ = soft_weights(soft_logits(big, rng.normal(size=(1, 196, 768)).astype(np.float32)))
assert PREDICTED_DISPATCH_WEIGHTS == 6 * one_layer.size, (
    f"you predicted {PREDICTED_DISPATCH_WEIGHTS}; your layer's D for this image has shape {one_layer.shape}, "
    "and 6 layers have one each: count again")
print(f"ok: predicted {PREDICTED_DISPATCH_WEIGHTS} dispatch weights, 6 layers of {one_layer.shape}")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader counts them with moe_course.routing.soft
_answers.record("dispatch_tests", lambda: PREDICTED_DISPATCH_WEIGHTS)
### END HIDDEN TESTS

# %% [markdown]
# ## 5. The experts (3 points)
#
# `apply_experts(experts, slots)` gets the tree `params["experts"]` and slots `(batch, S, D)` and returns
# `(batch, S, D)`: slot `s` goes through expert `e = s // p` (p = S / E slots per expert, E the experts in the
# tree), the ViT MLP `gelu(slot @ fc1_kernel[e] + fc1_bias[e]) @ fc2_kernel[e] + fc2_bias[e]` with the *exact*
# GELU (`jax.nn.gelu(..., approximate=False)`).

# %% nbgrader={"grade": false, "grade_id": "experts_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def apply_experts(experts, slots):
    ### BEGIN SOLUTION
    b, s, width = slots.shape
    e = experts["fc1_kernel"].shape[0]
    x = slots.reshape(b, e, s // e, width)
    h = jnp.einsum("bepd,edh->beph", x, experts["fc1_kernel"]) + experts["fc1_bias"][:, None]
    h = jax.nn.gelu(h, approximate=False)
    y = jnp.einsum("beph,ehd->bepd", h, experts["fc2_kernel"]) + experts["fc2_bias"][:, None]
    return y.reshape(b, s, -1)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "experts_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
slots = rng.normal(size=(2, SMALL["num_experts"] * SMALL["slots_per_expert"], SMALL["width"])).astype(np.float32)
if LIBRARY:
    layer, params = library_soft_moe()
    theirs = layer.experts(jnp.asarray(slots).reshape(2, SMALL["num_experts"], SMALL["slots_per_expert"], -1))
    gap = differs(apply_experts(params["experts"], slots), theirs.reshape(slots.shape))
    assert not isinstance(gap, str) and gap < 1e-4, f"your experts' outputs differ from the library's: {gap}"
    print("ok: apply_experts equals the library's Experts (3 experts of 2 slots each)")
else:
    print("the library is not installed here: grading compares apply_experts with it")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares the outputs with moe_course.layers.experts
_answers.record("experts_tests", apply_experts)
### END HIDDEN TESTS

# %% [markdown]
# ## 6. The layer (3 points)
#
# `soft_moe(params, x)` puts your pieces together: logits, dispatch and combine weights, slot inputs, the
# experts, and the output `Y = C Y~` (Eq. 3, every token a combine-weighted average of the slot outputs);
# tokens `(batch, tokens, D)` in, the same shape out. It must equal the library's `SoftMoE(x).output`.

# %% nbgrader={"grade": false, "grade_id": "layer_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def soft_moe(params, x):
    ### BEGIN SOLUTION
    dispatch, combine = soft_weights(soft_logits(params, x))
    outputs = apply_experts(params["experts"], slot_inputs(x, dispatch))
    return jnp.einsum("gts,gsd->gtd", combine, outputs)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "layer_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
if LIBRARY:
    for fields in ({}, {"num_experts": 2, "slots_per_expert": 3}):
        layer, params = library_soft_moe(**fields)
        gap = differs(soft_moe(params, x), layer(jnp.asarray(x)).output)
        assert not isinstance(gap, str) and gap < 1e-4, f"{fields or 'SMALL'}: your layer differs from the library's: {gap}"
    print("ok: soft_moe equals the library's SoftMoE (3 experts x 2 slots, 2 experts x 3 slots)")
else:
    print("the library is not installed here: grading compares soft_moe with it")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares the outputs with moe_course.layers.soft_moe
_answers.record("layer_tests", soft_moe)
### END HIDDEN TESTS

# %% [markdown]
# ## 7. A Soft MoE encoder block (3 points)
#
# `soft_moe_block(params, x, heads)` is assignment 1's pre-LN encoder block with your Soft MoE in place of its
# MLP: `x = x + attention(norm1(x))`, then `x = x + soft_moe(norm2(x))`, with the given `layer_norm` and
# `self_attention` on the block's tree (`params["norm1"]`, `params["attn"]`, `params["norm2"]`) and your
# `soft_moe` on `params["mlp"]`. It must equal the library's `EncoderBlock(..., mlp=SoftMoE(...))(x)[0]`.

# %% nbgrader={"grade": false, "grade_id": "block_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def soft_moe_block(params, x, heads):
    ### BEGIN SOLUTION
    x = x + self_attention(params["attn"], layer_norm(x, params["norm1"]["scale"], params["norm1"]["bias"]), heads)
    return x + soft_moe(params["mlp"], layer_norm(x, params["norm2"]["scale"], params["norm2"]["bias"]))
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "block_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
if LIBRARY:
    block, params = library_block()
    gap = differs(soft_moe_block(params, x, HEADS), block(jnp.asarray(x))[0])
    assert not isinstance(gap, str) and gap < 1e-4, f"your block's output differs from the library's: {gap}"
    print("ok: soft_moe_block equals the library's EncoderBlock with a SoftMoE as its MLP")
else:
    print("the library is not installed here: grading compares soft_moe_block with it")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares the outputs with moe_course.layers.block
_answers.record("block_tests", soft_moe_block)
### END HIDDEN TESTS

# %% [markdown]
# ## 8. Explain (2 points, graded by your instructor)
#
# The port of task 2 trains without an error, and its authors reported reasonable accuracy. In three to six
# sentences: what do its experts never see, why can neither the dispatch nor the combine weights give it back,
# and in which of this course's images would you expect it to matter? (Think of the digit canvases with
# clutter: which patches are faint, which strong?) Write your answer in the cell below, in place of `YOUR ANSWER
# HERE`.

# %% [markdown] nbgrader={"grade": true, "grade_id": "port_explain", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# The experts see only the tokens' directions, never their norms: every slot averages unit vectors, so a faint
# token and a strong one pointing the same way look alike. The dispatch and combine weights cannot give the norm
# back, because they are computed from cosines too (normalised tokens and columns of `phi`), so the whole routed
# path is invariant to a token's scale -- doubling every token leaves the port's routed output unchanged, where
# the paper's layer with linear experts would double it. Only the residual connection still carries the
# magnitude. On the course's digit canvases, near-empty background patches (small norms) are blown up to the
# same size as the digit's strokes and the clutter, so the slots average them as equals and the experts cannot
# tell "faint" from "strong".
#
# Rubric (2 points): 1 point for "the experts see unit-norm tokens: the magnitude is lost" together with why the
# weights cannot restore it (they depend on cosines only, so the routed output is scale-invariant). 1 point for
# a concrete consequence in the course's data (faint background patches weigh as much as strokes or clutter) or
# for naming the residual as the only path of the magnitude. No point for "normalisation makes training
# unstable" without saying what is lost.
# ### END SOLUTION
