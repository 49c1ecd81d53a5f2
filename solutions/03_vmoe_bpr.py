# %% [markdown]
# # Assignment 3: your V-MoE with Batch Prioritized Routing, trained beside the library's
#
# Chapter 3 trained the library's V-MoE. Here you build your own in `jax.numpy` and train it: Batch Prioritized
# Routing (BPR, V-MoE Sec. 4.1, App. C Algorithm 2) as your allocation, your MoE layer with it, your V-MoE forward
# on the library's own parameter tree -- a `moe_course.models.VMoE` -- and your training step (the loss, `jax.grad`,
# an optax update). Your model must give the library's logits and auxiliary loss, and, trained from the same
# initial parameters on the same batches, the same loss curve to float rounding. On the way you predict which
# tokens BPR leaves without an expert before you write it, fix the routing groups of an evaluation, and explain
# which choices vanilla routing and BPR drop. 26 points: 24 graded automatically, 2 (task 9) by your instructor.
# Replace every `raise NotImplementedError()` with your code; the visible tests compare with the library on your
# machine, and further tests run when your notebook is graded (there the library is absent: write the JAX
# yourself).
#
# Work in your own copy: `moe-course exercise 03` puts it in `mywork/03_vmoe_bpr.ipynb`. Check it with
# `moe-course check mywork/03_vmoe_bpr.ipynb` (the visible tests, with the base install; from the repository's
# root or any folder in it).
#
# **The parameter tree.** `nnx.to_pure_dict(nnx.state(VMoE(config), nnx.Param))` is a dense ViT's tree (assignment
# 1) in which the blocks `config.moe_blocks()` hold a sparse MoE layer's tree (assignment 2) as their `"mlp"`:
#
# ```
# params["patch_embed"]["proj"]  {"kernel": (p, p, C, D), "bias": (D,)};  params["pos_embed"]  (1, T, D)
# params["cls_token"]  (1, 1, D)   only with pool="cls"; with pool="gap" the final tokens are averaged
# params["blocks"][i]["norm1" | "norm2"]  {"scale", "bias"};  ["attn"]["query" | "key" | "value" | "out"]
# params["blocks"][i]["mlp"]   a dense block:  {"fc1": {"kernel", "bias"}, "fc2": {"kernel", "bias"}}
#                              an MoE block:   {"router": {"kernel": (D, E)}, "experts": {"fc1_kernel": (E, D, H),
#                                               "fc1_bias": (E, H), "fc2_kernel": (E, H, D), "fc2_bias": (E, D)}}
# params["norm"]  {"scale", "bias"};  params["head"]  {"kernel": (D, K), "bias": (K,)}
# ```
#
# What the tree does not hold comes in `settings`, a plain dict: `heads`, `k`, `capacity_ratio`, `group_size`
# (images per routing group), `priority` (`"max"` or `"sum"`) and `aux_loss_weight`. The router draws no noise
# here (the configs below set `noise_std=0`, in training too), so a model is a deterministic function of its
# parameters. The first cell makes trees and settings from the library when it is installed; the second hands out
# the pieces of assignments 1 and 2 that you need (given code, a clean version).

# %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
import jax
import jax.numpy as jnp
import numpy as np
import optax

from moe_course.course.inside.notebook import close, predictions

freeze = predictions("03_vmoe_bpr.predictions.json")  # freeze(name, value): the first answer counts

rng = np.random.default_rng(0)
LEARNING_RATE = 1e-3
OPTIMIZER = optax.adam(LEARNING_RATE)  # the library's run below uses the same
try:  # the course library: on your machine the visible tests compare with it; grading compares outside
    from flax import nnx

    from moe_course.configs import get_preset
    from moe_course.models import VMoE
    LIBRARY = True
except ImportError:
    LIBRARY = False
TINY = dict(image_size=8, patch_size=4, channels=1, width=16, depth=2, heads=2, mlp_dim=32, num_classes=4, pool="gap",
            num_experts=4, k=2, capacity_ratio=1.0, placement="every-2", group_size=2, allocation="bpr", noise_std=0.0)


def settings_of(config):
    """The settings your functions take, from a library VMoEConfig."""
    names = ("heads", "k", "capacity_ratio", "group_size", "priority", "aux_loss_weight")
    return {name: getattr(config, name) for name in names}


def library_vmoe(seed=0, randomise=True, config=None, **fields):
    """(the library's VMoE of ``config`` -- by default TINY with ``fields`` changed -- with every parameter moved
    by a random draw when ``randomise``; its parameter tree as a plain dict; its settings)."""
    from moe_course.configs.vmoe import VMoEConfig

    model = VMoE(config or VMoEConfig(**{**TINY, **fields}), rngs=nnx.Rngs(seed))
    draw = np.random.default_rng(seed)
    for _, param in nnx.iter_graph(model) if randomise else ():
        if isinstance(param, nnx.Param):
            param[...] = jnp.asarray(0.3 * draw.normal(size=param.shape), param[...].dtype) + param[...]
    return model, nnx.to_pure_dict(nnx.state(model, nnx.Param)), settings_of(model.config)


# %% [markdown]
# **Given code** (assignments 1 and 2, clean versions): `layer_norm`, `self_attention`, `embed` (patches times the
# patch kernel, the class token where the tree has one, the position embeddings) and `dense_mlp` of a ViT;
# `top_k_gates` (`TOP_k(softmax(logits))`), `expert_capacity`, `apply_experts` (dispatch the served choices into
# the buffers, run every expert on its buffer, combine with the gates) and `importance_loss` of a sparse MoE layer.

# %% nbgrader={"grade": false, "grade_id": "given", "locked": true, "schema_version": 3, "solution": false, "task": false}
def layer_norm(x, p):
    mean = jnp.mean(x, axis=-1, keepdims=True)
    return (x - mean) / jnp.sqrt(jnp.var(x, axis=-1, keepdims=True) + 1e-6) * p["scale"] + p["bias"]


def self_attention(p, x, heads):
    b, t, d = x.shape
    q, k, v = ((x @ p[n]["kernel"] + p[n]["bias"]).reshape(b, t, heads, d // heads) for n in ("query", "key", "value"))
    maps = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q, k) / jnp.sqrt(d // heads), axis=-1)
    return jnp.einsum("bhqk,bkhd->bqhd", maps, v).reshape(b, t, d) @ p["out"]["kernel"] + p["out"]["bias"]


def embed(params, images):
    kernel = params["patch_embed"]["proj"]["kernel"]  # (p, p, C, D)
    (b, h, w, c), s = images.shape, kernel.shape[0]
    patches = images.reshape(b, h // s, s, w // s, s, c).transpose(0, 1, 3, 2, 4, 5).reshape(b, -1, s * s * c)
    x = patches @ kernel.reshape(-1, kernel.shape[-1]) + params["patch_embed"]["proj"]["bias"]
    if "cls_token" in params:
        x = jnp.concatenate([jnp.broadcast_to(params["cls_token"], (b, 1, x.shape[-1])), x], axis=1)
    return x + params["pos_embed"]


def dense_mlp(p, x):
    return jax.nn.gelu(x @ p["fc1"]["kernel"] + p["fc1"]["bias"], approximate=False) @ p["fc2"]["kernel"] + p["fc2"]["bias"]


def top_k_gates(logits, k):  # -> (expert_index, gates), both (groups, tokens, k), the largest first
    gates, expert_index = jax.lax.top_k(jax.nn.softmax(logits, axis=-1), k)
    return expert_index, gates


def expert_capacity(k, tokens, capacity_ratio, num_experts):  # slots per expert and group
    return max(1, int(k * tokens * capacity_ratio / num_experts + 0.5 + 1e-9))


def apply_experts(p, x, expert_index, slot, gates, capacity):  # p: an MoE block's ["mlp"]["experts"]
    where = jax.nn.one_hot(expert_index, p["fc1_kernel"].shape[0])[..., None] * jax.nn.one_hot(slot, capacity)[..., None, :]
    buffers = jnp.einsum("gtkeb,gtd->gebd", where, x)  # x (groups, tokens, D); where (groups, tokens, k, E, B)
    h = jax.nn.gelu(jnp.einsum("gebd,edh->gebh", buffers, p["fc1_kernel"]) + p["fc1_bias"][:, None], approximate=False)
    out = jnp.einsum("gebh,ehd->gebd", h, p["fc2_kernel"]) + p["fc2_bias"][:, None]
    return jnp.einsum("gtk,gtkeb,gebd->gtd", gates, where, out)  # dropped choices (slot -1) add nothing


def importance_loss(logits):  # L_imp of V-MoE App. A.2, averaged over the groups
    importance = jnp.sum(jax.nn.softmax(logits, axis=-1), axis=1)
    return jnp.mean(jnp.var(importance, axis=-1) / jnp.mean(importance, axis=-1) ** 2)


# %% [markdown]
# ## 1. Priority order (2 points)
#
# BPR serves the tokens the router is most sure about first. A token's priority score is its largest gate
# (`score="max"`, the paper's) or the sum of its k gates (`score="sum"`). `priority_order(gates, score)` gets the
# gates `(groups, tokens, k)` and returns `(groups, tokens)` int: for every group, the token indices from the
# highest score to the lowest, equal scores in group order (the lower token index first). In `jax.numpy`.

# %% nbgrader={"grade": false, "grade_id": "priority_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def priority_order(gates, score="max"):
    ### BEGIN SOLUTION
    scores = jnp.max(gates, axis=-1) if score == "max" else jnp.sum(gates, axis=-1)
    return jnp.argsort(-scores, axis=1, stable=True)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "priority_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
gates = np.array([[[0.2, 0.1], [0.5, 0.0], [0.2, 0.2]]], np.float32)
assert np.asarray(priority_order(gates, "max")).tolist() == [[1, 0, 2]], "highest max gate first, ties in group order"
assert np.asarray(priority_order(gates, "sum")).tolist() == [[1, 2, 0]], "by the sum of the gates"
print("ok: priority_order by max and by sum, ties in group order")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares with moe_course.routing's BPR order
_answers.record("priority_tests", priority_order)
### END HIDDEN TESTS

# %% [markdown]
# ## 2. Predict first (2 points)
#
# Before you write BPR's allocation (task 3; read its description first), and without running anything: one group
# of 6 tokens is routed with k = 2 to E = 3 experts, every expert holding 2 slots. Each token's choices (TOP-1,
# then TOP-2) and gates:
#
# | token | 0 | 1 | 2 | 3 | 4 | 5 |
# | --- | --- | --- | --- | --- | --- | --- |
# | TOP-1 expert, gate | 0, 0.50 | 0, 0.90 | 0, 0.60 | 0, 0.70 | 1, 0.40 | 1, 0.55 |
# | TOP-2 expert, gate | 1, 0.30 | 1, 0.05 | 2, 0.30 | 2, 0.20 | 2, 0.35 | 0, 0.30 |
#
# Under BPR with `score="max"`, how many of the 6 tokens get NO expert at all (both choices dropped)?
#
# In the cell below, replace `raise NotImplementedError()` with `PREDICTED_NO_EXPERT = <an integer>`. The cell
# under it records your first answer in `03_vmoe_bpr.predictions.json` beside this notebook; the check after task
# 3 reports a changed one (the first answer counts).

# %% nbgrader={"grade": false, "grade_id": "noexpert_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
### BEGIN SOLUTION
PREDICTED_NO_EXPERT = 1
### END SOLUTION

# %% nbgrader={"grade": false, "grade_id": "noexpert_record", "locked": true, "schema_version": 3, "solution": false, "task": false}
print(freeze("PREDICTED_NO_EXPERT", globals().get("PREDICTED_NO_EXPERT")))

# %% [markdown]
# ## 3. BPR's allocation, vectorised (4 points)
#
# V-MoE's Algorithm 2 fills the buffers in two nested loops: for i = 1..k, for every token in priority order (task
# 1), the token's TOP-i choice takes the next free slot of its expert, or is dropped when the expert's slots are
# full -- all TOP-1 choices before any TOP-2 choice. Write it without a Python loop over tokens: put every group's
# tokens into priority order (`jnp.take_along_axis`), lay their choices out K-major (all TOP-1 choices, then all
# TOP-2 ...), and a cumulative sum of the one-hot experts over that order gives each choice its position in its
# expert's buffer; then put the slots back into token order. `bpr_allocate(expert_index, gates, capacity,
# num_experts, score="max")` gets the choices and gates `(groups, tokens, k)` and returns the slots `(groups,
# tokens, k)` int, in token order: the choice's position in its expert's buffer, `0 .. capacity - 1`, or `-1`
# where it was dropped.

# %% nbgrader={"grade": false, "grade_id": "allocate_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def bpr_allocate(expert_index, gates, capacity, num_experts, score="max"):
    ### BEGIN SOLUTION
    groups, tokens, k = expert_index.shape
    order = priority_order(gates, score)  # (G, T): the token processed r-th
    in_order = jnp.take_along_axis(jnp.asarray(expert_index), order[..., None], axis=1)
    choices = jnp.swapaxes(in_order, 1, 2).reshape(groups, k * tokens)  # K-major
    one_hot = jax.nn.one_hot(choices, num_experts, dtype=jnp.int32)
    position = jnp.sum(jnp.cumsum(one_hot, axis=1) * one_hot, axis=-1) - 1
    slot = jnp.swapaxes(jnp.where(position < capacity, position, -1).reshape(groups, k, tokens), 1, 2)
    rank = jnp.argsort(order, axis=1)  # token -> its place in the order
    return jnp.take_along_axis(slot, rank[..., None], axis=1)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "allocate_tests", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
# 3 tokens, k = 2, 2 slots per expert: token 2 goes first (gate 0.8), then token 1, then token 0, whose TOP-1
# choice finds expert 0 full; every TOP-1 choice is placed before any TOP-2 choice.
slot = np.asarray(bpr_allocate(np.array([[[0, 1], [0, 1], [0, 2]]]), np.array([[[0.4, 0.1], [0.6, 0.3], [0.8, 0.1]]],
                                                                                np.float32), 2, 3))
assert slot.shape == (1, 3, 2), f"expected shape (1, 3, 2), got {slot.shape}"
assert slot.tolist() == [[[-1, 1], [1, 0], [0, 0]]], f"priority order, TOP-1 choices first: got {slot.tolist()}"
if LIBRARY:
    from moe_course.routing import batch_prioritized_allocation

    for score in ("max", "sum"):
        index = np.stack([rng.permutation(5)[:2] for _ in range(2 * 12)]).reshape(2, 12, 2)
        gates = -np.sort(-rng.dirichlet(np.ones(5), size=(2, 12)), axis=-1)[..., :2].astype(np.float32)
        theirs = jax.jit(lambda i, g: batch_prioritized_allocation(i, g, 3, 5, score=score).slot)(index, gates)
        close(jax.jit(lambda i, g: bpr_allocate(i, g, 3, 5, score))(index, gates), theirs, f"slots (score={score!r})", 0)
    print("ok: bpr_allocate serves in priority order, TOP-1 choices first, and equals the library's BPR")
else:
    print("ok: bpr_allocate serves in priority order, TOP-1 choices first (grading compares it with the library)")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares with moe_course.routing's BPR
_answers.record("allocate_tests", bpr_allocate)
### END HIDDEN TESTS

# %% [markdown]
# **The check of your prediction (task 2).** It routes the table's group with the library's BPR (where it is
# installed); your answer was recorded before you wrote task 3.

# %% nbgrader={"grade": true, "grade_id": "noexpert_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
print(freeze("PREDICTED_NO_EXPERT", PREDICTED_NO_EXPERT))
assert int(PREDICTED_NO_EXPERT) == PREDICTED_NO_EXPERT >= 0, "the prediction is a non-negative integer"
if LIBRARY:
    table_index = np.array([[[0, 1], [0, 1], [0, 2], [0, 2], [1, 2], [1, 0]]])
    table_gates = np.array([[[0.5, 0.3], [0.9, 0.05], [0.6, 0.3], [0.7, 0.2], [0.4, 0.35], [0.55, 0.3]]], np.float32)
    served = np.asarray(batch_prioritized_allocation(table_index, table_gates, 2, 3).served)
    assert PREDICTED_NO_EXPERT == int((~served.any(-1)).sum()), (
        "not what BPR does: follow the TOP-1 round in priority order, then the TOP-2 round")
    print("ok: your prediction is the number of tokens BPR leaves without an expert")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader routes with moe_course.routing's BPR
_answers.record("noexpert_tests", lambda: int(PREDICTED_NO_EXPERT))
### END HIDDEN TESTS

# %% [markdown]
# ## 4. Your MoE layer with BPR (3 points)
#
# `moe_layer(p, x, settings)` is a V-MoE block's MoE layer, as the library's `SparseMoE(..., allocation="bpr",
# noise_std=0)` computes it: `p` is the block's `["mlp"]` tree, tokens `x` `(batch, tokens, D)` are cut into
# routing groups of `settings["group_size"]` images, `(batch / group_size, group_size * tokens, D)`; the router's
# logits are `groups @ p["router"]["kernel"]`; then the given `top_k_gates` (k = `settings["k"]`), the given
# `expert_capacity` for the group's tokens, your `bpr_allocate` (score `settings["priority"]`) and the given
# `apply_experts`. Return `(output, served, aux_loss)`: the output `(batch, tokens, D)`, `served` `(groups, group
# tokens, k)` bool (True where the choice got a slot), and `aux_loss = settings["aux_loss_weight"] * 0.5 *
# importance_loss(logits)` -- without router noise the load loss is undefined, so the layer keeps the importance
# term alone at its share of V-MoE's `0.5 L_imp + 0.5 L_load`, as google-research/vmoe does.

# %% nbgrader={"grade": false, "grade_id": "layer_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def moe_layer(p, x, settings):
    ### BEGIN SOLUTION
    batch, tokens, width = x.shape
    groups = x.reshape(batch // settings["group_size"], settings["group_size"] * tokens, width)
    logits = groups @ p["router"]["kernel"]
    num_experts = logits.shape[-1]
    expert_index, gates = top_k_gates(logits, settings["k"])
    capacity = expert_capacity(settings["k"], groups.shape[1], settings["capacity_ratio"], num_experts)
    slot = bpr_allocate(expert_index, gates, capacity, num_experts, settings["priority"])
    output = apply_experts(p["experts"], groups, expert_index, slot, gates, capacity).reshape(batch, tokens, width)
    return output, slot >= 0, settings["aux_loss_weight"] * 0.5 * importance_loss(logits)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "layer_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
if LIBRARY:
    for fields in ({}, {"k": 1, "capacity_ratio": 0.5, "priority": "sum"}):
        model, params, settings = library_vmoe(**fields)
        x = rng.normal(size=(4, 4, TINY["width"])).astype(np.float32)
        output, served, aux = jax.jit(lambda p, x: moe_layer(p, x, settings))(params["blocks"][1]["mlp"], x)
        theirs = nnx.jit(lambda layer, x: layer(x))(model.blocks[1].mlp, jnp.asarray(x))
        close(served, theirs.routing.served, f"served choices ({fields})", 0)
        close(output, theirs.output, f"output ({fields})", 1e-4)
        close(aux, theirs.aux_loss, f"aux loss ({fields})", 1e-6)
    print("ok: moe_layer equals the library's SparseMoE with BPR: the outputs, the dropped choices and the aux loss")
else:
    print("the library is not installed here: grading compares moe_layer with it")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares with moe_course.layers.SparseMoE
_answers.record("layer_tests", moe_layer)
### END HIDDEN TESTS

# %% [markdown]
# ## 5. Your V-MoE (5 points)
#
# `vmoe_forward(params, images, settings)` is the whole model of the tree above, as `VMoE(config)(images)`
# computes it: the given `embed`; then every block `i` of `params["blocks"]` (in order 0, 1, ...), pre-LN: `x = x +
# self_attention(norm1(x))`, then `x = x + mlp(norm2(x))`, where the MLP is your `moe_layer` in a block whose tree
# has a `"router"` (the blocks `config.moe_blocks()`) and the given `dense_mlp` in the others; the final LayerNorm;
# the class token's output (pool="cls": the tree has `"cls_token"`) or the mean of the tokens (pool="gap"); the
# head. Return `(logits, aux_loss)`: the logits `(batch, classes)` and the model's aux loss, the mean of its MoE
# layers' aux losses.

# %% nbgrader={"grade": false, "grade_id": "forward_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def vmoe_forward(params, images, settings):
    ### BEGIN SOLUTION
    x, aux = embed(params, images), []
    for i in range(len(params["blocks"])):
        block = params["blocks"][i]
        x = x + self_attention(block["attn"], layer_norm(x, block["norm1"]), settings["heads"])
        h = layer_norm(x, block["norm2"])
        if "router" in block["mlp"]:
            h, _, layer_aux = moe_layer(block["mlp"], h, settings)
            aux.append(layer_aux)
        else:
            h = dense_mlp(block["mlp"], h)
        x = x + h
    x = layer_norm(x, params["norm"])
    pooled = x[:, 0] if "cls_token" in params else jnp.mean(x, axis=1)
    return pooled @ params["head"]["kernel"] + params["head"]["bias"], sum(aux) / len(aux)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "forward_tests", "locked": true, "points": 5, "schema_version": 3, "solution": false, "task": false}
images = rng.random(size=(4, 8, 8, 1)).astype(np.float32)
if LIBRARY:
    for fields in ({}, {"pool": "cls", "depth": 4, "placement": "last-n", "moe_last_n": 1}):
        model, params, settings = library_vmoe(**fields)
        logits, aux = jax.jit(lambda p, x: vmoe_forward(p, x, settings))(params, images)
        theirs = nnx.jit(lambda m, x: m(x))(model, jnp.asarray(images))
        close(logits, theirs.logits, f"logits ({fields})", 1e-4)
        close(aux, theirs.aux_loss, f"aux loss ({fields})", 1e-6)
    print("ok: vmoe_forward equals the library's VMoE: the logits and the aux loss")
else:
    print("the library is not installed here: grading compares vmoe_forward with it")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares with moe_course.models.VMoE
_answers.record("forward_tests", vmoe_forward)
### END HIDDEN TESTS

# %% [markdown]
# ## 6. The training loss (2 points)
#
# `loss_fn(params, images, labels, settings)` is what the library's training step minimises for a V-MoE
# (`moe_course.train.objectives`): the mean softmax cross-entropy of your logits against the integer `labels`
# `(batch,)` plus the model's aux loss (already weighted). A JAX scalar: `jax.grad` differentiates it in task 8
# (`jax.nn.log_softmax` of the logits, at each label).

# %% nbgrader={"grade": false, "grade_id": "loss_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def loss_fn(params, images, labels, settings):
    ### BEGIN SOLUTION
    logits, aux = vmoe_forward(params, images, settings)
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(log_probs, labels[:, None], axis=1)) + aux
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "loss_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
labels = rng.integers(0, TINY["num_classes"], size=4).astype(np.int32)
if LIBRARY:
    from moe_course.train.objectives import CLASSIFICATION

    model, params, settings = library_vmoe()
    objective = nnx.jit(lambda m, x, y: sum(CLASSIFICATION.loss(m, {"image": x, "label": y}, nnx.Rngs(0))[:2]))
    theirs = objective(model, jnp.asarray(images), jnp.asarray(labels))
    close(jax.jit(lambda p, x, y: loss_fn(p, x, y, settings))(params, images, labels), theirs, "loss", 1e-5)
    print("ok: loss_fn equals the library's training objective (cross-entropy + aux loss)")
else:
    print("the library is not installed here: grading compares loss_fn and its gradient with it")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares the loss and jax.grad of it with the library
_answers.record("loss_tests", loss_fn)
### END HIDDEN TESTS

# %% [markdown]
# ## 7. Debug: routing groups for an evaluation (2 points)
#
# A V-MoE routes a group of images together, so which images share a group matters at evaluation too.
# `evaluation_groups(labels, group_size, seed)` below is meant to cut a split of `len(labels)` images into the
# routing groups the course's evaluation uses: `(groups, group_size)` image indices, the images taken in the order
# in which `moe_course.data.base.eval_batches(dataset, split, batch_size, order_seed=seed)` walks a split (the
# order `evaluate` uses), a last incomplete group left out. It runs and returns the right shape, but it holds one
# bug, a failure mode chapter 3 describes (it costs the chapter's V-MoE about three points of accuracy). Run the
# test below it, find the bug and fix it in the cell. Task 8 evaluates your trained V-MoE in these groups.

# %% nbgrader={"grade": false, "grade_id": "order_debug", "locked": false, "schema_version": 3, "solution": true, "task": false}
### BEGIN HANDOUT
def evaluation_groups(labels, group_size, seed):
    n = len(labels)
    order = np.arange(n)  # the split's images
    usable = n - n % group_size  # a last incomplete group is left out
    return order[:usable].reshape(-1, group_size)
### END HANDOUT
### BEGIN SOLUTION
def evaluation_groups(labels, group_size, seed):
    n = len(labels)
    order = np.random.default_rng([seed, 0xE7A1]).permutation(n)  # the evaluation's fixed shuffled order
    usable = n - n % group_size  # a last incomplete group is left out
    return order[:usable].reshape(-1, group_size)
### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "evaluation_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
stored = np.repeat(np.arange(4), 8)  # a test split stored sorted by class, as the digits' is: 4 classes x 8
groups = evaluation_groups(stored, 8, 0)
assert groups.shape == (4, 8), f"expected 4 groups of 8, got {groups.shape}"
assert sorted(groups.ravel().tolist()) == list(range(32)), "every image once"
classes = [len(set(stored[group].tolist())) for group in groups]
assert min(classes) > 1, f"classes per group: {classes} -- a group of one class wants the same experts"
print(f"ok: evaluation_groups mixes the classes: {classes} classes in the 4 groups")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares with moe_course.data.base.eval_batches
_answers.record("evaluation_tests", evaluation_groups)
### END HIDDEN TESTS

# %% [markdown]
# ## 8. Your training step, and your V-MoE trained beside the library's (4 points)
#
# `train_step(params, opt_state, images, labels, settings)` is one step of training: the value and the gradient
# of your `loss_fn` with respect to `params` (`jax.value_and_grad`), then the given `OPTIMIZER`'s update
# (`OPTIMIZER.update(grads, opt_state, params)`, `optax.apply_updates`). Return `(new params, new opt_state,
# loss)`, the loss of the parameters the step started from. It must be traceable: it is run under `jax.jit`.
#
# The test below trains your V-MoE on chapter 3's digits (`digits-tiny-moe` with BPR, no router noise) beside the
# library's -- the same initial parameters, the same 300 batches of 64 images, the library's own compiled training
# step (`moe_course.train.steps.make_train_step`) with the same optimizer -- and prints how far apart the two loss
# curves are, and the test accuracy of your trained model (in your task 7's groups) beside that of the dense ViT of
# matched compute (MLP 192), trained on the same batches (the whole check takes one to two minutes on two cores). Grading
# runs your step on a tiny model and compares every step's loss with the library's. Float rounding differs between
# your operations and the library's, and training amplifies it: over the first 100 steps the curves must agree to
# 1e-3; later they drift further apart, which is not a bug. 300 steps of 64 are an eighth of chapter 3's images
# (1,200 steps of 128): the models have left chance (0.1) but are far from done, and one seed of each is no
# comparison -- the accuracies say where your run is, not which model is better.

# %% nbgrader={"grade": false, "grade_id": "step_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def train_step(params, opt_state, images, labels, settings):
    ### BEGIN SOLUTION
    with_gradient = jax.value_and_grad(loss_fn)  # d loss / d params (the first argument), as the same tree
    loss, grads = with_gradient(params, images, labels, settings)
    update = OPTIMIZER.update(grads, opt_state, params)  # (the change of every parameter, the new state)
    new_params = jax.tree.map(jnp.add, params, update[0])
    return new_params, update[1], loss
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "train_tests", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
if LIBRARY:
    from moe_course.data import ClutteredDigits
    from moe_course.data.base import train_batches
    from moe_course.models import ViT
    from moe_course.train.steps import make_train_step

    def library_run(model, batches):
        """The library's training: its compiled step from ``model``'s parameters; (model, losses)."""
        graphdef, state, rest = nnx.split(model, nnx.Param, ...)
        step, opt_state, losses = make_train_step(graphdef, OPTIMIZER), OPTIMIZER.init(state), []
        for batch in batches:
            state, opt_state, metrics = step(state, rest, opt_state, batch, jax.random.key(0))
            losses.append(float(metrics["loss"]))
        return nnx.merge(graphdef, state, rest), np.array(losses)

    digits = ClutteredDigits()
    stream = train_batches(digits, 64, seed=0)
    batches = [{"image": b["image"], "label": b["label"]} for b, _ in zip(stream, range(300))]
    config = get_preset("vmoe", "digits-tiny-moe").replace(allocation="bpr", noise_std=0.0)
    theirs, params, settings = library_vmoe(config=config, randomise=False)
    step, opt_state, losses = jax.jit(lambda p, s, x, y: train_step(p, s, x, y, settings)), OPTIMIZER.init(params), []
    for batch in batches:
        params, opt_state, loss = step(params, opt_state, batch["image"], batch["label"])
        losses.append(float(loss))
    theirs, their_losses = library_run(theirs, batches)
    dense, _ = library_run(ViT(get_preset("vit", "digits-tiny").replace(mlp_dim=192), rngs=nnx.Rngs(0)), batches)
    gaps = np.abs(np.array(losses) - their_losses)
    assert gaps[:100].max() < 1e-3, f"your loss curve leaves the library's: {gaps[:100].max():.3g} apart"
    test = digits.get("test", evaluation_groups(digits.get("test", np.arange(1050))["label"], 8, 0).ravel())
    mine = float(np.mean(np.argmax(jax.jit(lambda p, x: vmoe_forward(p, x, settings)[0])(params, test["image"]), -1)
                         == test["label"]))
    dense_accuracy = float(np.mean(np.argmax(dense(jnp.asarray(test["image"])).logits, -1) == test["label"]))
    print(f"ok: 300 steps beside the library's V-MoE, loss {losses[0]:.3f} -> {losses[-1]:.3f}, the two curves at most "
          f"{gaps[:100].max():.2g} apart over the first 100 steps and {gaps.max():.2g} over all; test accuracy: your "
          f"V-MoE {mine:.3f}, the dense ViT {dense_accuracy:.3f}")
else:
    print("the library is not installed here: grading trains your step beside the library's")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader trains the library's VMoE with the same optimizer
_answers.record("train_tests", (train_step, OPTIMIZER.init))
### END HIDDEN TESTS

# %% [markdown]
# ## 9. Explain: which choices are dropped (2 points, graded by the instructor)
#
# At a capacity ratio C = 0.5 about half of the choices in a group find no slot, with vanilla routing and with BPR
# alike. Which choices does each of them drop, and why does the trained V-MoE of chapter 3 keep far more of its
# accuracy with BPR's drops than with vanilla's? Answer in three to six sentences in the cell below (replace `YOUR
# ANSWER HERE`).

# %% [markdown] nbgrader={"grade": true, "grade_id": "drops_explain", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# Vanilla routing fills the buffers in the group's token order, so it drops the choices of whichever tokens
# come last -- the last images of the group and the bottom patches of each image -- whatever they hold. BPR
# sorts the choices by priority, the router's largest gate, and drops the least confident ones first. The
# router is most confident on the patches that matter (on the digit: chapter 3 section 3 draws them) and least
# on background, so BPR's dropped tokens carry little of the class; the residual path carries every dropped
# token on unchanged, so dropping background costs little, while vanilla also drops whole informative images.
#
# Rubric (2 points): 1 point for the two orders (vanilla: position in the group; BPR: lowest priority score /
# gate first); 1 point for why BPR costs less: its drops are the uninformative (background) patches the router
# is unsure about, while vanilla's fall on whatever comes last, informative or not. Mentioning the residual
# path is good but not needed; 0 for "BPR drops fewer tokens" (at the same C both drop about the same number).
# ### END SOLUTION
