# %% [markdown]
# # Assignment 1: from images to tokens and back
#
# Chapter 1 turned an image into tokens with the library. Here you write the patches and the patch embedding
# yourself in NumPy, then the way back from patches to images, which the chapter never writes, and you
# predict a shape before you compute it. The grader compares your functions with the course library
# (`moe_course`), which the ViT of chapter 1 is built from. Replace every `raise NotImplementedError()` with
# your code; the visible tests under each answer help you check your work, further tests are run when your
# notebook is graded.
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
print("ok: embed_patches gives shape (2, 4, 5) and token 2 is the bottom-left patch times the kernel")
### BEGIN HIDDEN TESTS
import moe_course.course.answers as _answers  # the grader compares the outputs with moe_course.models.vit
_answers.record("embed_tests", embed_patches)
### END HIDDEN TESTS

# %% [markdown]
# ## 3. Back from patches to images (3 points)
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
# ## 4. Explain: why the position embedding (2 points, graded by the instructor)
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

# %% [markdown]
# ## 5. Predict, then run (2 points)
#
# A batch of 8 images of 224 x 160 pixels (height x width) with 3 colour channels is cut into 16 x 16
# patches. What shape does `patchify` return? Write your prediction as a tuple of three integers BEFORE you
# run the check below; the check compares it with what your `patchify` computes, and grading with the
# library's. (No code needed: work it out on paper.)
#
# In the cell below, replace `raise NotImplementedError()` with `PREDICTED_SHAPE = (batch, patches, values)`.

# %% nbgrader={"grade": false, "grade_id": "shape_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
### BEGIN SOLUTION
PREDICTED_SHAPE = (8, 140, 768)
### END SOLUTION

# %% nbgrader={"grade": true, "grade_id": "shape_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
computed = patchify(np.zeros((8, 224, 160, 3)), 16).shape
assert tuple(PREDICTED_SHAPE) == computed, f"you predicted {PREDICTED_SHAPE}, patchify computes {computed}"
print(f"ok: predicted {tuple(PREDICTED_SHAPE)}, patchify computes {computed}")
### BEGIN HIDDEN TESTS
import moe_course.course.answers as _answers  # the grader computes the shape with moe_course.models.vit
_answers.record("shape_tests", lambda: tuple(PREDICTED_SHAPE))
### END HIDDEN TESTS
