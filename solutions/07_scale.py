# %% [markdown]
# # Assignment 7: the all-to-all of expert parallelism
#
# With expert parallelism (V-MoE Sec. 2.4 and App. B, after GShard) the E experts of an MoE layer are split
# over n devices, E / n each, while every device holds different images. Each device routes its own tokens
# and fills one capacity-padded buffer per expert, `(g, E, B, D)`: g routing groups, E experts, B slots, width
# D. An **all-to-all** then sends every expert's buffers to the device that holds that expert; the experts run
# there; a second all-to-all brings the outputs back to the devices that own the tokens.
#
# Here you simulate n devices in NumPy: an array whose FIRST axis is the device, `per_device[d]` being what
# device d holds. You write the all-to-all itself (chapter 7 uses the library's), both exchanges of an MoE
# layer as one call of it each, and where each expert lives; you predict the traffic of a new mesh and layer,
# fix a byte count that is wrong, and explain how you would lay out a mesh over two hosts. The graded tests
# compare with `moe_course.parallel`, whose exchange is `jax.lax.all_to_all` inside `jax.shard_map`. 15 points:
# 13 graded automatically, 2 (task 6) by your instructor.
#
# Work in your own copy: `moe-course exercise 07` puts it in `mywork/07_scale.ipynb`. Check it with
# `moe-course check mywork/07_scale.ipynb` (the visible tests, with the base install; from the repository's root
# or any folder in it).

# %% nbgrader={"grade": false, "grade_id": "setup", "locked": true, "schema_version": 3, "solution": false, "task": false}
import numpy as np

rng = np.random.default_rng(0)

# %% [markdown]
# ## 1. The all-to-all (3 points)
#
# `all_to_all(per_device, split_axis, concat_axis)` simulates `jax.lax.all_to_all(x, axis_name, split_axis,
# concat_axis, tiled=True)` over n devices. `per_device` has shape `(n, ...)`; `split_axis` and `concat_axis`
# count the axes of ONE device's array `per_device[d]` (so axis 0 of a device's array is axis 1 of
# `per_device`). Every device cuts its array along `split_axis` into n equal chunks and sends chunk j to device
# j (chunk d stays on device d). Every device then joins the n chunks it received along `concat_axis`, in the
# order of the devices that sent them (the chunk from device 0 first). Returns the new `(n, ...)` array.
#
# For example, with n = 2 and 1-D arrays, device 0 holding `[a, b]` and device 1 holding `[c, d]`, the
# all-to-all with both axes 0 leaves `[a, c]` on device 0 and `[b, d]` on device 1: a transpose of the
# chunks. Raise a ValueError when the split axis does not divide by n.

# %% nbgrader={"grade": false, "grade_id": "all_to_all_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def all_to_all(per_device, split_axis, concat_axis):
    ### BEGIN SOLUTION
    n = per_device.shape[0]
    if per_device.shape[1 + split_axis] % n:
        raise ValueError(f"axis {split_axis} of size {per_device.shape[1 + split_axis]} does not split into {n} chunks")
    chunks = [np.split(local, n, axis=split_axis) for local in per_device]  # chunks[source][destination]
    return np.stack([np.concatenate([chunks[source][dest] for source in range(n)], axis=concat_axis)
                     for dest in range(n)])
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "all_to_all_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
two = np.array([[10, 11], [20, 21]])  # device 0 holds [10, 11], device 1 holds [20, 21]
assert all_to_all(two, 0, 0).tolist() == [[10, 20], [11, 21]], all_to_all(two, 0, 0).tolist()
local = rng.normal(size=(4, 3, 8, 2))  # 4 devices, each with a (3, 8, 2) array
moved = all_to_all(local, 1, 0)
assert moved.shape == (4, 12, 2, 2), f"expected (4, 12, 2, 2), got {moved.shape}"
assert np.array_equal(moved[1, 6:9], local[2][:, 2:4]), "device 1 receives device 2's second chunk in rows 6-8"
assert np.array_equal(all_to_all(moved, 0, 1), local), "cutting along the joined axis and back is the inverse"
try:
    all_to_all(local, 0, 0)
    raise AssertionError("3 rows do not split over 4 devices: expected a ValueError")
except ValueError:
    pass
print("ok: all_to_all on 2 and 4 devices, its inverse, and the ValueError")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares the outputs with jax.lax.all_to_all
_answers.record("all_to_all_tests", all_to_all)
### END HIDDEN TESTS

# %% [markdown]
# ## 2. The two exchanges of an MoE layer (3 points)
#
# Device d holds `buffers[d]`, `(g, E, B, D)`: its g groups' buffers for all E experts. Device j holds experts
# `j * E/n ... (j+1) * E/n - 1`.
#
# - `to_experts(buffers)`: `(n, g, E, B, D) -> (n, n * g, E/n, B, D)`. Cut the expert axis into n blocks, send
#   block j to device j, stack what arrives along the group axis: device j ends up with every device's groups,
#   but only for its own experts (source device i in rows `i*g ... (i+1)*g - 1`).
# - `to_owners(inbox)`: the way back, `(n, n * g, E/n, B, D) -> (n, g, E, B, D)`, so that
#   `to_owners(to_experts(b))` equals `b`.
#
# Both are one call of your `all_to_all`: which axis is cut, which is joined?

# %% nbgrader={"grade": false, "grade_id": "exchange_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def to_experts(buffers):
    ### BEGIN SOLUTION
    return all_to_all(buffers, split_axis=1, concat_axis=0)
    ### END SOLUTION


def to_owners(inbox):
    ### BEGIN SOLUTION
    return all_to_all(inbox, split_axis=0, concat_axis=1)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "exchange_tests", "locked": true, "points": 3, "schema_version": 3, "solution": false, "task": false}
buffers = rng.normal(size=(4, 2, 8, 3, 5))  # n=4 devices, g=2 groups, E=8 experts, B=3 slots, D=5
inbox = to_experts(buffers)
assert inbox.shape == (4, 8, 2, 3, 5), f"expected (4, 8, 2, 3, 5), got {inbox.shape}"
assert np.array_equal(inbox[3, 2:4], buffers[1][:, 6:8]), "device 3 holds experts 6-7; device 1's groups in rows 2-3"
assert np.array_equal(to_owners(inbox), buffers), "to_owners undoes to_experts"
print("ok: to_experts sends each expert block to its device; to_owners brings it back")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares the outputs with moe_course.parallel
_answers.record("exchange_tests", (to_experts, to_owners))
### END HIDDEN TESTS

# %% [markdown]
# ## 3. Where each expert lives (2 points)
#
# `expert_home(expert, num_experts, devices)`: the device (0 ... devices - 1) that holds expert `expert` when
# `num_experts` experts are split over `devices` devices in equal consecutive blocks, as in task 2. Raise a
# ValueError when `num_experts` does not divide by `devices` (the library refuses such a mesh too).

# %% nbgrader={"grade": false, "grade_id": "home_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
def expert_home(expert, num_experts, devices):
    ### BEGIN SOLUTION
    if num_experts % devices:
        raise ValueError(f"num_experts={num_experts} does not split over {devices} devices")
    return expert // (num_experts // devices)
    ### END SOLUTION


# %% nbgrader={"grade": true, "grade_id": "home_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
assert [expert_home(e, 8, 4) for e in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
assert expert_home(5, 8, 1) == 0 and expert_home(5, 8, 8) == 5
print("ok: expert_home for 8 experts on 4, 1 and 8 devices")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares the outputs with moe_course.parallel
_answers.record("home_tests", expert_home)
### END HIDDEN TESTS

# %% [markdown]
# ## 4. Predict first (2 points)
#
# Every buffer is padded to B slots, full or not, so the traffic does not depend on the routing. On a mesh of
# `data x expert` devices (`data` rows, `expert` devices per row), the routing groups of a batch are split
# evenly over all the devices, the experts over the `expert` devices of a row, and a device exchanges only with
# its own row; the forward pass of an MoE layer exchanges twice (there and back). Every expert's buffer has
# `B = round(k * tokens_per_group * C / E)` slots (a half rounds up; at least 1), as in assignment 2.
#
# A layer of 16 experts with k = 2 and C = 1, groups of 64 tokens, width 64, runs on one row of 8 devices
# (`data=1, expert=8`), 16 groups in a batch. Now change two things: the same 8 devices become a mesh `data=2,
# expert=4`, and the layer runs with k = 1 and C = 1.25 (the batch stays 16 groups). By what factor does the
# number of bytes EACH device sends per MoE layer change (new divided by old)? Write it (to 3 decimals) NOW,
# before task 5: the check after task 5 computes it with the byte count you fix there.
#
# In the cell below, replace `raise NotImplementedError()` with `PREDICTED_RATIO = your number`.

# %% nbgrader={"grade": false, "grade_id": "mesh_answer", "locked": false, "schema_version": 3, "solution": true, "task": false}
### BEGIN SOLUTION
PREDICTED_RATIO = 0.536
### END SOLUTION

# %% [markdown]
# ## 5. Debug: bytes sent per device (3 points)
#
# `mesh_bytes(total_groups, tokens_per_group, num_experts, k, capacity_ratio, dim, data, expert,
# itemsize=4)` below counts the bytes ONE device sends per MoE layer on a `data x expert` mesh (`itemsize` bytes
# per number: 4 for float32; the counts divide evenly), with the rules of task 4. It runs, its capacity is
# assignment 2's, and it grows with the buffers as it should -- and one line miscounts what crosses the
# interconnect. Chapter 7 counts it from the program XLA compiled; the check below counts it in your
# simulation of task 2. Run the test below it, find the line and fix it in the cell (change as little as you
# can).

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
# Count it with the simulation of one row of 4 devices, 2 groups each, 8 experts, B = round(2 * 12 * 1.0 / 8) = 3:
# tag every number with the device that holds it, exchange, and count the numbers that arrive from another
# device (there and back send the same amount).
n, g, experts, capacity, width = 4, 2, 8, 3, 5
source = np.broadcast_to(np.arange(n)[:, None, None, None, None], (n, g, experts, capacity, width))
arrived = to_experts(source)
counted = 4 * 2 * sum(int((arrived[d] != d).sum()) for d in range(n)) // n  # float32, 2 exchanges, per device
formula = mesh_bytes(n * g, 12, experts, 2, 1.0, width, 1, n)
assert formula == counted, f"mesh_bytes gives {formula} bytes, counted in the simulation {counted} bytes"
assert mesh_bytes(2 * n * g, 12, experts, 2, 1.0, width, 2, n) == counted, "a second row adds no traffic per device"
assert mesh_bytes(8, 12, experts, 2, 1.0, width, 8, 1) == 0, "without an expert axis nothing is sent"
print(f"ok: mesh_bytes equals the {counted} bytes counted in the simulation, on 1 and 2 rows; 0 without an expert axis")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader compares the outputs with moe_course.parallel
_answers.record("bytes_tests", mesh_bytes)
### END HIDDEN TESTS

# %% nbgrader={"grade": true, "grade_id": "mesh_tests", "locked": true, "points": 2, "schema_version": 3, "solution": false, "task": false}
computed = mesh_bytes(16, 64, 16, 1, 1.25, 64, 2, 4) / mesh_bytes(16, 64, 16, 2, 1.0, 64, 1, 8)
assert abs(PREDICTED_RATIO - computed) < 1e-3, f"you predicted {PREDICTED_RATIO}, mesh_bytes gives {computed:.4f}"
print(f"ok: predicted a factor {PREDICTED_RATIO}, mesh_bytes gives {computed:.4f}")
### BEGIN HIDDEN TESTS
import moe_course.course.inside.answers as _answers  # the grader computes it with moe_course.parallel
_answers.record("mesh_tests", lambda: PREDICTED_RATIO)
### END HIDDEN TESTS

# %% [markdown]
# ## 6. Explain (2 points, graded by your instructor)
#
# You have two hosts of 4 accelerators each: fast links between the accelerators of a host, a slow network
# between the hosts. An MoE layer has 32 experts, and the 8 devices can form the mesh `data=1, expert=8`,
# `data=2, expert=4` (each row one host) or `data=4, expert=2`. In three to six sentences: which exchanges cross
# the slow network in each, how do the bytes per device and the experts each device must hold compare (use your
# `mesh_bytes` and task 3), and which mesh would you choose? Write your answer in the cell below, in place of
# `YOUR ANSWER HERE`.

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
# and the two others do not. 1 point for the trade-off, with numbers or fractions from mesh_bytes or task 3:
# fewer devices per row send a smaller share ((n-1)/n) but hold more experts (E/n each). A choice of
# `data=4, expert=2` with its memory cost named also earns it.
# ### END SOLUTION
