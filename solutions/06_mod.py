# %% [markdown]
# # Assignment 6: your Mixture-of-Depths block, in JAX
#
# A Mixture-of-Depths (MoD) block runs a whole encoder block on only the `round(C * T)` highest-scoring of an
# image's T tokens; the others skip it unchanged. Here you write it in `jax.numpy` on the library's own parameter
# tree -- the capacity, the routing scores (the linear router of standard routing and A-MoD's attention
# routing), the top-k selection, and the block itself: gather the selected tokens, run the given encoder block on
# them only, scale their update by the router's gate, scatter it back -- and it must equal the library's
# `moe_course.layers.MoDBlock` on the same parameters and tokens (its output and which tokens it chose). On the
# way you predict how many patches a block keeps before your selection counts them, fix a block whose gate is
# unbounded, write the gradient that reaches the router through the gate, and explain what another gate would
# do. 20 points: 18 graded automatically, 2 (task 8) by your instructor. Replace every
# `raise NotImplementedError()` with your code; the visible tests compare with the library when it is installed,
# and further tests run when your notebook is graded (there the library is absent: write the JAX yourself).
#
# Work in your own copy: `moe-course exercise 06` puts it in `mywork/06_mod.ipynb`. Check it with
# `moe-course check mywork/06_mod.ipynb` (the visible tests, with the base install; from the repository's root
# or any folder in it).
#
# **The parameter tree.** `nnx.to_pure_dict(nnx.state(block, nnx.Param))` of a library `MoDBlock` is a plain dict
# (D = width, M = mlp_dim; a Linear layer's kernel is `(in, out)`):
#
# ```
# params["block"]      the wrapped pre-LN encoder block, named as in a dense ViT's block (assignment 1):
#     ["norm1"], ["norm2"]                       {"scale": (D,), "bias": (D,)}
#     ["attn"]["query" | "key" | "value" | "out"]  {"kernel": (D, D), "bias": (D,)}
#     ["mlp"]["fc1"] {"kernel": (D, M), "bias": (M,)},  ["mlp"]["fc2"] {"kernel": (M, D), "bias": (D,)}
# params["router"]["kernel"]  (D, 1)   standard routing only; an attention-routed block has no "router"
# ```
#
# The cell below makes such trees from the library when it is installed (`library_mod`, every parameter drawn
# at random), keeps your predictions as first written (`freeze`), and the cell after it hands out the encoder
# block of assignment 1 (given code).

# %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
import functools

import jax
import jax.numpy as jnp
import numpy as np

from moe_course.course.inside.notebook import differs, predictions

freeze = predictions("06_mod.predictions.json")  # freeze(name, value): the first answer counts

rng = np.random.default_rng(0)
try:  # the course library: on your machine the visible tests compare with it; grading compares outside
    from flax import nnx

    from moe_course.layers.mod import MoDBlock
    LIBRARY = True
except ImportError:
    LIBRARY = False
WIDTH, HEADS, MLP_DIM, TOKENS = 8, 2, 16, 9


@functools.cache
def library_mod(router, capacity, keep_first, seed=0):
    """(the library's MoDBlock of width 8, 2 heads, MLP 16, for 9 tokens, every parameter redrawn at random;
    its parameter tree as a plain dict of arrays)."""
    block = MoDBlock(WIDTH, HEADS, MLP_DIM, capacity=capacity, router=router, keep_first=keep_first,
                     num_tokens=TOKENS, rngs=nnx.Rngs(seed))
    draw = np.random.default_rng(seed)
    for _, param in nnx.iter_graph(block):
        if isinstance(param, nnx.Param):
            param[...] = jnp.asarray(0.3 * draw.normal(size=param.shape), param[...].dtype) + param[...]
    return block, nnx.to_pure_dict(nnx.state(block, nnx.Param))


def attention_maps(batch, heads, tokens):
    """Random attention maps (batch, heads, tokens, tokens), rows summing to 1: a previous block's."""
    logits = 2 * rng.normal(size=(batch, heads, tokens, tokens))
    return (np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)).astype(np.float32)


# %% [markdown]
# **Given code: the pre-LN encoder block of assignment 1** (its solution). `encoder_block(params, x, heads)` takes
# one block's tree (`params["block"]` above) and tokens `(batch, tokens, D)` and returns the block's output, the
# same shape; the attention runs among the tokens it is given, and nothing else.

# %% nbgrader={"grade": false, "grade_id": "given_block", "locked": true, "schema_version": 3, "solution": false, "task": false}
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
    return mixed @ params["out"]["kernel"] + params["out"]["bias"], maps


def encoder_block(params, x, heads):
    h, _ = self_attention(params["attn"], layer_norm(x, params["norm1"]["scale"], params["norm1"]["bias"]), heads)
    x = x + h
    h = layer_norm(x, params["norm2"]["scale"], params["norm2"]["bias"])
    mlp = params["mlp"]
    h = jax.nn.gelu(h @ mlp["fc1"]["kernel"] + mlp["fc1"]["bias"], approximate=False)
    return x + h @ mlp["fc2"]["kernel"] + mlp["fc2"]["bias"]


# %% [markdown]
# ## 1. Capacity (1 point)
#
# `mod_capacity(tokens, capacity)`: how many tokens a block processes, `round(capacity * tokens)` with
# Python's `round`, at least 1 (plain Python: it is bookkeeping).

# %% nbgrader={"grade": false, "grade_id": "capacity_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def mod_capacity(tokens, capacity):
    ### BEGIN SOLUTION
    return max(1, round(capacity * tokens))
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "capacity_tests", "locked": true, "points": 1, "schema_version": 3, "solution": false, "task": false}
assert mod_capacity(64, 0.125) == 8 and mod_capacity(3, 0.1) == 1, "round(capacity * tokens), at least 1"
print("ok: mod_capacity on 2 cases (8 of 64; at least 1)")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares the outputs with moe_course.routing.mod
_answers.record("capacity_tests", mod_capacity)
### END HIDDEN TESTS

# %% [markdown]
# ## 2. Predict first (2 points)
#
# A ViT-B/16 at 224 x 224 pixels has 196 patch tokens plus the class token: T = 197. A Mixture-of-Depths block
# with capacity C = 0.125 and `keep_first=True` (the class token always processed, inside the budget). How many
# PATCH tokens (not counting the class token) does the block process per image? Write the number NOW, before you
# write the selection in task 4; the notebook never runs a block of this size before you answer.
#
# In the cell below, replace `raise NotImplementedError()` with `PREDICTED_PATCHES = <an integer>`. The cell under
# it records your first answer in `06_mod.predictions.json` beside this notebook; the check after task 4 reports a
# changed one (the first answer counts).

# %% nbgrader={"grade": false, "grade_id": "patches_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
### BEGIN SOLUTION
PREDICTED_PATCHES = 24
### END SOLUTION

# %% nbgrader={"grade": false, "grade_id": "patches_record", "locked": true, "schema_version": 3, "solution": false, "task": false}
print(freeze("PREDICTED_PATCHES", globals().get("PREDICTED_PATCHES")))

# %% [markdown]
# ## 3. Routing scores (2 points)
#
# `router_scores(params, x, previous_attention)` gives the score of every token, `(batch, tokens)` float32, as
# the library's `MoDBlock` computes it. `x` is `(batch, tokens, D)`; `previous_attention` `(batch, heads, tokens,
# tokens)` is the previous block's attention maps (rows sum to 1). When the tree has a `"router"` (standard
# routing, A-MoD Eq. 1) the score is the linear router `r_i = x_i W_r` with `W_r = params["router"]["kernel"]`;
# without one (attention routing, A-MoD Eq. 4) it is the attention token i RECEIVES in the previous block,
# averaged over the heads and the query rows: `r_i = 1/(H N) sum_h sum_j A[h, j, i]`. Use `jax.numpy`.

# %% nbgrader={"grade": false, "grade_id": "scores_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def router_scores(params, x, previous_attention):
    ### BEGIN SOLUTION
    if "router" not in params:  # attention routing: 1/(H N) times what each key token receives
        maps = jnp.asarray(previous_attention, jnp.float32)
        heads, queries = maps.shape[1:3]
        return jnp.sum(maps, axis=(1, 2)) / (heads * queries)
    return jnp.einsum("btd,d->bt", jnp.asarray(x, jnp.float32), params["router"]["kernel"][:, 0])
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "scores_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
x = rng.normal(size=(2, TOKENS, WIDTH)).astype(np.float32)
previous = attention_maps(2, HEADS, TOKENS)
scores = router_scores({"block": {}}, x, previous)
assert np.shape(scores) == (2, TOKENS), f"expected shape (2, {TOKENS}), got {np.shape(scores)}"
assert np.allclose(np.sum(scores, -1), 1, atol=1e-5), "attention routing: an image's scores sum to 1"
if LIBRARY:
    from moe_course.routing.mod import attention_router_scores, standard_router_scores

    _, params = library_mod("standard", 0.5, False)
    gap = differs(router_scores(params, x, previous), standard_router_scores(x, params["router"]["kernel"]))
    assert not isinstance(gap, str) and gap < 1e-5, f"standard routing: your scores differ from the library's: {gap}"
    gap = differs(scores, attention_router_scores(previous))
    assert not isinstance(gap, str) and gap < 1e-6, f"attention routing: your scores differ from the library's: {gap}"
    print("ok: router_scores equals the library's, standard and attention routing")
else:
    print("ok: attention scores sum to 1 per image (grading compares both kinds with the library)")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares the outputs with moe_course.routing.mod
_answers.record("scores_tests", router_scores)
### END HIDDEN TESTS

# %% [markdown]
# ## 4. Top-k selection (3 points)
#
# `mod_select(scores, capacity, keep_first)` returns `(index, processed)`: `index` `(batch, selected)` holds the
# positions of the `mod_capacity(tokens, capacity)` highest-scoring tokens of every image IN ASCENDING ORDER (so
# the processed tokens keep their order); `processed` `(batch, tokens)` is True at those positions. Equal scores
# go to the earlier token (`jax.lax.top_k` does that). With `keep_first=True` token 0 (the class token) is always
# selected, and counts towards the budget. Use `jax.numpy` (`scores` may come as a NumPy array).

# %% nbgrader={"grade": false, "grade_id": "select_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def mod_select(scores, capacity, keep_first=False):
    ### BEGIN SOLUTION
    batch, tokens = scores.shape
    ranked = jnp.asarray(scores, jnp.float32)
    if keep_first:
        ranked = ranked.at[:, 0].set(jnp.inf)
    _, top = jax.lax.top_k(ranked, mod_capacity(tokens, capacity))
    index = jnp.sort(top, axis=1)
    processed = jnp.zeros((batch, tokens), bool).at[jnp.arange(batch)[:, None], index].set(True)
    return index, processed
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "select_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
index, processed = mod_select(np.array([[0.1, 0.5, 0.2, 0.9]]), 0.5)
assert np.asarray(index).tolist() == [[1, 3]], "the two highest scores, positions in ascending order"
assert np.asarray(processed).tolist() == [[False, True, False, True]], "processed is True at the selected positions"
assert np.asarray(mod_select(np.array([[0.1, 0.5, 0.2, 0.9]]), 0.5, keep_first=True)[0]).tolist() == [[0, 3]], \
    "keep_first: token 0 is selected and takes one place of the budget"
print("ok: mod_select keeps the top tokens in ascending order, and token 0 with keep_first")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares the outputs with moe_course.routing.mod
_answers.record("select_tests", mod_select)
### END HIDDEN TESTS

# %% [markdown]
# **The check of your prediction (task 2).** It counts the patch tokens a block of capacity 0.125 processes out of
# 196 (+ the class token) with the library's selection, or with yours where the library is absent.

# %% nbgrader={"grade": true, "grade_id": "patches_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
print(freeze("PREDICTED_PATCHES", PREDICTED_PATCHES))
assert int(PREDICTED_PATCHES) == PREDICTED_PATCHES >= 0, "the prediction is a whole number"
if LIBRARY:
    from moe_course.routing.mod import mod_select as library_select

    counted = int(np.asarray(library_select(jnp.asarray(rng.random((2, 197)), jnp.float32), 0.125,
                                            keep_first=True).processed)[0, 1:].sum())
else:
    counted = int(np.asarray(mod_select(rng.random((2, 197)), 0.125, keep_first=True)[1])[0, 1:].sum())
assert PREDICTED_PATCHES == counted, "not what the block processes: mind the rounding and the class token's place"
print("ok: your prediction is the number of patch tokens the block processes")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader counts with moe_course.routing.mod
_answers.record("patches_tests", lambda: int(PREDICTED_PATCHES))
### END HIDDEN TESTS

# %% [markdown]
# ## 5. Debug: a block that blows up (2 points)
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
    kept = np.asarray(mod_select(x @ w, 0.5)[1])
    assert np.array_equal(mod_block(x, factor * w, update, 0.5)[~kept], x[~kept]), "skipped tokens must not change"
print("ok: mod_block moves no token by more than its update, even with router weights x100; skipped tokens stay")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares the outputs with moe_course.routing.mod
_answers.record("block_tests", mod_block)
### END HIDDEN TESTS

# %% [markdown]
# ## 6. Your Mixture-of-Depths block (4 points)
#
# `mod_forward(params, x, heads, capacity, keep_first, previous_attention)` is the library's `MoDBlock` on tokens
# `x` `(batch, tokens, D)` (a NumPy array or a JAX one), with `params` a tree as above. It returns `(y, index)`:
# the tokens after the block, `(batch, tokens, D)`, and the positions the block processed, your `mod_select`'s
# `index`. Put it together from your pieces: the scores (task 3), the selection (task 4), the selected tokens
# gathered in their order `(batch, selected, D)`, the given `encoder_block` run on THEM ONLY (its attention is
# among the selected tokens), the update `block output - selected tokens`, multiplied -- under standard routing
# only -- by the bounded gate `sigmoid(r_i)` of each selected token (attention routing has no router to teach:
# its gate is 1), and that update added back at the selected positions. Every other token leaves the block
# unchanged, bit for bit (no arithmetic touches it). Use `jax.numpy`; `jnp.take_along_axis` and `.at[...].add`
# do the gathering and the scattering.

# %% nbgrader={"grade": false, "grade_id": "forward_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def mod_forward(params, x, heads, capacity, keep_first, previous_attention):
    ### BEGIN SOLUTION
    x = jnp.asarray(x)
    scores = router_scores(params, x, previous_attention)
    index, _ = mod_select(scores, capacity, keep_first)
    picked = jnp.take_along_axis(x, index[..., None], axis=1)
    update = encoder_block(params["block"], picked, heads) - picked
    if "router" in params:
        update = update * jax.nn.sigmoid(jnp.take_along_axis(scores, index, axis=1))[..., None]
    return x.at[jnp.arange(x.shape[0])[:, None], index].add(update), index
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "forward_tests", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
x = rng.normal(size=(2, TOKENS, WIDTH)).astype(np.float32)
previous = attention_maps(2, HEADS, TOKENS)
if LIBRARY:
    for router, capacity, keep_first in (("standard", 0.5, True), ("attention", 0.34, False)):
        block, params = library_mod(router, capacity, keep_first)
        y, index = mod_forward(params, x, HEADS, capacity, keep_first, previous)
        theirs, _, record = block(jnp.asarray(x), previous_attention=jnp.asarray(previous))
        assert np.array_equal(np.asarray(index), np.asarray(record.index)), \
            f"router={router!r}: your block processed other tokens than the library's"
        gap = differs(y, theirs)
        assert not isinstance(gap, str) and gap < 1e-4, f"router={router!r}: your output differs from the library's: {gap}"
        skipped = ~np.asarray(record.processed)
        assert np.array_equal(np.asarray(y)[skipped], x[skipped]), f"router={router!r}: a skipped token changed"
    print("ok: mod_forward equals the library's MoDBlock (output and processed tokens), standard and attention routing")
else:
    print("the library is not installed here: grading compares mod_forward with it")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares with moe_course.layers.mod.MoDBlock
_answers.record("forward_tests", mod_forward)
### END HIDDEN TESTS

# %% [markdown]
# ## 7. The router's gradient, by hand (4 points)
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
# ## 8. Explain (2 points, graded by your instructor)
#
# A colleague bounds the gate of task 5 differently: `gate = np.clip(r, 0, 1)` instead of your fix. In three to
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
