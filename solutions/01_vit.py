# %% [markdown]
# # Assignment 1: patches and attention by hand
#
# Chapter 1 turned an image into tokens and let the tokens attend to each other. Here you write both pieces
# yourself in NumPy, and the grader compares them with the course library (`moe_course`), which the ViT of
# chapter 1 is built from. Replace every `raise NotImplementedError()` with your code; the visible tests
# under each answer help you check your work, further tests are run when your notebook is graded.
#
# Run `moe-course course validate 01_vit.ipynb` before you hand in.

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
### BEGIN HIDDEN TESTS
import moe_course.course.answers as _answers  # the grader compares the outputs with moe_course.models.vit
_answers.record("patchify_tests", patchify)
### END HIDDEN TESTS

# %% [markdown]
# ## 2. Patch embedding (2 points)
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
### BEGIN HIDDEN TESTS
import moe_course.course.answers as _answers  # the grader compares the outputs with moe_course.models.vit
_answers.record("embed_tests", embed_patches)
### END HIDDEN TESTS

# %% [markdown]
# ## 3. Attention weights (3 points)
#
# Multi-head attention compares every query with every key: `attention_weights(q, k)` gets queries and keys
# of shape `(batch, tokens, heads, head_dim)` and returns `softmax(q k^T / sqrt(head_dim))` per head, shape
# `(batch, heads, query tokens, key tokens)`, the softmax taken over the keys. Subtract each row's maximum
# before exponentiating, so that large scores do not overflow.

# %% nbgrader={"grade": false, "grade_id": "weights_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def attention_weights(q, k):
    ### BEGIN SOLUTION
    scores = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(q.shape[-1])
    scores = scores - scores.max(axis=-1, keepdims=True)
    weights = np.exp(scores)
    return weights / weights.sum(axis=-1, keepdims=True)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "weights_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
q, k = rng.normal(size=(2, 5, 3, 4)), rng.normal(size=(2, 6, 3, 4))
weights = attention_weights(q, k)
assert weights.shape == (2, 3, 5, 6), f"expected shape (2, 3, 5, 6), got {weights.shape}"
assert np.allclose(weights.sum(axis=-1), 1.0), "each query's weights over the keys sum to 1"
assert np.all(np.isfinite(attention_weights(1e4 * q, k))), "large scores must not overflow"
### BEGIN HIDDEN TESTS
import moe_course.course.answers as _answers  # the grader compares the outputs with moe_course.layers.attention
_answers.record("weights_tests", attention_weights)
### END HIDDEN TESTS

# %% [markdown]
# ## 4. Attending (2 points)
#
# `attend(weights, v)` mixes the values: weights `(batch, heads, query tokens, key tokens)` and values `v`
# `(batch, key tokens, heads, head_dim)` give `(batch, query tokens, heads, head_dim)`, every query's output
# the weighted sum of the values of all keys, in each head separately.

# %% nbgrader={"grade": false, "grade_id": "attend_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def attend(weights, v):
    ### BEGIN SOLUTION
    return np.einsum("bhqk,bkhd->bqhd", weights, v)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "attend_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
v = rng.normal(size=(2, 6, 3, 4))
out = attend(np.full((2, 3, 5, 6), 1 / 6), v)
assert out.shape == (2, 5, 3, 4), f"expected shape (2, 5, 3, 4), got {out.shape}"
assert np.allclose(out[0, 0], v[0].mean(axis=0)), "uniform weights average the values"
### BEGIN HIDDEN TESTS
import moe_course.course.answers as _answers  # the grader mixes the values as moe_course.layers.attention does
_answers.record("attend_tests", attend)
### END HIDDEN TESTS
