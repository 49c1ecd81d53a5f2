# %% [markdown]
# # Assignment 1: from images to tokens and back
#
# Chapter 1 turned an image into tokens with the library. Here you write the patches and the patch embedding
# yourself in NumPy, then the way back from patches to images, which the chapter never writes; you predict a
# shape before you write the function that computes it, find the bug in an attention function, and explain
# in words why a ViT needs its position embedding. The grader compares your functions with the course library
# (`moe_course`), which the ViT of chapter 1 is built from. Replace every `raise NotImplementedError()` with
# your code; the visible tests under each answer help you check your work, further tests are run when your
# notebook is graded. The written answer (task 6) is graded by your instructor.
#
# Check your work with `moe-course check 01_vit.ipynb` (the visible tests, with the base install).

# %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
import numpy as np

rng = np.random.default_rng(0)

# %% [markdown]
# ## 1. Patches (2 points)
#
# `patchify(images, patch_size)` cuts images of shape `(batch, height, width, channels)` into
# non-overlapping `p x p` patches and returns `(batch, (height/p) * (width/p), p * p * channels)`: patches
# in row-major order over the patch grid (left to right, then top to bottom), each patch flattened in the
# order (row inside the patch, column inside the patch, channel).

# %% nbgrader={"grade": false, "grade_id": "patchify_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def patchify(images, patch_size):
    ### BEGIN SOLUTION
    b, h, w, c = images.shape
    p = patch_size
    x = images.reshape(b, h // p, p, w // p, p, c).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(b, (h // p) * (w // p), p * p * c)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "patchify_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
images = rng.normal(size=(2, 8, 8, 3))
patches = patchify(images, 4)
assert patches.shape == (2, 4, 48), f"expected shape (2, 4, 48), got {patches.shape}"
assert np.array_equal(patches[0, 1], images[0, :4, 4:8].reshape(-1)), "patch 1 is the top-right 4x4 block"
print("ok: patchify gives shape (2, 4, 48) and patch 1 is the top-right block")
### BEGIN HIDDEN TESTS
import moe_course.course.answers as _answers  # the grader compares the outputs with moe_course.models.vit
_answers.record("patchify_tests", patchify)
### END HIDDEN TESTS

# %% [markdown]
# ## 2. Predict first (2 points)
#
# Before you write the patch embedding (task 3): a batch of 8 images of 224 x 160 pixels (height x width)
# with 3 colour channels is cut into 16 x 16 patches, and each patch becomes a token of width 384. What shape
# does `embed_patches` return? Write your prediction as a tuple of three integers now, on paper -- the check
# comes after task 3 and compares it with what your `embed_patches` computes (grading: with the library's).
#
# In the cell below, replace `raise NotImplementedError()` with `PREDICTED_SHAPE = (batch, tokens, width)`.

# %% nbgrader={"grade": false, "grade_id": "shape_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
### BEGIN SOLUTION
PREDICTED_SHAPE = (8, 140, 384)
### END SOLUTION

# %% [markdown]
# ## 3. Patch embedding (2 points)
#
# A ViT turns every patch into a token with one linear map shared by all patches. `embed_patches(images,
# kernel, bias, patch_size)` gets a convolution kernel of shape `(p, p, channels, width)` (kernel size =
# stride = p, as the library's `PatchEmbed` uses) and a bias `(width,)`, and returns the tokens
# `(batch, patches, width)`. Hint: a convolution with stride = kernel size is a matrix product with the
# flattened patches.

# %% nbgrader={"grade": false, "grade_id": "embed_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def embed_patches(images, kernel, bias, patch_size):
    ### BEGIN SOLUTION
    p, _, c, width = kernel.shape
    return patchify(images, patch_size) @ kernel.reshape(p * p * c, width) + bias
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "embed_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
kernel = rng.normal(size=(4, 4, 3, 5))
tokens = embed_patches(images, kernel, np.zeros(5), 4)
assert tokens.shape == (2, 4, 5), f"expected shape (2, 4, 5), got {tokens.shape}"
assert np.allclose(tokens[1, 2], np.einsum("ijc,ijcw->w", images[1, 4:8, :4], kernel)), "token 2 = bottom-left patch"
print("ok: embed_patches gives shape (2, 4, 5) and token 2 is the bottom-left patch times the kernel")
### BEGIN HIDDEN TESTS
import moe_course.course.answers as _answers  # the grader compares the outputs with moe_course.models.vit
_answers.record("embed_tests", embed_patches)
### END HIDDEN TESTS

# %% [markdown]
# **The check of your prediction (task 2).** It runs your `embed_patches` on the batch of task 2.

# %% nbgrader={"grade": true, "grade_id": "shape_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
computed = embed_patches(np.zeros((8, 224, 160, 3)), np.zeros((16, 16, 3, 384)), np.zeros(384), 16).shape
assert tuple(PREDICTED_SHAPE) == computed, f"you predicted {PREDICTED_SHAPE}, embed_patches computes {computed}"
print(f"ok: predicted {tuple(PREDICTED_SHAPE)}, embed_patches computes {computed}")
### BEGIN HIDDEN TESTS
import moe_course.course.answers as _answers  # the grader computes the shape with moe_course.models.vit
_answers.record("shape_tests", lambda: tuple(PREDICTED_SHAPE))
### END HIDDEN TESTS

# %% [markdown]
# ## 4. Back from patches to images (3 points)
#
# The chapter only goes one way. `unpatchify(patches, height, width, channels)` undoes `patchify`: it gets
# patches `(batch, (height/p) * (width/p), p * p * channels)` in the order of task 1 and returns the images
# `(batch, height, width, channels)`. The patch size `p` is not given: work it out from the shapes.

# %% nbgrader={"grade": false, "grade_id": "unpatchify_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def unpatchify(patches, height, width, channels):
    ### BEGIN SOLUTION
    batch, count, size = patches.shape
    p = int(round((size // channels) ** 0.5))
    grid = patches.reshape(batch, height // p, width // p, p, p, channels)
    return grid.transpose(0, 1, 3, 2, 4, 5).reshape(batch, height, width, channels)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "unpatchify_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
wide = rng.normal(size=(2, 6, 9, 2))
back = unpatchify(patchify(wide, 3), 6, 9, 2)
assert back.shape == wide.shape, f"expected shape {wide.shape}, got {back.shape}"
assert np.array_equal(back, wide), "unpatchify(patchify(images)) must give the images back"
print("ok: unpatchify undoes patchify on a 6x9 image of 3x3 patches")
### BEGIN HIDDEN TESTS
import moe_course.course.answers as _answers  # the grader inverts moe_course.models.vit.patchify
_answers.record("unpatchify_tests", unpatchify)
### END HIDDEN TESTS

# %% [markdown]
# ## 5. Debug: attention maps (2 points)
#
# `attention_weights(q, k)` below is meant to compute the attention maps of multi-head attention as the
# chapter's `attention_by_hand` and the library's `MultiHeadAttention` do: for every head, `softmax_j(q_i .
# k_j / sqrt(d))` with `d` the head's width, the softmax over the keys. `q` and `k` have shape `(batch,
# tokens, heads, d)`; the maps come back as `(batch, heads, query tokens, key tokens)`, each row summing to 1.
# The code runs, and the rows do sum to 1 -- but it holds one bug, a failure mode chapter 1 shows. Run the
# test below it, find the bug and fix it in the cell (change as little as you can).

# %% nbgrader={"grade": false, "grade_id": "attention_debug", "locked": false, "schema_version": 3, "solution": true, "task": false}
### BEGIN HANDOUT
def attention_weights(q, k):
    scores = np.einsum("bqhd,bkhd->bhqk", q, k)
    scores = scores - scores.max(axis=-1, keepdims=True)  # for a stable exponential; the softmax is unchanged
    weights = np.exp(scores)
    return weights / weights.sum(axis=-1, keepdims=True)
### END HANDOUT
### BEGIN SOLUTION
def attention_weights(q, k):
    scores = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
    scores = scores - scores.max(axis=-1, keepdims=True)  # for a stable exponential; the softmax is unchanged
    weights = np.exp(scores)
    return weights / weights.sum(axis=-1, keepdims=True)
### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "attention_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# One head of width d = 4 and two tokens whose queries and keys are the unit vectors e_0 and e_1: token 0's
# scores are (e_0 . e_0, e_0 . e_1) / sqrt(4) = (0.5, 0), so its row is softmax(0.5, 0).
unit = np.eye(4)[:2].reshape(1, 2, 1, 4)
maps = attention_weights(unit, unit)
assert maps.shape == (1, 1, 2, 2), f"expected shape (1, 1, 2, 2), got {maps.shape}"
assert np.allclose(maps.sum(-1), 1), "every row of a map sums to 1 (softmax over the keys)"
assert np.allclose(maps[0, 0, 0], [0.6225, 0.3775], atol=1e-4), (
    f"token 0's row: expected [0.6225 0.3775], got {maps[0, 0, 0]}")
print("ok: attention_weights gives softmax(0.5, 0) = [0.6225 0.3775] for token 0, rows summing to 1")
### BEGIN HIDDEN TESTS
import moe_course.course.answers as _answers  # the grader compares the maps with moe_course.layers.attention
_answers.record("attention_tests", attention_weights)
### END HIDDEN TESTS

# %% [markdown]
# ## 6. Explain: why the position embedding (2 points, graded by the instructor)
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
