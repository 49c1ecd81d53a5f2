# %% [markdown]
# # Assignment 7: your expert-parallel MoE layer, in JAX
#
# With expert parallelism (V-MoE Sec. 2.4 and App. B, after GShard) the E experts of an MoE layer are split
# over the n devices of a mesh's `expert` axis, E / n each, while every device holds different images. Each
# device routes its own groups and fills one capacity-padded buffer per expert, `(g, E, B, D)`: g routing groups,
# E experts, B slots, width D. An **all-to-all** sends every expert's buffers to the device that holds that
# expert; the experts run there; a second all-to-all brings the outputs back to the devices that own the tokens.
#
# Here you write that in `jax.numpy` on 4 CPU devices: the two exchanges as `jax.lax.all_to_all` calls, then the
# whole layer inside `jax.shard_map`, which must equal the one-device layer given below (and the library's
# expert-parallel `SparseMoE`). You also predict the traffic of a new mesh and layer, fix a byte count that is
# wrong, and explain how you would lay out a mesh over two hosts. 14 points: 12 graded automatically, 2 (task 5)
# by your instructor. Replace every `raise NotImplementedError()` with your code; the visible tests compare with
# the library on your machine, and further tests run when your notebook is graded (there the library is absent).
#
# Work in your own copy: `moe-course exercise 07` puts it in `mywork/07_scale.ipynb`. Check it with
# `moe-course check mywork/07_scale.ipynb` (the visible tests, with the base install; from the repository's root
# or any folder in it).
#
# **Four devices.** JAX fixes its devices when it starts, so the cell below asks for 4 CPU devices before JAX
# runs anything: run it first, on a fresh kernel (after a restart, if JAX already ran in this kernel).

# %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
import math
import os
import sys
import warnings

if "jax" not in sys.modules:  # before JAX starts; added to flags already set, not replacing them
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=4".strip()
    os.environ["JAX_PLATFORMS"] = "cpu"
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec as P

from moe_course.course.inside.notebook import predictions

freeze = predictions("07_scale.predictions.json")  # freeze(name, value): the first answer counts

try:  # JAX imported but not started yet (the grading kernel): the same request
    jax.config.update("jax_num_cpu_devices", 4)
except RuntimeError:  # started already: too late (the line printed below says what to do)
    pass
CPUS = jax.devices("cpu")
EXPERT = "expert"  # the mesh axis the experts are split over
MESH = Mesh(np.array(CPUS[:4]), (EXPERT,)) if len(CPUS) >= 4 else None
FEW_DEVICES = (f"JAX started with {len(CPUS)} CPU device(s) before this notebook could ask for 4: restart the "
               "kernel and run the notebook from the top")
print(f"{len(CPUS)} CPU devices; the mesh:", MESH if MESH is not None else FEW_DEVICES)
rng = np.random.default_rng(0)
try:  # the course library: on your machine the visible tests compare with it; grading compares outside
    from flax import nnx

    from moe_course import parallel
    from moe_course.layers import SparseMoE
    LIBRARY = True
except ImportError:
    LIBRARY = False


def on_devices(function, per_device):
    """``function`` run on each of the 4 devices (inside ``jax.shard_map`` over the expert axis) on its own
    ``per_device[d]``; ``per_device`` is ``(4, ...)``, and so is the result."""
    assert MESH is not None, FEW_DEVICES
    run = jax.shard_map(lambda local: function(local[0])[None], mesh=MESH, in_specs=P(EXPERT), out_specs=P(EXPERT))
    return np.asarray(jax.jit(run)(jnp.asarray(per_device)))


# %% [markdown]
# **The one-device layer (given).** Assignment 2's sparse MoE layer, as the library's `SparseMoE(...,
# allocation="vanilla")` computes it in evaluation, in four pieces you will reuse. `params` is a layer's parameter
# tree, `nnx.to_pure_dict(nnx.state(layer, nnx.Param))`: `params["router"]["kernel"]` `(D, E)` and
# `params["experts"]` with `fc1_kernel` `(E, D, H)`, `fc1_bias` `(E, H)`, `fc2_kernel` `(E, H, D)`, `fc2_bias`
# `(E, D)`. `route` gives each token's k choices, their gates and slots (`-1`: dropped) and the capacity B;
# `dispatch` fills the buffers `(groups, E, B, D)`; `experts` runs expert e on axis 1's entry e of any buffers
# (so it also runs E / n experts on `(n * g, E / n, B, D)`); `combine` sums each token's gated outputs.

# %% nbgrader={"grade": false, "grade_id": "given", "locked": true, "schema_version": 3, "solution": false, "task": false}
def route(kernel, groups, k, capacity_ratio):
    """groups (G, T, D) -> expert_index, gates, slot (G, T, k) and the capacity B: TOP-k after the softmax,
    B = round(k T C / E), every TOP-1 choice placed before any TOP-2 choice (vanilla allocation)."""
    probs = jax.nn.softmax(groups @ kernel, axis=-1)
    gates, expert_index = jax.lax.top_k(probs, k)
    g, t, e = probs.shape
    capacity = max(1, math.floor(k * t * capacity_ratio / e + 0.5 + 1e-9))
    chosen = jax.nn.one_hot(jnp.swapaxes(expert_index, 1, 2).reshape(g, k * t), e, dtype=jnp.int32)
    position = jnp.sum(jnp.cumsum(chosen, axis=1) * chosen, axis=-1) - 1  # place in the expert's buffer
    slot = jnp.swapaxes(jnp.where(position < capacity, position, -1).reshape(g, k, t), 1, 2)
    return expert_index, gates, slot, capacity


def _where(expert_index, slot, num_experts, capacity):  # (G, T, k, E, B): 1 at each served choice's slot
    return jnp.einsum("gtke,gtkb->gtkeb", jax.nn.one_hot(expert_index, num_experts), jax.nn.one_hot(slot, capacity))


def dispatch(groups, expert_index, slot, num_experts, capacity):  # -> buffers (G, E, B, D)
    return jnp.einsum("gtkeb,gtd->gebd", _where(expert_index, slot, num_experts, capacity), groups)


def combine(outputs, expert_index, slot, gates):  # outputs (G, E, B, D) -> (G, T, D)
    where = _where(expert_index, slot, outputs.shape[1], outputs.shape[2])
    return jnp.einsum("gtkeb,gtk,gebd->gtd", where, gates, outputs)


def experts(p, buffers):  # p: params["experts"] (leading axis E); buffers (..., E, B, D)
    h = jax.nn.gelu(jnp.einsum("...ebd,edh->...ebh", buffers, p["fc1_kernel"]) + p["fc1_bias"][:, None], False)
    return jnp.einsum("...ebh,ehd->...ebd", h, p["fc2_kernel"]) + p["fc2_bias"][:, None]


def moe_layer(params, x, k, capacity_ratio, group_size):
    """x (batch, tokens, D) in routing groups of group_size images -> the layer's output (batch, tokens, D)."""
    batch, tokens, width = x.shape
    groups = x.reshape(batch // group_size, group_size * tokens, width)
    kernel = params["router"]["kernel"]
    expert_index, gates, slot, capacity = route(kernel, groups, k, capacity_ratio)
    buffers = dispatch(groups, expert_index, slot, kernel.shape[1], capacity)
    return combine(experts(params["experts"], buffers), expert_index, slot, gates).reshape(x.shape)


def random_layer(draw, width=8, hidden=16, num_experts=8):
    """A drawn parameter tree of the layer above (the router scaled so that some experts are popular)."""
    normal = lambda *shape: draw.normal(size=shape).astype(np.float32)  # noqa: E731
    return {"router": {"kernel": 1.5 * normal(width, num_experts) / np.sqrt(width, dtype=np.float32)},
            "experts": {"fc1_kernel": normal(num_experts, width, hidden) / np.sqrt(width, dtype=np.float32),
                        "fc1_bias": 0.3 * normal(num_experts, hidden),
                        "fc2_kernel": normal(num_experts, hidden, width) / np.sqrt(hidden, dtype=np.float32),
                        "fc2_bias": 0.3 * normal(num_experts, width)}}


# %% [markdown]
# ## 1. The two exchanges (3 points)
#
# Inside `jax.shard_map` over the mesh's `expert` axis (named `EXPERT` above) of n devices, device i holds
# `buffers` `(g, E, B, D)`: its g groups' buffers for all E experts. Device j holds experts `j * E/n ... (j+1) *
# E/n - 1`.
#
# - `to_experts(buffers)`: `(g, E, B, D) -> (n * g, E/n, B, D)`. Cut the expert axis into n blocks, send block j
#   to device j, stack what arrives along the group axis: device j ends up with every device's groups, but only
#   for its own experts (source device i in rows `i*g ... (i+1)*g - 1`).
# - `to_owners(inbox)`: the way back, `(n * g, E/n, B, D) -> (g, E, B, D)`, so that `to_owners(to_experts(b))`
#   equals `b`.
#
# Each is one call of `jax.lax.all_to_all(x, axis_name, split_axis, concat_axis, tiled=True)`: which axis is
# cut, which is joined? (The test runs them on the 4 devices with `on_devices`, given above.)

# %% nbgrader={"grade": false, "grade_id": "exchange_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def to_experts(buffers):
    ### BEGIN SOLUTION
    return jax.lax.all_to_all(buffers, EXPERT, split_axis=1, concat_axis=0, tiled=True)
    ### END SOLUTION


def to_owners(inbox):
    ### BEGIN SOLUTION
    return jax.lax.all_to_all(inbox, EXPERT, split_axis=0, concat_axis=1, tiled=True)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "exchange_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
buffers = rng.normal(size=(4, 2, 8, 3, 5)).astype(np.float32)  # 4 devices, g=2 groups, E=8 experts, B=3, D=5
inbox = on_devices(to_experts, buffers)
assert inbox.shape == (4, 8, 2, 3, 5), f"expected (4, 8, 2, 3, 5) (devices, n*g, E/n, B, D), got {inbox.shape}"
assert np.array_equal(inbox[3, 2:4], buffers[1][:, 6:8]), "device 3 holds experts 6-7; device 1's groups in rows 2-3"
assert np.array_equal(on_devices(to_owners, inbox), buffers), "to_owners undoes to_experts"
print("ok: to_experts sends each expert block to its device; to_owners brings it back (4 devices)")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares the outputs with moe_course.parallel
_answers.record("exchange_tests", (to_experts, to_owners))
### END HIDDEN TESTS

# %% [markdown]
# ## 2. Your expert-parallel layer (4 points)
#
# `expert_parallel_layer(params, x, k, capacity_ratio, group_size, mesh)` is `moe_layer` with the experts split
# over the n devices of `mesh`'s `expert` axis. Wrap a per-device function in `jax.shard_map(f, mesh=mesh,
# in_specs=..., out_specs=...)`: the images `x` `(batch, tokens, D)` split over the devices (`P(EXPERT)`: axis 0
# cut into n), the router's kernel whole on every device (`P()`), and every array of `params["experts"]` split
# along its expert axis (`P(EXPERT)`: device j gets experts `j*E/n ... (j+1)*E/n - 1`). On each device: cut its
# images into routing groups of `group_size` images, `route`, `dispatch` (all E experts), `to_experts`, run the
# local experts (`experts` with the device's share of the parameters), `to_owners`, `combine`; the output comes
# back split as `x` is. It must equal `moe_layer(params, x, ...)`: the same groups, the same dropped choices.

# %% nbgrader={"grade": false, "grade_id": "layer_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def expert_parallel_layer(params, x, k, capacity_ratio, group_size, mesh):
    ### BEGIN SOLUTION
    def per_device(kernel, local_experts, images):  # images (batch / n, tokens, D); local_experts: E / n of them
        batch, tokens, width = images.shape
        groups = images.reshape(batch // group_size, group_size * tokens, width)
        expert_index, gates, slot, capacity = route(kernel, groups, k, capacity_ratio)
        buffers = dispatch(groups, expert_index, slot, kernel.shape[1], capacity)  # (g, E, B, D)
        outputs = to_owners(experts(local_experts, to_experts(buffers)))  # there, the local experts, back
        return combine(outputs, expert_index, slot, gates).reshape(images.shape)

    run = jax.shard_map(per_device, mesh=mesh, in_specs=(P(), P(EXPERT), P(EXPERT)), out_specs=P(EXPERT))
    return run(params["router"]["kernel"], params["experts"], x)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "layer_tests", "locked": true, "points": 4, "schema_version": 3, "solution": false, "task": false}
assert MESH is not None, FEW_DEVICES
for k, ratio, group_size in ((2, 1.0, 2), (1, 0.5, 1)):
    params, x = random_layer(rng), rng.normal(size=(16, 6, 8)).astype(np.float32)  # 16 images of 6 tokens
    mine = jax.jit(lambda p, x: expert_parallel_layer(p, x, k, ratio, group_size, MESH))(params, x)
    gap = float(np.abs(np.asarray(mine) - np.asarray(moe_layer(params, x, k, ratio, group_size))).max())
    assert gap < 1e-5, f"k = {k}, C = {ratio}: your layer differs from the one-device layer by {gap:.3g}"
    if LIBRARY:  # the library's SparseMoE on the same parameters, expert-parallel over the same 4 devices
        layer = SparseMoE(8, 16, 8, k=k, capacity_ratio=ratio, group_size=group_size, allocation="vanilla",
                          rngs=nnx.Rngs(0))
        state = nnx.state(layer, nnx.Param)
        nnx.replace_by_pure_dict(state, jax.tree.map(jnp.asarray, params))
        nnx.update(layer, state)
        parallel.shard_model(layer, parallel.make_mesh("expert=4", devices=CPUS[:4]))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a capacity that rounds
            theirs = nnx.jit(lambda m, x: m(x).output)(layer, jnp.asarray(x))
        gap = float(np.abs(np.asarray(mine) - np.asarray(theirs)).max())
        assert gap < 1e-5, f"k = {k}, C = {ratio}: your layer differs from the library's by {gap:.3g}"
print("ok: expert_parallel_layer on 4 devices equals the one-device layer"
      + (" and the library's expert-parallel SparseMoE" if LIBRARY else " (grading compares it with the library)"))
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares with moe_course.layers.SparseMoE
_answers.record("layer_tests", expert_parallel_layer)
### END HIDDEN TESTS

# %% [markdown]
# ## 3. Predict first (2 points)
#
# Every buffer is padded to B slots, full or not, so the traffic does not depend on the routing. On a mesh of
# `data x expert` devices (`data` rows, `expert` devices per row), the routing groups of a batch are split
# evenly over all the devices, the experts over the `expert` devices of a row, and a device exchanges only with
# its own row; the forward pass of an MoE layer exchanges twice (there and back). Every expert's buffer has
# `B = round(k * tokens_per_group * C / E)` slots (a half rounds up; at least 1), as in `route`.
#
# A layer of 16 experts with k = 2 and C = 1, groups of 64 tokens, width 64, runs on one row of 8 devices
# (`data=1, expert=8`), 16 groups in a batch. Now change two things: the same 8 devices become a mesh `data=2,
# expert=4`, and the layer runs with k = 1 and C = 1.25 (the batch stays 16 groups). By what factor does the
# number of bytes EACH device sends per MoE layer change (new divided by old)? Write it (to 3 decimals) NOW,
# before task 4: the check after task 4 computes it with the byte count you fix there.
#
# In the cell below, replace `raise NotImplementedError()` with `PREDICTED_RATIO = your number`. The cell under
# it records your first answer in `07_scale.predictions.json` beside this notebook; the check after task 4
# reports a changed one (the first answer counts).

# %% nbgrader={"grade": false, "grade_id": "mesh_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
### BEGIN SOLUTION
PREDICTED_RATIO = 0.536
### END SOLUTION

# %% nbgrader={"grade": false, "grade_id": "mesh_record", "locked": true, "schema_version": 3, "solution": false, "task": false}
print(freeze("PREDICTED_RATIO", globals().get("PREDICTED_RATIO")))

# %% [markdown]
# ## 4. Debug: bytes sent per device (3 points)
#
# `mesh_bytes(total_groups, tokens_per_group, num_experts, k, capacity_ratio, dim, data, expert,
# itemsize=4)` below counts the bytes ONE device sends per MoE layer on a `data x expert` mesh (`itemsize` bytes
# per number: 4 for float32; the counts divide evenly), with the rules of task 3. It runs, its capacity is
# `route`'s, and it grows with the buffers as it should -- and one line miscounts what crosses the
# interconnect. Chapter 7 counts it from the program XLA compiled; the check below counts it with your
# `to_experts` on the 4 devices. Run the test below it, find the line and fix it in the cell (change as little
# as you can).

# %% nbgrader={"grade": false, "grade_id": "bytes_debug", "locked": false, "schema_version": 3, "solution": true, "task": false}
### BEGIN HANDOUT
def mesh_bytes(total_groups, tokens_per_group, num_experts, k, capacity_ratio, dim, data, expert, itemsize=4):
    capacity = max(1, int(np.floor(k * tokens_per_group * capacity_ratio / num_experts + 0.5 + 1e-9)))
    groups_per_device = total_groups // (data * expert)
    block = groups_per_device * (num_experts // expert) * capacity * dim  # the numbers for one device's experts
    return 2 * expert * block * itemsize  # there and back
### END HANDOUT
### BEGIN SOLUTION
def mesh_bytes(total_groups, tokens_per_group, num_experts, k, capacity_ratio, dim, data, expert, itemsize=4):
    capacity = max(1, int(np.floor(k * tokens_per_group * capacity_ratio / num_experts + 0.5 + 1e-9)))
    groups_per_device = total_groups // (data * expert)
    block = groups_per_device * (num_experts // expert) * capacity * dim  # the numbers for one device's experts
    return 2 * (expert - 1) * block * itemsize  # there and back; the block for its own experts stays
### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "bytes_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
# Count it on one row of 4 devices, 2 groups each, 8 experts, B = round(2 * 12 * 1.0 / 8) = 3: tag every number
# with the device that holds it, send it with your to_experts, and count the numbers that arrive from another
# device (there and back send the same amount).
n, g, num_experts, capacity, width = 4, 2, 8, 3, 5
source = np.broadcast_to(np.arange(n, dtype=np.float32)[:, None, None, None, None],
                         (n, g, num_experts, capacity, width))
arrived = on_devices(to_experts, source)
counted = 4 * 2 * sum(int((arrived[d] != d).sum()) for d in range(n)) // n  # float32, 2 exchanges, per device
formula = mesh_bytes(n * g, 12, num_experts, 2, 1.0, width, 1, n)
assert formula == counted, f"mesh_bytes gives {formula} bytes: not what leaves a device in the exchange above"
assert mesh_bytes(2 * n * g, 12, num_experts, 2, 1.0, width, 2, n) == counted, "a second row adds no traffic per device"
assert mesh_bytes(8, 12, num_experts, 2, 1.0, width, 8, 1) == 0, "without an expert axis nothing is sent"
print(f"ok: mesh_bytes equals the {counted} bytes counted on the 4 devices, on 1 and 2 rows; 0 without an expert axis")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares the outputs with moe_course.parallel
_answers.record("bytes_tests", mesh_bytes)
### END HIDDEN TESTS

# %% [markdown]
# **The check of your prediction (task 3).** It computes the factor with your fixed `mesh_bytes`; your answer was
# recorded before you fixed it.

# %% nbgrader={"grade": true, "grade_id": "mesh_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
print(freeze("PREDICTED_RATIO", PREDICTED_RATIO))
computed = mesh_bytes(16, 64, 16, 1, 1.25, 64, 2, 4) / mesh_bytes(16, 64, 16, 2, 1.0, 64, 1, 8)
assert abs(PREDICTED_RATIO - computed) < 1e-3, (
    "not the factor your mesh_bytes gives: count the slots B, the groups per device and the share of the "
    "buffers that leaves a device, old and new")
print(f"ok: predicted a factor {PREDICTED_RATIO}, mesh_bytes gives {computed:.4f}")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader computes it with moe_course.parallel
_answers.record("mesh_tests", lambda: PREDICTED_RATIO)
### END HIDDEN TESTS

# %% [markdown]
# ## 5. Explain (2 points, graded by your instructor)
#
# You have two hosts of 4 accelerators each: fast links between the accelerators of a host, a slow network
# between the hosts. An MoE layer has 32 experts, and the 8 devices can form the mesh `data=1, expert=8`,
# `data=2, expert=4` (each row one host) or `data=4, expert=2`. In three to six sentences: which exchanges cross
# the slow network in each, how do the bytes per device and the experts each device must hold compare (use your
# `mesh_bytes` and task 2's split of the experts), and which mesh would you choose? Write your answer in the
# cell below, in place of `YOUR ANSWER HERE`.

# %% [markdown] nbgrader={"grade": true, "grade_id": "mesh_explain", "locked": false, "points": 2, "schema_version": 3, "solution": true, "task": false}
# ### BEGIN SOLUTION
# A device exchanges only with its own row, so the mesh decides what crosses hosts. With `expert=8` the row spans
# both hosts: every all-to-all sends 4 of a device's 7 outgoing blocks over the slow network; each device holds 4
# experts and sends 7/8 of its buffers. With `data=2, expert=4` and one row per host, nothing of the all-to-all
# leaves a host; each device holds 8 experts and sends 3/4 of its buffers (6/7 of the bytes of `expert=8` for
# the same groups per device). With `data=4, expert=2` the rows stay inside a host too; each device sends only
# half of its buffers but holds 16 experts -- twice the memory for the expert weights. I would choose `data=2,
# expert=4`: the exchange stays on the fast links and the experts still fit; only the data axis's gradient
# all-reduce crosses hosts, once per step.
#
# Rubric (2 points): 1 point for "the exchange stays within a row (the expert axis)", so `expert=8` crosses hosts
# and the two others do not. 1 point for the trade-off, with numbers or fractions from mesh_bytes or task 2:
# fewer devices per row send a smaller share ((n-1)/n) but hold more experts (E/n each). A choice of
# `data=4, expert=2` with its memory cost named also earns it.
# ### END SOLUTION
