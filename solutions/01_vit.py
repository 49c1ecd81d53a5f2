# %% [markdown]
# # Assignment 1: your ViT forward, in JAX
#
# Chapter 1 ran the library's ViT. Here you write its forward pass yourself in `jax.numpy`, one piece per task,
# and put the pieces together: the patches, the embedding (patch embedding, class token, position embeddings), a
# LayerNorm, multi-head self-attention, one pre-LN encoder block and the whole model up to its logits. Your
# functions take the library's own parameters -- the tree of a `moe_course.models.ViT` -- and must give the same
# numbers as `ViT(config)(images, deterministic=True)`. On the way you fix a bug in given attention code,
# predict a number before you write the attention that computes it, and explain why a ViT needs its position
# embedding. Replace every `raise NotImplementedError()` with your code; the visible tests under each answer
# compare with the library on your machine, and further tests are run when your notebook is graded (there the
# library is absent: write the JAX yourself). The written answer (task 9) is graded by your instructor.
#
# Work in your own copy: `moe-course exercise 01` puts it in `mywork/01_vit.ipynb`. Check it with
# `moe-course check mywork/01_vit.ipynb` (the visible tests, with the base install; from the repository's
# root or any folder in it).
#
# **The parameter tree.** `nnx.to_pure_dict(nnx.state(model, nnx.Param))` turns a library ViT's parameters into
# a plain nested dict of arrays; this is what your functions get (D = width, M = mlp_dim, p = patch size,
# C = channels, T = tokens per image, K = classes; a Linear layer's kernel is `(in, out)`: `y = x @ kernel + bias`):
#
# ```
# params["patch_embed"]["proj"]["kernel"]  (p, p, C, D)   the strided convolution (kernel = stride = p)
# params["patch_embed"]["proj"]["bias"]    (D,)
# params["cls_token"]                      (1, 1, D)      only with pool="cls"; absent with pool="gap"
# params["pos_embed"]                      (1, T, D)      T = patches (+ 1 for the class token, first)
# params["blocks"][i]                      block i = 0, 1, ...: a dict, as below
#     ["norm1"]["scale"], ["norm1"]["bias"]           (D,)       LayerNorm before the attention
#     ["attn"]["query" | "key" | "value" | "out"]     {"kernel": (D, D), "bias": (D,)}
#     ["norm2"]["scale"], ["norm2"]["bias"]           (D,)       LayerNorm before the MLP
#     ["mlp"]["fc1"]  {"kernel": (D, M), "bias": (M,)},  ["mlp"]["fc2"]  {"kernel": (M, D), "bias": (D,)}
# params["norm"]["scale"], params["norm"]["bias"]      (D,)      the final LayerNorm
# params["head"]["kernel"]  (D, K),  params["head"]["bias"]  (K,)
# ```
#
# The number of heads is not in the tree: it is an argument. The cell below makes such trees from the library
# when it is installed (`library_vit`), with every parameter drawn at random so that no piece hides behind an
# initial zero or one, and keeps your predictions as first written (`freeze`).

# %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
import functools

import jax
import jax.numpy as jnp
import numpy as np

from moe_course.course.inside.notebook import differs, predictions

freeze = predictions("01_vit.predictions.json")  # freeze(name, value): the first answer counts

rng = np.random.default_rng(0)
try:  # the course library: on your machine the visible tests compare with it; grading compares outside
    from flax import nnx

    from moe_course.configs.vit import VIT_PRESETS, ViTConfig
    from moe_course.models import ViT
    LIBRARY = True
except ImportError:
    LIBRARY = False
SMALL = dict(image_size=8, patch_size=4, channels=3, width=12, depth=2, heads=3, mlp_dim=24, num_classes=5)


@functools.cache
def library_vit(seed=0, **fields):
    """(the library's ViT of the SMALL config with ``fields`` changed, every parameter redrawn at random; its
    parameter tree as a plain dict of arrays)."""
    model = ViT(ViTConfig(**{**SMALL, **fields}), rngs=nnx.Rngs(seed))
    draw = np.random.default_rng(seed)
    for _, param in nnx.iter_graph(model):
        if isinstance(param, nnx.Param):
            param[...] = jnp.asarray(0.3 * draw.normal(size=param.shape), param[...].dtype) + param[...]
    return model, nnx.to_pure_dict(nnx.state(model, nnx.Param))


# %% [markdown]
# ## 1. Patches (2 points)
#
# `patchify(images, patch_size)` cuts images of shape `(batch, height, width, channels)` into
# non-overlapping `p x p` patches and returns `(batch, (height/p) * (width/p), p * p * channels)`: patches
# in row-major order over the patch grid (left to right, then top to bottom), each patch flattened in the
# order (row inside the patch, column inside the patch, channel). Use `jax.numpy`.

# %% nbgrader={"grade": false, "grade_id": "patchify_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def patchify(images, patch_size):
    ### BEGIN SOLUTION
    b, h, w, c = images.shape
    p = patch_size
    x = jnp.reshape(images, (b, h // p, p, w // p, p, c)).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(b, (h // p) * (w // p), p * p * c)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "patchify_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
images = rng.normal(size=(2, 8, 8, 3)).astype(np.float32)
patches = patchify(images, 4)
assert patches.shape == (2, 4, 48), f"expected shape (2, 4, 48), got {patches.shape}"
assert np.array_equal(patches[0, 1], images[0, :4, 4:8].reshape(-1)), "patch 1 is the top-right 4x4 block"
print("ok: patchify gives shape (2, 4, 48) and patch 1 is the top-right block")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares the outputs with moe_course.models.vit
_answers.record("patchify_tests", patchify)
### END HIDDEN TESTS

# %% [markdown]
# ## 2. The embedding (3 points)
#
# `embed(params, images)` turns images `(batch, height, width, channels)` into the tokens the first block
# gets, `(batch, T, D)`: every patch times the patch embedding's kernel plus its bias (a convolution with stride =
# kernel size is a matrix product with the flattened patches of task 1), then -- when the tree has a
# `"cls_token"` -- the class token in front of the patch tokens, the same for every image, and finally the
# position embedding `params["pos_embed"]` added to every token (class token included).

# %% nbgrader={"grade": false, "grade_id": "embed_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def embed(params, images):
    ### BEGIN SOLUTION
    kernel = params["patch_embed"]["proj"]["kernel"]
    p, _, c, width = kernel.shape
    x = patchify(images, p) @ jnp.reshape(kernel, (p * p * c, width)) + params["patch_embed"]["proj"]["bias"]
    if "cls_token" in params:
        cls = jnp.broadcast_to(params["cls_token"], (x.shape[0], 1, width))
        x = jnp.concatenate([cls, x], axis=1)
    return x + params["pos_embed"]
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "embed_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
if LIBRARY:
    for pool in ("cls", "gap"):
        model, params = library_vit(pool=pool)
        gap = differs(embed(params, images), model.embed(jnp.asarray(images)))
        assert not isinstance(gap, str) and gap < 1e-4, f"pool={pool!r}: your tokens differ from the library's: {gap}"
    print("ok: embed equals the library's ViT.embed with a class token and without")
else:
    print("the library is not installed here: grading compares embed with it")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares the outputs with moe_course.models.vit
_answers.record("embed_tests", embed)
### END HIDDEN TESTS

# %% [markdown]
# ## 3. Debug: attention maps (2 points)
#
# `attention_weights(q, k)` below is meant to compute the attention maps of multi-head attention as the
# chapter's `attention_by_hand` and the library's `MultiHeadAttention` do: for every head, `softmax_j(q_i .
# k_j / sqrt(d))` with `d` the head's width, the softmax over the keys. `q` and `k` have shape `(batch,
# tokens, heads, d)`; the maps come back as `(batch, heads, query tokens, key tokens)`, each row summing to 1.
# The code runs, and the rows do sum to 1 -- but it holds one bug, a failure mode chapter 1 shows. Run the
# test below it, find the bug and fix it in the cell (change as little as you can). Your attention (task 6)
# uses this function.

# %% nbgrader={"grade": false, "grade_id": "attention_debug", "locked": false, "schema_version": 3, "solution": true, "task": false}
### BEGIN HANDOUT
def attention_weights(q, k):
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k)
    return jax.nn.softmax(scores, axis=-1)
### END HANDOUT
### BEGIN SOLUTION
def attention_weights(q, k):
    scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(q.shape[-1])
    return jax.nn.softmax(scores, axis=-1)
### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "attention_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# Two tokens whose queries and keys are the unit vectors e_0 and e_1, one head of width 4 and one of width 16:
# the maps of the two heads must differ, and each row sums to 1.
for d in (4, 16):
    unit = np.eye(d, dtype=np.float32)[:2].reshape(1, 2, 1, d)
    maps = attention_weights(unit, unit)
    assert maps.shape == (1, 1, 2, 2), f"expected shape (1, 1, 2, 2), got {maps.shape}"
    assert np.allclose(maps.sum(-1), 1), "every row of a map sums to 1 (softmax over the keys)"
    if d == 4:
        narrow = np.asarray(maps)
assert not np.allclose(narrow, maps), "the same vectors in a wider head must give another map: which term is missing?"
print("ok: attention_weights depends on the head's width, rows summing to 1")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares the maps with moe_course.layers.attention
_answers.record("attention_tests", attention_weights)
### END HIDDEN TESTS

# %% [markdown]
# ## 4. Predict first (2 points)
#
# Before you write the attention (task 6), and without running anything: one 224 x 224 RGB image goes through
# ViT-B/16 -- V-MoE Table 7's B: 12 blocks, 12 heads, width 768, 16 x 16 patches, a class token. How many
# attention weights (the numbers in all the attention maps, over every block and head) does its forward pass
# compute for that image? The notebook never runs this model.
#
# In the cell below, replace `raise NotImplementedError()` with `PREDICTED_ATTENTION_WEIGHTS = <an integer>`.
# The cell under it records your first answer in `01_vit.predictions.json` beside this notebook; the check
# after task 6 reports a changed one (the first answer counts).

# %% nbgrader={"grade": false, "grade_id": "weights_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
### BEGIN SOLUTION
PREDICTED_ATTENTION_WEIGHTS = 12 * 12 * (14 * 14 + 1) ** 2
### END SOLUTION

# %% nbgrader={"grade": false, "grade_id": "weights_record", "locked": true, "schema_version": 3, "solution": false, "task": false}
print(freeze("PREDICTED_ATTENTION_WEIGHTS", globals().get("PREDICTED_ATTENTION_WEIGHTS")))

# %% [markdown]
# ## 5. LayerNorm (2 points)
#
# `layer_norm(x, scale, bias)` normalises every token (the last axis, width D) to mean 0 and variance 1 and
# then scales and shifts it: `(x - mean) / sqrt(var + epsilon) * scale + bias`, with the variance over the
# D values (divided by D) and `epsilon = 1e-6`, the library's (SPEC Sec. 1). `x` is `(..., D)`; `scale` and
# `bias` are `(D,)`.

# %% nbgrader={"grade": false, "grade_id": "layer_norm_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def layer_norm(x, scale, bias):
    ### BEGIN SOLUTION
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + 1e-6) * scale + bias
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "layer_norm_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
x = rng.normal(size=(2, 3, 8)).astype(np.float32)
y = layer_norm(x, np.ones(8, np.float32), np.zeros(8, np.float32))
assert y.shape == x.shape, f"expected shape {x.shape}, got {y.shape}"
assert np.allclose(np.mean(y, -1), 0, atol=1e-5) and np.allclose(np.var(y, -1), 1, atol=1e-3), "mean 0, variance 1"
if LIBRARY:
    from moe_course.layers.block import LAYER_NORM_EPS

    for spread in (1.0, 1e-3):  # tokens of variance 1 and of variance 1e-6
        model, params = library_vit(pool="cls")
        tokens = spread * rng.normal(size=(2, 5, SMALL["width"])).astype(np.float32)
        gap = differs(layer_norm(tokens, params["norm"]["scale"], params["norm"]["bias"]), model.norm(tokens))
        assert not isinstance(gap, str) and gap < 1e-4, f"spread {spread}: yours differs from the library's: {gap}"
    print(f"ok: layer_norm equals the library's LayerNorm (epsilon {LAYER_NORM_EPS}) at variance 1 and 1e-6")
else:
    print("ok: layer_norm gives mean 0, variance 1 (grading compares it with the library)")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares the outputs with nnx.LayerNorm
_answers.record("layer_norm_tests", layer_norm)
### END HIDDEN TESTS

# %% [markdown]
# ## 6. Multi-head self-attention (3 points)
#
# `self_attention(params, x, heads)` gets one block's `params["attn"]` (the four Linear layers `query`, `key`,
# `value`, `out`) and tokens `x` `(batch, T, D)`, and returns `(output, maps)`: queries, keys and values are the
# three projections of `x`, each split into `heads` heads of width `D / heads` (the projection's first `D /
# heads` outputs are head 0, the next head 1, ...: a reshape to `(batch, T, heads, D / heads)`); the maps are your
# `attention_weights` of task 3, `(batch, heads, T, T)`; every head's output is its map times its values, the
# heads are put back side by side `(batch, T, D)`, and the `out` projection gives `output`.

# %% nbgrader={"grade": false, "grade_id": "self_attention_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def self_attention(params, x, heads):
    ### BEGIN SOLUTION
    b, t, width = x.shape

    def project(name):
        return x @ params[name]["kernel"] + params[name]["bias"]

    q, k, v = (project(name).reshape(b, t, heads, width // heads) for name in ("query", "key", "value"))
    maps = attention_weights(q, k)
    mixed = jnp.einsum("bhqk,bkhd->bqhd", maps, v).reshape(b, t, width)
    return mixed @ params["out"]["kernel"] + params["out"]["bias"], maps
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "self_attention_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
x = rng.normal(size=(2, 5, SMALL["width"])).astype(np.float32)
if LIBRARY:
    model, params = library_vit(pool="cls")
    output, maps = self_attention(params["blocks"][0]["attn"], x, SMALL["heads"])
    theirs, their_maps = model.blocks[0].attn(jnp.asarray(x), return_attention=True)
    for what, mine, reference in (("maps", maps, their_maps), ("output", output, theirs)):
        gap = differs(mine, reference)
        assert not isinstance(gap, str) and gap < 1e-4, f"your {what} differ from the library's: {gap}"
    print(f"ok: self_attention equals the library's MultiHeadAttention ({SMALL['heads']} heads): output and maps")
else:
    print("the library is not installed here: grading compares self_attention with it")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares with moe_course.layers.attention
_answers.record("self_attention_tests", self_attention)
### END HIDDEN TESTS

# %% [markdown]
# **The check of your prediction (task 4).** It counts the attention weights of the library's ViT-B/16 from its
# shapes alone (nothing is allocated); your answer was recorded before you wrote task 6.

# %% nbgrader={"grade": true, "grade_id": "weights_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
print(freeze("PREDICTED_ATTENTION_WEIGHTS", PREDICTED_ATTENTION_WEIGHTS))
assert int(PREDICTED_ATTENTION_WEIGHTS) == PREDICTED_ATTENTION_WEIGHTS > 0, "the prediction is a positive integer"
if LIBRARY:
    b16 = VIT_PRESETS["vit-b/16"]
    graph, state = nnx.split(nnx.eval_shape(lambda: ViT(b16, rngs=nnx.Rngs(0))))
    image = jax.ShapeDtypeStruct((1, b16.image_size, b16.image_size, b16.channels), jnp.float32)
    shapes = jax.eval_shape(lambda s, x: nnx.merge(graph, s)(x, return_attention=True).attention, state, image)
    assert PREDICTED_ATTENTION_WEIGHTS == sum(np.prod(m.shape) for m in shapes), (
        "not what ViT-B/16 computes: count the tokens of one image, then a map per head and block")
    print("ok: your prediction is the number of attention weights ViT-B/16 computes for one image")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader counts with moe_course.models.vit
_answers.record("weights_tests", lambda: int(PREDICTED_ATTENTION_WEIGHTS))
### END HIDDEN TESTS

# %% [markdown]
# ## 7. One encoder block (3 points)
#
# `encoder_block(params, x, heads)` gets one block's parameters `params["blocks"][i]` and tokens `(batch, T, D)`
# and returns the block's output, the same shape: pre-LayerNorm, `x = x + attention(norm1(x))`, then
# `x = x + mlp(norm2(x))` with `mlp(h) = gelu(h @ fc1 + b1) @ fc2 + b2` and the *exact* GELU, `x Phi(x)` with the
# normal CDF (mind that `jax.nn.gelu` uses its tanh approximation unless told otherwise). Use your `layer_norm` and
# `self_attention`.

# %% nbgrader={"grade": false, "grade_id": "block_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def encoder_block(params, x, heads):
    ### BEGIN SOLUTION
    h, _ = self_attention(params["attn"], layer_norm(x, params["norm1"]["scale"], params["norm1"]["bias"]), heads)
    x = x + h
    h = layer_norm(x, params["norm2"]["scale"], params["norm2"]["bias"])
    mlp = params["mlp"]
    h = jax.nn.gelu(h @ mlp["fc1"]["kernel"] + mlp["fc1"]["bias"], approximate=False)
    return x + h @ mlp["fc2"]["kernel"] + mlp["fc2"]["bias"]
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "block_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
if LIBRARY:
    model, params = library_vit(pool="gap")
    gap = differs(encoder_block(params["blocks"][1], x, SMALL["heads"]), model.blocks[1](jnp.asarray(x))[0])
    assert not isinstance(gap, str) and gap < 1e-4, f"your block's output differs from the library's: {gap}"
    print("ok: encoder_block equals the library's EncoderBlock")
else:
    print("the library is not installed here: grading compares encoder_block with it")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares with moe_course.layers.block
_answers.record("block_tests", encoder_block)
### END HIDDEN TESTS

# %% [markdown]
# ## 8. The whole forward (3 points)
#
# `vit_forward(params, images, heads)` gives the logits `(batch, K)` of images `(batch, height, width, channels)`:
# your embedding, every block of `params["blocks"]` in order (block 0 first), the final LayerNorm
# `params["norm"]`, then the pooling -- the class token's final value where the tree has a `"cls_token"`, else
# the average of the final tokens -- and the linear head `params["head"]`. It must equal
# `ViT(config)(images, deterministic=True).logits` with the library's parameters.

# %% nbgrader={"grade": false, "grade_id": "forward_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def vit_forward(params, images, heads):
    ### BEGIN SOLUTION
    x = embed(params, images)
    for i in range(len(params["blocks"])):
        x = encoder_block(params["blocks"][i], x, heads)
    x = layer_norm(x, params["norm"]["scale"], params["norm"]["bias"])
    pooled = x[:, 0] if "cls_token" in params else jnp.mean(x, axis=1)
    return pooled @ params["head"]["kernel"] + params["head"]["bias"]
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "forward_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
if LIBRARY:
    for pool in ("cls", "gap"):
        model, params = library_vit(pool=pool)
        logits = vit_forward(params, images, SMALL["heads"])
        gap = differs(logits, model(jnp.asarray(images), deterministic=True).logits)
        assert not isinstance(gap, str) and gap < 1e-4, f"pool={pool!r}: your logits differ from the library's: {gap}"
    print(f"ok: vit_forward gives the library's logits {logits.shape} with pool='cls' and pool='gap'")
else:
    print("the library is not installed here: grading compares vit_forward with it")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares with moe_course.models.vit
_answers.record("forward_tests", vit_forward)
### END HIDDEN TESTS

# %% [markdown]
# ## 9. Explain: why the position embedding (2 points, graded by the instructor)
#
# Chapter 1 adds a learned position embedding to every token before the first block. Suppose a ViT had none:
# you cut an image into patches, shuffle the patches into another order, and feed both sequences to the same
# model, which pools its final tokens by their average (`pool="gap"`). What does the model output for the
# shuffled image, compared with the original -- and why? Then say what the position embedding changes. Answer
# in three to six sentences in the cell below (replace `YOUR ANSWER HERE`); name the operations of a block that
# decide it.

# %% [markdown] nbgrader={"grade": true, "grade_id": "positions_explain", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# The same output. Every operation of a block treats tokens alike: LayerNorm and the MLP act on each token
# separately, and self-attention mixes them with weights that depend only on the tokens' contents
# (`softmax(q_i . k_j)`), so permuting the input tokens permutes every block's output tokens the same way
# (attention is permutation-equivariant); the average over tokens then forgets the order altogether. Without
# position embeddings a ViT sees a bag of patches. Adding a different learned vector to each position makes
# a token's value depend on where its patch was, so the shuffled image gives other tokens and another output.
#
# Rubric (2 points): 1 point for "the same output" with the reason that attention, LayerNorm and the MLP are
# permutation-equivariant and average pooling is permutation-invariant (naming attention's weights depending on
# content only is enough); 1 point for what the position embedding changes (a token's value depends on its
# position, so order matters). 0 for "different output" without a mechanism; no point for "attention looks at
# neighbours" (it looks at all tokens).
# ### END SOLUTION
