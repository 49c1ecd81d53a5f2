# %% [markdown]
# # Assignment 8: upcycling your dense ViT into your V-MoE, in JAX
#
# Sparse upcycling (Komatsuzaki et al., ICLR 2023, [arXiv:2212.05055](https://arxiv.org/abs/2212.05055), Fig. 1)
# turns a trained dense ViT into a V-MoE: in every block that becomes an MoE layer, each expert starts as a copy
# of the block's dense MLP; the router, which the dense model does not have, keeps the random initial value of a
# freshly built V-MoE; every other parameter is carried over. Here you write that surgery yourself in `jax.numpy`
# on the parameter trees your ViT (exercise 01) and your MoE layer (exercise 02) take: which blocks become MoE
# layers, the experts' copies, the whole upcycled tree -- equal to `moe_course.models.upcycle` leaf by leaf -- and
# the dense optimizer's moments carried along. On the way you predict which routings make the upcycled V-MoE
# compute exactly the dense ViT's function (before you build it), fix the combine weights of an Experts Choice
# router meant to keep that function, and explain what a router that starts at zero would do (graded by your
# instructor). Replace every `raise NotImplementedError()` with your code; the visible tests compare with the
# library on your machine, and further tests run when your notebook is graded (there the library is absent).
#
# Work in your own copy: `moe-course exercise 08` puts it in `mywork/08_upcycling.ipynb`. Check it with
# `moe-course check mywork/08_upcycling.ipynb` (the visible tests, with the base install; from the repository's
# root or any folder in it).
#
# **The parameter trees.** `nnx.to_pure_dict(nnx.state(model, nnx.Param))` of a library ViT is exercise 01's
# tree (D = width, M = mlp_dim): `params["blocks"][i]["mlp"]` is `{"fc1": {"kernel": (D, M), "bias": (M,)},
# "fc2": {"kernel": (M, D), "bias": (D,)}}`, beside `"norm1"`, `"attn"`, `"norm2"` of the block and the model's
# `"patch_embed"`, `"pos_embed"`, `"cls_token"` (with `pool="cls"`), `"norm"`, `"head"`. A V-MoE's tree is the
# same, except that in each of its MoE blocks the MLP is exercise 02's layer:
#
# ```
# params["blocks"][i]["mlp"]["router"]["kernel"]          (D, E)
# params["blocks"][i]["mlp"]["experts"]["fc1_kernel"]     (E, D, M)    expert e: gelu(x @ fc1_kernel[e] + fc1_bias[e])
# params["blocks"][i]["mlp"]["experts"]["fc1_bias"]       (E, M)                  @ fc2_kernel[e] + fc2_bias[e]
# params["blocks"][i]["mlp"]["experts"]["fc2_kernel"]     (E, M, D)
# params["blocks"][i]["mlp"]["experts"]["fc2_bias"]       (E, D)
# ```
#
# The cell below makes such trees from the library when it is installed (`library_vit`, every parameter drawn at
# random; `library_vmoe`, a fresh V-MoE as `VMoE(config, rngs=nnx.Rngs(seed))` initialises it), keeps your
# prediction as first written (`freeze`) and compares trees leaf by leaf (`tree_gap`).

# %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
import jax
import jax.numpy as jnp
import numpy as np

from moe_course.course.inside.notebook import predictions

freeze = predictions("08_upcycling.predictions.json")  # freeze(name, value): the first answer counts

rng = np.random.default_rng(0)
try:  # the course library: on your machine the visible tests compare with it; grading compares outside
    from flax import nnx

    from moe_course.configs.vit import ViTConfig
    from moe_course.configs.vmoe import VMoEConfig
    from moe_course.models import ViT, VMoE, upcycle
    LIBRARY = True
except ImportError:
    LIBRARY = False
SMALL = dict(image_size=8, patch_size=4, channels=3, width=12, depth=4, heads=3, mlp_dim=24, num_classes=5)


def library_vit(seed=0):
    """(a library ViT of the SMALL config, every parameter redrawn at random; its parameter tree as a dict)."""
    model = ViT(ViTConfig(**SMALL), rngs=nnx.Rngs(seed))
    draw = np.random.default_rng(seed)
    for _, param in nnx.iter_graph(model):
        if isinstance(param, nnx.Param):
            param[...] = jnp.asarray(0.5 * draw.normal(size=param.shape), param[...].dtype) + param[...]
    return model, nnx.to_pure_dict(nnx.state(model, nnx.Param))


def library_vmoe(seed=0, **fields):
    """(a fresh library V-MoE of the SMALL backbone, E = 4, MoE layers in every other block, ``fields`` changed,
    as ``VMoE(config, rngs=nnx.Rngs(seed))`` initialises it; its parameter tree as a dict)."""
    config = VMoEConfig(**{**SMALL, "num_experts": 4, "placement": "every-2", "group_size": 4, **fields})
    model = VMoE(config, rngs=nnx.Rngs(seed))
    return model, nnx.to_pure_dict(nnx.state(model, nnx.Param))


def with_params(model, tree):
    """``model`` (an nnx.Module) with its parameters replaced by the plain dict ``tree`` (its paths exactly)."""
    state = nnx.state(model, nnx.Param)
    nnx.replace_by_pure_dict(state, jax.tree.map(jnp.asarray, tree))
    nnx.update(model, state)
    return model


def tree_gap(mine, theirs):
    """The first path where two parameter trees differ (a missing or extra leaf, another shape, other values),
    as text; None where they are equal leaf by leaf."""
    paths = lambda tree: {jax.tree_util.keystr(p): leaf for p, leaf in jax.tree_util.tree_leaves_with_path(tree)}
    mine, theirs = paths(mine), paths(theirs)
    for path in sorted(set(mine) | set(theirs)):
        if path not in mine or path not in theirs:
            return f"{path}: {'missing' if path not in mine else 'not in the library tree'}"
        a, b = np.asarray(mine[path]), np.asarray(theirs[path])
        if a.shape != b.shape:
            return f"{path}: shape {a.shape}, expected {b.shape}"
        if not np.array_equal(a, b):
            return f"{path}: other values"
    return None


# %% [markdown]
# ## 1. Which blocks become MoE layers (2 points)
#
# A V-MoE config's `placement` says which blocks (counted from 0) get an MoE layer (V-MoE Sec. 2.2, SPEC
# "Placement"): `"every-2"` every other block, the odd ones (1, 3, 5, ...: the paper's upcycling for vision);
# `"last-n"` the last `last_n` of those odd blocks; `"second-half"` the blocks from `depth // 2` to the last.
# `moe_blocks(depth, placement, last_n)` returns them as a tuple of ints, in increasing order (plain Python: it is
# bookkeeping).

# %% nbgrader={"grade": false, "grade_id": "blocks_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def moe_blocks(depth, placement, last_n):
    ### BEGIN SOLUTION
    if placement == "second-half":
        return tuple(range(depth // 2, depth))
    odd = tuple(range(1, depth, 2))
    return odd if placement == "every-2" else odd[len(odd) - last_n:]
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "blocks_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
assert tuple(moe_blocks(8, "every-2", 2)) == (1, 3, 5, 7), "every-2 of 8 blocks: the odd ones"
assert tuple(moe_blocks(12, "last-n", 2)) == (9, 11), "V-MoE's Last-2 of 12 blocks"
assert tuple(moe_blocks(6, "second-half", 2)) == (3, 4, 5), "the second half of 6 blocks"
if LIBRARY:
    for depth in (3, 4, 7, 12):
        for placement in ("every-2", "last-n", "second-half"):
            config = VMoEConfig(depth=depth, placement=placement, moe_last_n=1)
            assert tuple(moe_blocks(depth, placement, 1)) == config.moe_blocks(), f"depth {depth}, {placement}"
    print("ok: moe_blocks equals the library's VMoEConfig.moe_blocks for 12 depths and placements")
else:
    print("ok: moe_blocks on 3 cases (grading compares it with the library)")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares with VMoEConfig.moe_blocks
_answers.record("blocks_tests", moe_blocks)
### END HIDDEN TESTS

# %% [markdown]
# ## 2. An expert's copies (2 points)
#
# vmoe upcycles a dense checkpoint with its `expand_tile` rule: a dense MLP array of shape `s` becomes an array of
# shape `(E, *s)` whose E entries along the new first axis are equal copies, one per expert -- the experts'
# stacked layout above. `expand_tile(array, num_experts)` does it in `jax.numpy` for an array of any shape.

# %% nbgrader={"grade": false, "grade_id": "tile_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def expand_tile(array, num_experts):
    ### BEGIN SOLUTION
    array = jnp.asarray(array)
    return jnp.repeat(array[None], num_experts, axis=0)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "tile_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
kernel = rng.normal(size=(6, 10)).astype(np.float32)
tiled = np.asarray(expand_tile(kernel, 3))
assert tiled.shape == (3, 6, 10), f"expected (E, 6, 10) = (3, 6, 10), got {tiled.shape}"
assert all(np.array_equal(tiled[e], kernel) for e in range(3)), "every expert's entry is the dense array itself"
assert np.asarray(expand_tile(np.arange(4.0), 2)).tolist() == [[0, 1, 2, 3], [0, 1, 2, 3]], "a bias: (E, M)"
print("ok: expand_tile gives E equal copies along a new first axis")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares with moe_course.models.upcycling
_answers.record("tile_tests", expand_tile)
### END HIDDEN TESTS

# %% [markdown]
# ## 3. Predict first (2 points)
#
# Before you write the upcycling (task 4), and without running anything. A dense ViT (4 blocks) is upcycled into
# five V-MoEs with E = 4 experts in blocks 1 and 3, routing groups of 4 images, evaluated without router noise.
# They differ only in their routing (Tokens Choice, the vanilla allocation of exercise 02):
#
# | | k | gate order | capacity ratio C |
# | --- | --- | --- | --- |
# | (a) | 1 | softmax, then TOP-k (V-MoE's) | 4 (B = k x tokens: no choice can be dropped) |
# | (b) | 1 | TOP-k, then a softmax over the chosen logits (Shazeer et al.'s) | 4 |
# | (c) | 2 | softmax, then TOP-k | 4 |
# | (d) | 4 | softmax, then TOP-k | 4 |
# | (e) | 1 | TOP-k, then softmax | 1 |
#
# Which of them compute exactly the dense ViT's logits (up to float rounding) on any images, whatever their
# router's random kernel? In the cell below, replace `raise NotImplementedError()` with `PREDICTED_EXACT = (..., ...,
# ..., ..., ...)`, five booleans for (a) to (e), True where the V-MoE keeps the dense function. The cell under it
# records your first answer in `08_upcycling.predictions.json` beside this notebook; the check after task 4
# reports a changed one (the first answer counts).

# %% nbgrader={"grade": false, "grade_id": "exact_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
### BEGIN SOLUTION
PREDICTED_EXACT = (False, True, False, True, False)
### END SOLUTION

# %% nbgrader={"grade": false, "grade_id": "exact_record", "locked": true, "schema_version": 3, "solution": false, "task": false}
print(freeze("PREDICTED_EXACT", globals().get("PREDICTED_EXACT")))

# %% [markdown]
# ## 4. The upcycled parameter tree (4 points)
#
# `upcycle_params(dense, fresh, blocks)` gets a dense ViT's tree `dense`, the tree `fresh` of a freshly initialised
# V-MoE with the same backbone, and its MoE blocks `blocks` (task 1's tuple), and returns the upcycled V-MoE's tree,
# a new nested dict with `fresh`'s paths, as `moe_course.models.upcycle` fills it (vmoe's rules): in every block of
# `blocks`, the experts' `fc1_kernel`, `fc1_bias`, `fc2_kernel`, `fc2_bias` are your `expand_tile` of that
# block's dense `mlp.fc1.kernel`, `mlp.fc1.bias`, `mlp.fc2.kernel`, `mlp.fc2.bias` (E = the router kernel's
# last axis), and the router keeps `fresh`'s kernel (the dense model has none: vmoe leaves the target's initial
# value where no rule fills it); every other parameter is the dense model's. Change neither input tree.

# %% nbgrader={"grade": false, "grade_id": "upcycle_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def upcycle_params(dense, fresh, blocks):
    ### BEGIN SOLUTION
    tree = jax.tree.map(jnp.asarray, dense)  # a new tree: every dense parameter carried over
    for i in blocks:
        router = fresh["blocks"][i]["mlp"]["router"]
        mlp = tree["blocks"][i]["mlp"]
        copies = {f"{layer}_{kind}": expand_tile(mlp[layer][kind], router["kernel"].shape[-1])
                  for layer in ("fc1", "fc2") for kind in ("kernel", "bias")}
        tree["blocks"][i]["mlp"] = {"router": {"kernel": jnp.asarray(router["kernel"])}, "experts": copies}
    return tree
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "upcycle_tests", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
if LIBRARY:
    dense_model, dense_params = library_vit()
    for seed, fields in ((1, {}), (2, {"placement": "last-n", "moe_last_n": 1, "num_experts": 3})):
        fresh_model, fresh_params = library_vmoe(seed, **fields)
        config = fresh_model.config
        mine = upcycle_params(dense_params, fresh_params, moe_blocks(config.depth, config.placement,
                                                                     config.moe_last_n))
        theirs = nnx.to_pure_dict(nnx.state(upcycle(dense_model, config, seed=seed), nnx.Param))
        gap = tree_gap(mine, theirs)
        assert gap is None, f"{config.placement}, E = {config.num_experts}: your tree differs from upcycle's at {gap}"
    assert tree_gap(dense_params, library_vit()[1]) is None, "upcycle_params changed the dense tree"
    print("ok: upcycle_params equals the library's upcycle leaf by leaf (every-2 with E = 4, last-1 with E = 3)")
else:
    print("the library is not installed here: grading compares upcycle_params with it")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares with moe_course.models.upcycle
_answers.record("upcycle_tests", upcycle_params)
### END HIDDEN TESTS

# %% [markdown]
# **The check of your prediction (task 3).** It upcycles one dense ViT with your `upcycle_params` into the five
# V-MoEs and runs them (the library's forward, where it is installed) beside the dense ViT on 8 images; your answer
# was recorded before you wrote task 4.

# %% nbgrader={"grade": true, "grade_id": "exact_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
print(freeze("PREDICTED_EXACT", PREDICTED_EXACT))
assert len(PREDICTED_EXACT) == 5 and all(isinstance(v, bool) for v in PREDICTED_EXACT), "five booleans, (a) to (e)"
ROUTINGS = {"a": dict(k=1, capacity_ratio=4.0), "b": dict(k=1, router_order="topk_then_softmax", capacity_ratio=4.0),
            "c": dict(k=2, capacity_ratio=4.0), "d": dict(k=4, capacity_ratio=4.0),
            "e": dict(k=1, router_order="topk_then_softmax", capacity_ratio=1.0)}
if LIBRARY:
    dense_model, dense_params = library_vit()
    images = jnp.asarray(rng.random((8, 8, 8, 3)), jnp.float32)
    want = np.asarray(dense_model(images, deterministic=True).logits)
    gaps = {}
    for name, fields in ROUTINGS.items():
        moe, fresh_params = library_vmoe(3, **fields)
        moe = with_params(moe, upcycle_params(dense_params, fresh_params, moe.config.moe_blocks()))
        gaps[name] = float(np.abs(np.asarray(moe(images, deterministic=True).logits) - want).max())
    assert tuple(PREDICTED_EXACT) == tuple(gap < 1e-4 for gap in gaps.values()), (
        "not what the five V-MoEs compute: with identical experts, what does a token's MLP output get multiplied by?")
    print("ok: your prediction is what the upcycled V-MoEs compute; largest logit difference from the dense ViT: "
          + ", ".join(f"({name}) {gap:.1e}" for name, gap in gaps.items()))
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader upcycles and runs the five with moe_course
_answers.record("exact_tests", lambda: tuple(bool(v) for v in PREDICTED_EXACT))
### END HIDDEN TESTS

# %% [markdown]
# ## 5. The optimizer's moments, carried (3 points)
#
# The paper continues training from the dense run's optimizer state for its vision models, and
# `moe_course.models.upcycle(dense, config, optimizer_state=...)` carries it as it carries the weights. An Adam
# moment (`mu` or `nu`) is a tree shaped like the dense parameters; in the V-MoE it must be shaped like the V-MoE's:
# the dense MLP's moments tiled to the experts (your `expand_tile`), the router's moments zeros (it has no
# history: shape (D, E), the dtype of the block's dense `fc1` kernel moment), every other moment copied (Adam's
# step count is copied too: its bias correction belongs to the carried moments). `upcycle_moments(moments,
# num_experts, blocks)` returns the V-MoE's moment tree for a dense moment tree `moments`, MoE blocks `blocks`
# and `num_experts` experts.

# %% nbgrader={"grade": false, "grade_id": "moments_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def upcycle_moments(moments, num_experts, blocks):
    ### BEGIN SOLUTION
    zero = {"blocks": {}}  # a "fresh" tree with only what upcycle_params reads: zero router kernels
    for i in blocks:
        fc1 = jnp.asarray(moments["blocks"][i]["mlp"]["fc1"]["kernel"])
        zero["blocks"][i] = {"mlp": {"router": {"kernel": jnp.zeros((fc1.shape[0], num_experts), fc1.dtype)}}}
    return upcycle_params(moments, zero, blocks)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "moments_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
if LIBRARY:
    import optax

    dense_model, dense_params = library_vit()
    moe, _ = library_vmoe(4)
    blocks = moe.config.moe_blocks()
    state = optax.adam(1e-3).init(nnx.state(dense_model, nnx.Param))
    state = jax.tree.map(lambda a: a + 0.1 if jnp.issubdtype(a.dtype, jnp.floating) else a + 1, state)  # one step
    carried = nnx.to_pure_dict(upcycle(dense_model, moe.config, seed=4, optimizer_state=state)[1][0].mu)
    gap = tree_gap(upcycle_moments(nnx.to_pure_dict(state[0].mu), moe.config.num_experts, blocks), carried)
    assert gap is None, f"your first moment differs from the one upcycle carries at {gap}"
    print("ok: upcycle_moments equals the moments the library's upcycle carries (Adam's mu)")
else:
    print("the library is not installed here: grading compares upcycle_moments with it")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares with moe_course.models.upcycling
_answers.record("moments_tests", upcycle_moments)
### END HIDDEN TESTS

# %% [markdown]
# ## 6. Debug: Experts Choice weights that keep the dense function (2 points)
#
# The paper's vision models route with Experts Choice (each expert takes its share of a group's tokens) and divide
# each token's combine weights by their sum over the experts that took it, so that, with identical experts, every
# token some expert took gets exactly the dense MLP's output at step 0 (chapter 8, section 2). `token_normalized(
# probs, taken)` below is meant to compute those weights: `probs` `(groups, tokens, E)` are the router
# probabilities, `taken` `(groups, tokens, E)` bool says which experts took which token; it returns `(groups,
# tokens, E)`: 0 where an expert did not take the token, and for each token the probabilities of the experts that
# took it divided by their sum (all 0 for a token no expert took). It runs and every shape is right, but it holds
# one bug. Run the test below it, find the bug and fix it in the cell.

# %% nbgrader={"grade": false, "grade_id": "normalized_debug", "locked": false, "schema_version": 3, "solution": true, "task": false}
### BEGIN HANDOUT
def token_normalized(probs, taken):
    weights = jnp.where(taken, probs, 0.0)  # the probabilities of the experts that took the token
    total = jnp.sum(weights, axis=1, keepdims=True)  # their sum
    return jnp.where(taken, weights / jnp.where(total > 0, total, 1.0), 0.0)
### END HANDOUT
### BEGIN SOLUTION
def token_normalized(probs, taken):
    weights = jnp.where(taken, probs, 0.0)  # the probabilities of the experts that took the token
    total = jnp.sum(weights, axis=-1, keepdims=True)  # their sum, over the experts (not over the tokens)
    return jnp.where(taken, weights / jnp.where(total > 0, total, 1.0), 0.0)
### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "normalized_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
# One group of 3 tokens and 2 experts that take 2 tokens each: token 0 is taken by both, token 2 by expert 1 alone.
probs = np.array([[[0.7, 0.3], [0.4, 0.6], [0.2, 0.8]]], np.float32)
taken = np.array([[[True, True], [True, False], [False, True]]])
weights = np.asarray(token_normalized(probs, taken))
assert weights.shape == (1, 3, 2), f"expected shape (1, 3, 2), got {weights.shape}"
assert (weights[~taken] == 0).all(), "an expert that did not take a token gives it no weight"
for token in range(3):
    total = weights[0, token].sum()
    assert np.isclose(total, 1.0), (f"token {token}'s weights sum to {total:.3f}: its upcycled MLP output would be "
                                    f"{total:.3f} x the dense MLP's")
print("ok: every token some expert took gets weights that sum to 1 (the dense MLP's output at step 0)")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares with moe_course.routing
_answers.record("normalized_tests", token_normalized)
### END HIDDEN TESTS

# %% [markdown]
# ## 7. Explain: a router that starts at zero (3 points, graded by the instructor)
#
# A colleague proposes to initialise the router kernel at ZERO instead of the fresh V-MoE's random kernel, "so that
# the upcycled model starts as close to the dense one as possible". The layer uses V-MoE's defaults: E = 8
# experts, k = 1 (TOP-1 after the softmax), capacity ratio C = 1.05, vanilla routing, ties broken towards the
# lower expert index. Without router noise (as at evaluation), what does the upcycled layer do with a group's N
# tokens -- which experts receive them, how many are dropped, what the layer outputs for a served and for a dropped
# token, compared with the dense MLP? Why does a small random kernel serve upcycling better, at step 0 and as
# training goes on? Answer in four to eight sentences, no code, in the cell below (replace `YOUR ANSWER HERE`).

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
