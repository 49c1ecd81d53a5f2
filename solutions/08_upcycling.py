# %% [markdown]
# # Assignment 8: sparse upcycling -- one dense block becomes an MoE layer
#
# Sparse upcycling (Komatsuzaki et al., ICLR 2023, [arXiv:2212.05055](https://arxiv.org/abs/2212.05055), Fig. 1)
# turns a trained dense ViT into a V-MoE: in every block that becomes an MoE layer, each expert starts as a copy
# of the block's dense MLP and the router, which the dense model does not have, starts from a random
# initialisation; every other weight is carried over. You write that surgery for one block in NumPy: the expert
# copies in the layout google-research/vmoe gives them, and the router's initial kernel; you predict, before
# you build the layer, when the upcycled layer computes exactly what the dense MLP did; you fix a converter of
# PyTorch weights that has one bug; and you explain, in words, what goes wrong with a router that starts at
# zero. Points: 13 (10 autograded, 3 for the written answer, graded by the instructor). The graded tests compare
# your functions with `moe_course` (`moe_course.models.upcycling`, the router of `moe_course.layers.SparseMoE`).
#
# Check your work with `moe-course check 08_upcycling.ipynb` (the visible tests, with the base install).

# %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
import math

import numpy as np

rng = np.random.default_rng(0)


def gelu(h):
    """The exact (erf) GELU of ViT's MLP and of every V-MoE expert."""
    return 0.5 * h * (1.0 + np.vectorize(math.erf)(h / math.sqrt(2.0)))


def dense_mlp(x, fc1_kernel, fc1_bias, fc2_kernel, fc2_bias):
    """A block's MLP in the course's layout: kernels are (in, out), so x (tokens, width) @ fc1_kernel."""
    return gelu(x @ fc1_kernel + fc1_bias) @ fc2_kernel + fc2_bias


def torch_mlp(x, fc1_weight, fc1_bias, fc2_weight, fc2_bias):
    """The same MLP as PyTorch computes it, ``fc2(gelu(fc1(x)))``, from PyTorch's weights."""
    return gelu(x @ fc1_weight.T + fc1_bias) @ fc2_weight.T + fc2_bias


# %% [markdown]
# ## 1. The experts: E copies of the dense MLP (3 points)
#
# vmoe upcycles a dense checkpoint with its `expand_tile` rule: a dense MLP array of shape `s` becomes an
# array of shape `(E, *s)` whose E entries along the new first axis are equal copies, one per expert. The
# course's experts store their parameters that way: `fc1_kernel` (E, width, hidden), `fc1_bias` (E, hidden),
# `fc2_kernel` (E, hidden, width), `fc2_bias` (E, width). `expert_copies(fc1_kernel, fc1_bias, fc2_kernel,
# fc2_bias, num_experts)` gets the dense arrays (kernels in the (in, out) layout) and returns the four
# expert arrays, in that order. Each must be an array of its own (changing one expert's weights during
# training must not change another's, or the dense arrays).

# %% nbgrader={"grade": false, "grade_id": "copies_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def expert_copies(fc1_kernel, fc1_bias, fc2_kernel, fc2_bias, num_experts):
    ### BEGIN SOLUTION
    return tuple(np.repeat(np.asarray(a)[None], num_experts, axis=0)
                 for a in (fc1_kernel, fc1_bias, fc2_kernel, fc2_bias))
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "copies_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
dense = (rng.normal(size=(6, 10)), rng.normal(size=10), rng.normal(size=(10, 6)), rng.normal(size=6))
experts = expert_copies(*dense, 3)
assert [e.shape for e in experts] == [(3, 6, 10), (3, 10), (3, 10, 6), (3, 6)], [e.shape for e in experts]
assert all(np.array_equal(e[i], d) for e, d in zip(experts, dense) for i in range(3)), "every expert is a copy"
experts[0][1] += 1.0
assert np.array_equal(experts[0][0], dense[0]), "changing expert 1 changed expert 0: each must be its own copy"
print("ok: expert_copies gives (E, ...) arrays of equal, separate copies")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares with moe_course.models.upcycling.expand_tile
_answers.record("copies_tests", expert_copies)
### END HIDDEN TESTS

# %% [markdown]
# ## 2. Predict first (2 points)
#
# Build nothing yet. You upcycle a dense MLP into an MoE layer of E = 4 experts with V-MoE's router: the
# softmax over the experts first, then the k largest probabilities kept, unchanged, as the gates (TOP_k after
# the softmax, V-MoE Sec. 2.1); the layer's output for a token is the sum over its k chosen experts of gate
# times expert output. The capacity is large enough that no token is dropped, and the router's kernel is
# random (section 3). What is the SMALLEST k for which the upcycled layer computes exactly the dense MLP's
# output for every token, whatever the router's kernel? Write it BEFORE you go on; section 4 computes it with
# your own functions.
#
# In the cell below, replace `raise NotImplementedError()` with `PREDICTED_K = your number`.

# %% nbgrader={"grade": false, "grade_id": "k_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
### BEGIN SOLUTION
PREDICTED_K = 4
### END SOLUTION

# %% [markdown]
# ## 3. The router's initial kernel (3 points)
#
# The router is new: vmoe leaves it at the initial value of the freshly built V-MoE, and so does the course
# (`moe_course.models.upcycle`). It is a bias-free linear layer of kernel (width, E), which Flax initialises as
# LeCun normal: every entry is `z * sqrt(1 / width) / 0.87962566103423978`, with `z` drawn from a standard
# normal truncated to [-2, 2] (width is the layer's fan-in; 0.8796... is the standard deviation of that
# truncated normal, so the entries' standard deviation is exactly `sqrt(1 / width)`).
# `router_kernel(width, num_experts, rng)` draws such a kernel with the NumPy generator `rng` (and nothing
# else: the same generator state gives the same kernel) and returns it as float32. Hint: draw standard
# normals and draw again those outside [-2, 2] until none is left.

# %% nbgrader={"grade": false, "grade_id": "router_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def router_kernel(width, num_experts, rng):
    ### BEGIN SOLUTION
    z = rng.standard_normal((width, num_experts))
    outside = np.abs(z) > 2.0
    while outside.any():
        z[outside] = rng.standard_normal(int(outside.sum()))
        outside = np.abs(z) > 2.0
    return (z * math.sqrt(1.0 / width) / 0.87962566103423978).astype(np.float32)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "router_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
kernel = router_kernel(256, 64, np.random.default_rng(1))
assert kernel.shape == (256, 64), f"expected (width, E) = (256, 64), got {kernel.shape}"
assert kernel.dtype == np.float32, f"expected float32, got {kernel.dtype}"
assert abs(kernel.std() * math.sqrt(256) - 1.0) < 0.03, f"standard deviation {kernel.std():.4f}, want 1/sqrt(256)"
bound = 2 / 0.87962566103423978 / math.sqrt(256)
assert np.abs(kernel).max() <= bound + 1e-6, "an entry lies beyond 2 standard deviations of z: truncate at [-2, 2]"
same = router_kernel(256, 64, np.random.default_rng(1))
assert np.array_equal(kernel, same), "the same generator state must give the same kernel"
assert not np.array_equal(kernel, router_kernel(256, 64, np.random.default_rng(2))), "another seed, another kernel"
print(f"ok: router_kernel draws a truncated LeCun normal (std x sqrt(width) = {kernel.std() * 16:.3f})")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares the law with moe_course's SparseMoE router
_answers.record("router_tests", router_kernel)
### END HIDDEN TESTS

# %% [markdown]
# ## 4. Your prediction, checked
#
# The cell below builds the upcycled layer from your functions (no capacity: every token is served) and finds
# the smallest k at which its output equals the dense MLP's for every one of 64 random tokens.

# %% nbgrader={"grade": true, "grade_id": "k_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
def upcycled_layer(x, experts, router, k):
    """x (tokens, width) -> (tokens, width): sum over each token's k chosen experts of gate * expert(x)."""
    logits = x @ router
    probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    chosen = np.argsort(-probs, axis=-1, kind="stable")[:, :k]
    out = np.zeros_like(x)
    for e in range(router.shape[1]):
        gate = np.where((chosen == e).any(axis=-1), probs[:, e], 0.0)[:, None]
        out += gate * dense_mlp(x, *(p[e] for p in experts))
    return out


width, tokens = 16, 64
dense = (rng.normal(size=(width, 32)) / 4, rng.normal(size=32), rng.normal(size=(32, width)) / 6,
         rng.normal(size=width))
x = rng.normal(size=(tokens, width))
moe = (expert_copies(*dense, 4), router_kernel(width, 4, rng))
equal = [k for k in range(1, 5) if np.allclose(upcycled_layer(x, *moe, k), dense_mlp(x, *dense), rtol=1e-5, atol=1e-6)]
assert equal, "the upcycled layer never equals the dense MLP: check expert_copies"
assert PREDICTED_K == equal[0], (f"you predicted {PREDICTED_K}, your upcycled layer first equals the dense MLP at "
                                 f"k = {equal[0]}")
print(f"ok: predicted k = {PREDICTED_K}; your upcycled layer first equals the dense MLP at k = {equal[0]}")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader finds k with moe_course.routing's gates
_answers.record("k_tests", lambda: PREDICTED_K)
### END HIDDEN TESTS

# %% [markdown]
# ## 5. Debug: a dense MLP from PyTorch (2 points)
#
# Most dense checkpoints are PyTorch ones (timm, Hugging Face). A colleague wrote the converter below: it
# takes one block's MLP as PyTorch stores it -- `fc1.weight` (hidden, width), `fc1.bias`, `fc2.weight` (width,
# hidden), `fc2.bias` -- and returns the four arrays in the course's layout (kernels (in, out); chapter 0,
# section 3 compares the two layouts), ready for `expert_copies`. It runs and every shape is right, yet the
# model upcycled from it does not compute what the PyTorch model did (`torch_mlp`, in the first cell). Run the
# test below it, find the one bug and fix it in the cell.

# %% nbgrader={"grade": false, "grade_id": "torch_debug", "locked": false, "schema_version": 3, "solution": true, "task": false}
### BEGIN HANDOUT
def mlp_from_torch(fc1_weight, fc1_bias, fc2_weight, fc2_bias):
    """One block's PyTorch MLP -> (fc1_kernel (width, hidden), fc1_bias, fc2_kernel (hidden, width), fc2_bias)."""
    hidden, width = fc1_weight.shape
    fc1_kernel = fc1_weight.reshape(width, hidden)  # PyTorch stores (out, in); the course (in, out)
    fc2_kernel = fc2_weight.reshape(hidden, width)
    return fc1_kernel, fc1_bias, fc2_kernel, fc2_bias
### END HANDOUT
### BEGIN SOLUTION
def mlp_from_torch(fc1_weight, fc1_bias, fc2_weight, fc2_bias):
    """One block's PyTorch MLP -> (fc1_kernel (width, hidden), fc1_bias, fc2_kernel (hidden, width), fc2_bias)."""
    fc1_kernel = fc1_weight.T  # a transpose, not a reshape: the same numbers in another order
    fc2_kernel = fc2_weight.T
    return fc1_kernel, fc1_bias, fc2_kernel, fc2_bias
### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "torch_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
for shape in ((12, 5), (8, 8)):
    weights = (rng.normal(size=shape), rng.normal(size=shape[0]), rng.normal(size=shape[::-1]),
               rng.normal(size=shape[1]))
    x = rng.normal(size=(7, shape[1]))
    gap = np.abs(dense_mlp(x, *mlp_from_torch(*weights)) - torch_mlp(x, *weights)).max()
    assert gap < 1e-9, f"hidden {shape[0]}, width {shape[1]}: the converted MLP differs from PyTorch's by {gap:.3f}"
print("ok: mlp_from_torch's MLP computes what PyTorch's does")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares with moe_course.torch.convert.to_nnx_layout
_answers.record("torch_tests", mlp_from_torch)
### END HIDDEN TESTS

# %% [markdown]
# ## 6. Explain: a router that starts at zero (3 points, graded by the instructor)
#
# Another colleague proposes to initialise the router kernel at ZERO instead of section 3's random kernel,
# "so that the upcycled model starts as close to the dense one as possible". The layer uses V-MoE's defaults:
# E = 8 experts, k = 1 (TOP-1 after the softmax), capacity ratio C = 1.05, vanilla routing, ties broken
# towards the lower expert index. Without router noise (as at evaluation), what does the upcycled layer do with
# a group's N tokens -- which experts receive them, how many are dropped, what the layer outputs for a served
# and for a dropped token, compared with the dense MLP? Why does a small random kernel serve upcycling better,
# at step 0 and as training goes on? Answer in four to eight sentences, no code, in the cell below (replace
# `YOUR ANSWER HERE`).

# %% [markdown] nbgrader={"grade": true, "grade_id": "router_zero_explain", "locked": false, "points": 3, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# A zero kernel gives every token the same logits, so the softmax gives each expert 1/8 and TOP-1 picks expert
# 0 for every token (the tie goes to the lowest index). Expert 0's buffer holds round(N * 1.05 / 8) tokens,
# about 13% of the group; the first of them in the group's order are served and the other ~87% are dropped. A
# served token gets gate 1/8 times the copied MLP, i.e. the dense MLP's output scaled by 1/8; a dropped token
# gets 0 from the layer and only the residual carries it on. So the model starts far from the dense one, the
# opposite of the intent. (In training, V-MoE's router noise of std 1/E spreads the tokens over the experts at
# random, but every gate stays near 1/8, so the MLP's contribution is still cut to about an eighth.) Experts
# that receive no token get no gradient, and the copies stay identical as long as the router treats all tokens
# alike; only the router's gradient from the few served tokens can break the tie. A small random kernel gives
# tokens different logits: they spread over all experts (about N/8 each, so few are dropped at C = 1.05), each
# keeps its largest probability as its gate (above 1/8), and each expert sees its own subset of tokens, so the
# copies receive different gradients and diverge -- the specialisation upcycling relies on.
#
# Rubric (3 points): 1 point for "every token goes to expert 0 (equal logits, ties to the lowest index) and all
# but about 1.05 N / E tokens are dropped"; 1 point for the outputs: a served token gets the dense MLP scaled by
# 1/E, a dropped one gets 0 (the residual carries it); 1 point for why random is better: tokens spread over the
# experts, the experts receive different tokens and gradients, so the identical copies can diverge (symmetry
# breaking). Half a point where the idea is there but the number or the reason is wrong; no point for "a zero
# router makes the model equal the dense one".
# ### END SOLUTION
