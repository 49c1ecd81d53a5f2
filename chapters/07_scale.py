# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Chapter 7 -- Scale-out: experts on many devices
#
# <details><summary>Terms this chapter uses, each linked to its definition</summary>
#
# [all-to-all](../docs/glossary.md#term-all-to-all), [buffer capacity](../docs/glossary.md#term-buffer-capacity),
# [capacity ratio](../docs/glossary.md#term-capacity-ratio), [combine](../docs/glossary.md#term-combine),
# [dispatch](../docs/glossary.md#term-dispatch), [dropped token](../docs/glossary.md#term-dropped-token),
# [expert](../docs/glossary.md#term-expert), [expert parallelism](../docs/glossary.md#term-expert-parallelism),
# [gate](../docs/glossary.md#term-gate), [group](../docs/glossary.md#term-group),
# [mesh](../docs/glossary.md#term-mesh), [mixture of experts](../docs/glossary.md#term-mixture-of-experts),
# [MoE layer](../docs/glossary.md#term-MoE-layer), [router](../docs/glossary.md#term-router),
# [slot](../docs/glossary.md#term-slot), [token](../docs/glossary.md#term-token),
# [V-MoE](../docs/glossary.md#term-V-MoE).
#
# </details>
#
# A V-MoE-H/14 has 7 billion parameters, and most of them are expert weights: no accelerator holds them all.
# V-MoE (Sec. 2.4, App. B), like GShard before it, therefore puts *different experts on different devices*
# and moves the tokens to their experts and back. This chapter does that on eight simulated CPU devices, with
# the same model code that runs on one CPU, a GPU node or a TPU pod:
#
# 1. a device **mesh** with a `data` and an `expert` axis;
# 2. **where each weight lives**: experts split over the expert axis, everything else replicated;
# 3. a V-MoE layer whose experts sit on different devices: the **all-to-all** written out step by step, and
#    the tokens' journey drawn;
# 4. the **bytes** each device sends per MoE layer, as a formula checked against the compiled program;
# 5. **memory per device** as experts and devices grow;
# 6. the sharded model **equal** to the one-device model, and a short sharded **training run** equal to the
#    one-device run;
# 7. the full-scale run on real accelerators, and the commands for a GPU cluster and a TPU pod.
#
# JAX fixes its devices when it starts, so the first cell asks for eight CPU devices *before* importing JAX.
# (On a real multi-GPU or TPU machine, leave that line out: the same code uses the real devices.)

# %%
import os

FULL_SCALE = os.environ.get("MOE_COURSE_FULL_SCALE") == "1"
# before JAX starts; added to flags already set (e.g. --xla_cpu_max_isa), not replacing them
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8".strip()
if not FULL_SCALE:
    os.environ["JAX_PLATFORMS"] = "cpu"  # the lesson: CPU devices only, even on a GPU machine

import re
import warnings

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
from flax import nnx

from moe_course import parallel, routing
from moe_course.configs import get_preset
from moe_course.data import ClutteredDigits
from moe_course.layers.moe import route
from moe_course.models import build_model
from moe_course.routing import CapacityRoundingWarning
from moe_course.settings import chapter_seed
from moe_course.train import TrainConfig, train
from moe_course.viz import show_all_to_all
from moe_course.viz.all_to_all import ABSENT, EMPTY

warnings.simplefilter("ignore", CapacityRoundingWarning)
SEED = chapter_seed()  # MOE_COURSE_SEED, 0 when unset: the random weights, inputs and the short training runs
CPUS = jax.devices("cpu")  # the lesson's eight devices; the full-scale cell uses the accelerators
jax.config.update("jax_default_device", CPUS[0])
print(len(CPUS), "CPU devices:", CPUS)
assert len(CPUS) == 8

# %% [markdown]
# ## 1. The mesh
#
# A mesh arranges the devices in a grid with named axes. Ours has two:
# - `expert`: the E experts of every MoE layer are cut into n blocks along this axis; device column j holds
#   experts j*E/n ... (j+1)*E/n - 1;
# - `data`: copies of that arrangement. Together with the expert axis it splits the batch: **every device holds
#   different images**, as in plain data parallelism.
#
# `parallel.make_mesh("data=2,expert=4")` builds it from a spec string; an axis of size 1 simply disappears,
# and a spec that does not fit is refused in one line before anything compiles.

# %%
mesh = parallel.make_mesh("data=2,expert=4", devices=CPUS)
print(mesh)
for bad, experts in [("data=2,expert=2", None), ("data=2,model=4", None), ("expert=8", 12)]:
    try:
        parallel.make_mesh(bad, devices=CPUS, num_experts=experts)
    except ValueError as err:
        print("ValueError:", err)

# %% [markdown]
# We will use `digits-tiny-moe` from chapter 3: 8 experts, k = 2, MoE layers in blocks 1 and 3, routing groups
# of 8 images. On this mesh each device holds 8 / 4 = 2 experts of each layer.

# %%
config = get_preset("vmoe", "digits-tiny-moe")
E, n_expert = config.num_experts, parallel.axis_size(mesh, "expert")
fig, ax = plt.subplots(figsize=(7, 2.6))
for (row, col), device in np.ndenumerate(mesh.devices):
    ax.add_patch(plt.Rectangle((col, -row), 0.9, 0.9, color=f"C{col}", alpha=0.35))
    first = col * E // n_expert
    shard = row * n_expert + col  # the batch is split over (data, expert), data-major
    ax.text(col + 0.45, -row + 0.45, f"device {device.id}\nexperts {first}-{first + E // n_expert - 1}\n"
            f"images {8 * shard}-{8 * shard + 7}", ha="center", va="center", fontsize=8)
ax.set(xlim=(-0.1, 4), ylim=(-1.1, 1), xticks=np.arange(4) + 0.45, yticks=[0.45, -0.55],
       xticklabels=[f"expert={j}" for j in range(4)], yticklabels=["data=0", "data=1"],
       title="mesh data=2, expert=4: experts by column, a batch of 64 images over all 8 devices")
ax.tick_params(length=0)
for side in ax.spines.values():
    side.set_visible(False)
plt.show()

# %% [markdown]
# ## 2. Where each weight lives
#
# The sharding rule is one sentence: parameters of an `Experts` module (leading axis E) are split over the
# `expert` axis, all others are replicated. `parallel.shard_model` writes the rule into each parameter's Flax
# NNX sharding metadata (so `nnx.get_partition_spec` shows it) and places the arrays. The same rule covers every
# model family of the course, since it only looks for `Experts` modules.

# %%
model = build_model(config, rngs=nnx.Rngs(SEED))
single_model = nnx.clone(model)  # the one-device twin, same weights
parallel.shard_model(model, mesh)
specs = list(parallel.annotated_specs(model).items())  # read back through nnx.get_partition_spec
params = {"/".join(map(str, path)): v for path, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
split = {path: spec for path, spec in specs if any(spec)}
print(f"{len(specs)} parameter arrays; split over the expert axis: {len(split)}")
for name, spec in list(split.items())[:4]:
    print(f"  {name}: {spec}")

# %% [markdown]
# What does each device hold? For every parameter, the fraction of its numbers stored on each device, read from
# the arrays' own shards. The figure shows the parameters of block 1, an MoE block (its attention, norms, router
# and experts); the asserts below it check all of them.

# %%
names = [path for path, _ in specs]
held = np.zeros((len(names), 8))
for i, path in enumerate(names):
    array = params[path][...]
    for shard in array.addressable_shards:
        held[i, shard.device.id] = shard.data.size / array.size
shown = [i for i, path in enumerate(names) if path.startswith("blocks/1/")]
fig, ax = plt.subplots(figsize=(8, 0.3 * len(shown) + 1))
ax.imshow(held[shown], aspect="auto", cmap="Blues", vmin=0, vmax=1.6)
for row, i in enumerate(shown):
    for device in range(8):
        ax.text(device, row, f"{held[i, device]:.2g}", ha="center", va="center", fontsize=7)
ax.set(xticks=range(8), xlabel="device", yticks=range(len(shown)),
       title="block 1: fraction of each parameter stored on each device (1 = a full copy)")
ax.set_yticklabels([names[i].removeprefix("blocks/1/") for i in shown], fontsize=8)
plt.show()
assert all(held[i].min() == 1 for i, (_, s) in enumerate(specs) if not any(s))  # replicated: a full copy each
assert all(np.allclose(held[i], 1 / n_expert) for i, (_, s) in enumerate(specs) if any(s))  # experts: 1/4 each

# %% [markdown]
# ## 3. The all-to-all, step by step
#
# Take the first MoE layer (block 1) and a batch of 64 images of 16 tokens (random features stand in for the
# layer's input). Routing needs no communication: a routing group is 8 images, all on one device, so each
# device routes its own group with the single-device functions of chapters 2-3 (router, capacity,
# allocation). Then five steps, one cell each, done with NumPy on the eight devices' pieces; at the end the
# library's `jax.shard_map` version runs the same layer and we compare. The pictures draw, for every step, a
# grid of the 8 devices (rows) by the 8 experts (columns): each cell is the row of buffer slots the device holds
# for that expert, every slot coloured by the device its token comes from, and the cells of the experts that
# live on the device outlined.

# %%
digits = ClutteredDigits()
images = digits.get("train", np.arange(64))["image"]
layer = single_model.blocks[1].mlp
x = jax.random.normal(jax.random.key(SEED), (64, 16, config.width))  # stand-in layer input: 64 images x 16 tokens
groups = x.reshape(8, 8 * 16, config.width)  # 8 routing groups of 8 images, one group per device
allocation, _ = route(routing, layer, layer.router(groups))
G, T, D, B = 8, 8 * 16, config.width, allocation.capacity
print(f"{G} groups of {T} tokens, {E} experts, capacity B = {B} slots per expert and group, width D = {D}")
data_rows, per = parallel.axis_size(mesh, "data"), E // n_expert  # rows of the mesh; experts per device
device_of = lambda r, j: r * n_expert + j  # noqa: E731 -- mesh position (data r, expert j) -> the group it holds
home = np.array([[e // per == d % n_expert for e in range(E)] for d in range(G)])  # (devices, E): where experts live
device_names = [f"device {mesh.devices[d // n_expert, d % n_expert].id} (row {d // n_expert}, col {d % n_expert})"
                for d in range(G)]  # the device at mesh position (data row, expert column) holds group d

# %% [markdown]
# **Step 1, on each device: dispatch.** Each device puts its group's tokens into one buffer of B slots per
# expert, for all E experts -- chapter 2's `dispatch`, `(groups, E, B, D)` for the whole batch, device d holding
# `buffers[d]`.

# %%
buffers = np.asarray(routing.dispatch(groups, allocation))  # (G, E, B, D); device d holds buffers[d]
slot_token = np.asarray(routing.buffer_token_index(allocation))  # (G, E, B): the token in each slot, T if empty
source = np.where(slot_token < T, np.arange(G)[:, None, None], EMPTY)  # (G, E, B): the device a slot's token is from
show_all_to_all({"step 1, dispatch: every device fills B slots for each of the E experts": source}, home=home,
                device_names=device_names)
plt.show()
dropped = int((~np.asarray(allocation.served)).sum())
print(f"filled slots: {(source >= 0).sum()} of {source.size}; choices dropped for a full buffer: {dropped}")
assert (source >= 0).sum() == np.asarray(allocation.served).sum()  # one slot per served choice

# %% [markdown]
# **Explain the plot.** In some cells the slots end in white, others are full to the last slot. What happened to
# the choices that reached a full buffer -- on which device, and when -- and what would change in the exchange
# below if none had been dropped?
#
# <details><summary>What the picture shows</summary>
#
# A white slot is padding: fewer of this group's choices went to that expert than B. A full cell is an expert
# this group's router likes; the choices that arrived after its B slots were taken (in the allocation's order,
# chapter 3) were dropped on the device that routed them, before anything was sent -- they never travel and
# they add nothing to their token's output (a token whose choices are all dropped passes the layer on the
# residual path alone; the count is printed under the figure). Nothing changes in the exchange if none are
# dropped, or if many are: every device sends its buffers whole, B slots per expert, full or not. That is what
# keeps the all-to-all's shape fixed at compile time: a receiving device can never get more than B slots per
# expert from each device of its row, however popular the expert.
#
# </details>

# %% [markdown]
# **Step 2: the all-to-all along the expert axis.** `send_to_experts` runs the library's exchange
# (`parallel.exchange`: one `jax.lax.all_to_all` over the expert axis) on the simulated devices, for any array
# laid out `(devices, E, ...)`: we move the tokens with it, and for the picture the labels of where each slot's
# token came from.

# %% [markdown]
# **Predict, then run.** Device 0 sends its buffers, shape `(E, B, D)`. What shape does each device hold after the
# exchange, and the tokens of how many devices sit in it? Write your guess down before you run the next cell.

# %%
def on_the_devices(per_device, step):
    """Run ``step`` on every device's array of ``per_device`` (G, ...) at once, the devices of each data row
    forming the expert axis that ``parallel.exchange`` exchanges over (a vmap axis of that name)."""
    rows = jnp.asarray(per_device).reshape(data_rows, n_expert, *per_device.shape[1:])  # device_of(r, j) = r*n + j
    out = jax.vmap(jax.vmap(step, axis_name=parallel.EXPERT))(rows)
    return np.asarray(out).reshape(G, *out.shape[2:])


def send_to_experts(per_device):
    """The all-to-all over the expert axis, on every device's (E, ...) array."""
    return on_the_devices(per_device, lambda local: parallel.exchange(local[None]))  # local (E, ...): one group


def on_the_grid(inbox_source):
    """Step 2's source labels laid out for show_all_to_all: ABSENT where the expert lives elsewhere."""
    grid = np.full((G, E, n_expert * B), ABSENT)
    for d in range(G):
        j = d % n_expert
        grid[d, j * per:(j + 1) * per] = inbox_source[d].transpose(1, 0, 2).reshape(per, n_expert * B)
    return grid


inbox = send_to_experts(buffers)
inbox_source = send_to_experts(source)  # the device each received token comes from
print("a device sends", buffers[0].shape, "-> receives", inbox[0].shape)
show_all_to_all({"step 2, after the all-to-all: the slots of each expert, on the device where it lives":
                 on_the_grid(inbox_source)}, home=home, device_names=device_names)
plt.show()

# %% [markdown]
# <details><summary>What the output shows</summary>
#
# Device (data r, expert j) receives from every device (r, i) of its row -- itself included -- the buffers for
# *its* experts j*E/n ... (j+1)*E/n - 1, stacked by source: `send_to_experts` maps `(G, E, ...)` to
# `(G, n, E/n, ...)`. Each device now holds `(n, E/n, B, D)`: n = 4 sources (the devices of its data row, itself
# among them) times its E/n = 2 experts times B slots -- exactly as many numbers as it sent,
# `n * E/n * B = E * B`. An all-to-all is a transpose of blocks between devices: each device keeps one of its n
# blocks and swaps the others. In the picture, each row is filled only in its two outlined cells, and each of
# those holds the colours of four devices: those of its own data row. The other row's tokens never arrive -- every
# data row holds all experts, so the exchange stays within a row, which is why the expert axis, not the whole
# mesh, sets the traffic.
#
# </details>

# %% [markdown]
# **Step 3, on each device: run only its own experts.** Device (r, j) applies experts j*E/n ... (j+1)*E/n - 1
# (the weights `shard_model` left on it) to everything it received. No slot moves: the same places, new
# contents.

# %%
experts = layer.experts
w = {name: np.asarray(getattr(experts, name)[...]) for name in ("fc1_kernel", "fc1_bias", "fc2_kernel", "fc2_bias")}


def run_local(buffers, j):
    """(sources, E/n, B, D) through experts j*per ... (j+1)*per - 1, the experts of mesh column j."""
    e = slice(j * per, (j + 1) * per)
    h = np.einsum("sebd,edh->sebh", buffers, w["fc1_kernel"][e]) + w["fc1_bias"][e][None, :, None]
    h = np.asarray(jax.nn.gelu(h, approximate=False))
    return np.einsum("sebh,ehd->sebd", h, w["fc2_kernel"][e]) + w["fc2_bias"][e][None, :, None]


outbox = np.stack([run_local(inbox[d], d % n_expert) for d in range(G)])  # (G, sources, E/n, B, D)
print("expert outputs on each device:", outbox[0].shape)

# %% [markdown]
# **Step 4: the all-to-all back.** The inverse exchange: device (r, i) collects from every device (r, j) of its
# row the outputs for its own group, so every output lands in the slot its token left in step 1. The library's,
# on the simulated devices:

# %%
def send_back(outbox):
    """(G, n, E/n, ...) -> (G, E, ...): the inverse of send_to_experts."""
    return on_the_devices(outbox, lambda local: parallel.exchange(local, back=True)[0])


# %% [markdown]
# **Implement.** An all-to-all moves blocks and computes nothing, so you can write it in NumPy:
# `my_send_back(outbox)`, the exchange back as a rearrangement of the devices' blocks. Once the next cell finds it
# equal to the library's, step 4 runs on yours.
#
# <details><summary>What you have</summary>
#
# Device d sits in data row `r = d // n_expert` and expert column `j = d % n_expert` (`device_of(r, j)`); its
# experts are `j * per ... (j + 1) * per - 1`. `outbox[d, i]` (shape `(per, ...)`) is what device d's experts
# computed for the tokens that device `device_of(r, i)` sent. After the exchange, device `device_of(r, i)` holds,
# at experts `j * per ... (j + 1) * per - 1` of its `(E, ...)` array, what device `device_of(r, j)` computed for
# it. It works for any trailing shape: the outputs `(B, D)` and the labels `(B,)` alike.
#
# </details>

# %%
def my_send_back(outbox):
    """(G, n, E/n, ...) -> (G, E, ...): every device's expert outputs back on the device their tokens came from."""
    raise NotImplementedError("your code here")


# %%
from moe_course.implement import use_yours

send_back_fn = use_yours(my_send_back, send_back,
                         [(outbox,), (inbox_source,), (np.random.default_rng(SEED).normal(size=outbox.shape[:4]),)])

# %% [markdown]
# <details><summary>One way to write it</summary>
#
# ```python
# def my_send_back(outbox):
#     returned = np.empty((G, E) + outbox.shape[3:], outbox.dtype)
#     for d in range(G):
#         r, i = divmod(d, n_expert)  # device d = (data row r, expert column i)
#         for j in range(n_expert):  # the devices of its row, each holding per of the experts
#             returned[d, j * per:(j + 1) * per] = outbox[device_of(r, j), i]
#     return returned
# ```
#
# Without the loops it is one transpose of blocks: reshape to `(data_rows, n_expert, n_expert, per, ...)`, indexed
# `[r, j, i]`; `.swapaxes(1, 2)` makes it `[r, i, j]`; reshape to `(G, E, ...)`.
#
# </details>

# %%
returned = send_back_fn(outbox)  # (G, E, B, D) again
after_experts = "step 3, after the experts: the same slots, now holding expert outputs"
back_home = "step 4, after the all-to-all back: each output in the slot its token left in step 1"
show_all_to_all({after_experts: on_the_grid(inbox_source), back_home: send_back_fn(inbox_source)}, home=home,
                outputs=[after_experts, back_home], device_names=device_names)
plt.show()
assert np.array_equal(send_back_fn(inbox_source), source)  # every slot is back on the device that routed its token

# %% [markdown]
# **Step 5, on each device: combine.** Each token sums the outputs of its served choices, weighted by their gates
# (chapter 2's `combine`). We compare the result with the layer on one device, and with the library's
# `parallel.apply_experts_parallel`, which does steps 1-5 inside `jax.shard_map` with `jax.lax.all_to_all`.

# %%
by_hand = np.asarray(routing.combine(jnp.asarray(returned), allocation))
one_device = np.asarray(routing.apply_experts(groups, allocation, lambda b: experts(b)))
library = np.asarray(parallel.apply_experts_parallel(parallel.put(groups, parallel.batch_sharding(mesh, 3)),
                                                     allocation, model.blocks[1].mlp.experts, mesh))
print("by hand vs one device:", np.abs(by_hand - one_device).max(), " library (shard_map) vs one device:",
      np.abs(library - one_device).max())
assert np.abs(by_hand - one_device).max() < 1e-5 and np.abs(library - one_device).max() < 1e-5

# %% [markdown]
# The tokens' journey in numbers: how many routed choices each device sends to each other device (their
# expert's home), for the 4 devices of data row 0. The diagonal stays home; everything else crosses the
# interconnect.

# %%
sent = np.zeros((n_expert, n_expert), int)
served_expert = np.where(np.asarray(allocation.served), np.asarray(allocation.expert_index), -1)
for i in range(n_expert):
    for j in range(n_expert):
        sent[i, j] = np.isin(served_expert[device_of(0, i)], np.arange(j * per, (j + 1) * per)).sum()
fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
axes[0].imshow(sent, cmap="Oranges")
for (i, j), count in np.ndenumerate(sent):
    axes[0].text(j, i, count, ha="center", va="center")
axes[0].set(xlabel="destination device (expert column)", ylabel="source device", xticks=range(4), yticks=range(4),
            title="served choices sent, data row 0")
axes[1].bar(range(n_expert), sent.sum(1) - np.diag(sent), color="C1", label="served choices leaving the device")
padded = int((~home[0]).sum()) * B  # every slot of the experts that live on other devices
axes[1].axhline(padded, color="grey", label="padded slots sent")
axes[1].set(xlabel="source device", ylabel="tokens (each D numbers)", title="what crosses the interconnect",
            xticks=range(n_expert))
axes[1].legend(fontsize=7)
plt.tight_layout()
plt.show()
assert sent.sum() == np.asarray(allocation.served[:4]).sum()  # every served choice goes exactly one place

# %% [markdown]
# **Explain the plot.** The orange bars differ from device to device; the grey line is the same for all four.
# Which of the two sets how long the exchange takes, and what would a device gain if its router sent every
# choice to the experts it holds itself?
#
# <details><summary>What the plot shows</summary>
#
# The grey line: an all-to-all over capacity-padded buffers sends every device's padded buffers whole, whatever
# their fill, so every device waits for the same transfer. The bars are the useful part of it, and
# they differ because each group's router prefers different experts. A device whose choices all stayed home
# (only the diagonal of the left panel filled) would still send its padded buffers: on this path locality
# saves nothing. Sending only the filled slots needs an exchange of varying sizes, `ragged_all_to_all`, which
# XLA provides on GPUs and TPUs only.
#
# </details>

# %% [markdown]
# ## 4. Bytes per device per MoE layer
#
# A device cuts its `(g, E, B, D)` buffers into n blocks, and the forward pass has two exchanges (there and back),
# 4 bytes per float32 number.
# `parallel.all_to_all_bytes(g, E, B, D, n)` counts the bytes a device sends (exercise 7 hands you a count with a
# bug to find); below we check it against the program XLA compiled: every `all-to-all` instruction, its shape, and
# the part of it that leaves the device.

# %% [markdown]
# **Predict, then run.** First a number, on the mesh of this chapter: g = 1 group per device, E = 8, D = 64, n = 4
# and B as printed in step 1. How many bytes does one device send per MoE layer? Write it down before you run the
# next cell, which reads the answer from the program XLA compiled.

# %%
moe = model.blocks[1].mlp
sharded_groups = parallel.put(groups, parallel.batch_sharding(mesh, 3))
layer_fn = jax.jit(lambda g: parallel.apply_experts_parallel(g, allocation, moe.experts, mesh))
hlo = layer_fn.lower(sharded_groups).compile().as_text()
exchanges = [m.group(1) for m in re.finditer(r"= (\(?[^=]*?\)?) all-to-all(?:-start)?\(", hlo)]
# each instruction's result: a tuple of n pieces, piece j for expert column j (the device's own piece stays)
sizes = [sum(int(np.prod([int(d) for d in dims.split(",") if d])) for dims in re.findall(r"f32\[([\d,]*)\]", shape))
         for shape in exchanges]
measured = int(sum(sizes) * 4 * (n_expert - 1) / n_expert)
formula = parallel.all_to_all_bytes(G // 8, E, B, D, n_expert)
print(f"{len(exchanges)} all-to-all instructions of {sizes} numbers each; sent per device: {measured} bytes; "
      f"formula: {formula} bytes")

# %% [markdown]
# <details><summary>What the output shows</summary>
#
# Three quarters of g * E * D = 1 * 8 * 64 numbers per buffer slot, twice, 4 bytes each: 3,072 bytes per slot B.
# The printed formula and the compiled program agree exactly, because the program's all-to-all instructions have
# fixed shapes -- `(g, E, B, D)` cut into n pieces -- that do not depend on which slots the router filled. The
# program has two of them per layer (there and back), each the size of the device's whole buffers, of which
# three of the four pieces leave the device.
#
# </details>

# %%
assert measured == formula  # the claim: the formula counts exactly what the compiled program sends

# %% [markdown]
# The same count as the mesh's expert axis changes, the batch and the layer kept: n = 1, 2 or 4 devices per row,
# still one routing group per device.

# %%
by_mesh = {n: parallel.all_to_all_bytes(1, E, B, D, n) for n in (1, 2, 4)}
for n, sent_bytes in by_mesh.items():
    print(f"expert axis n = {n}: {sent_bytes:7d} bytes sent per device per MoE layer "
          f"({sent_bytes / (2 * E * B * D * 4):.3f} of its buffers, both ways)")

# %% [markdown]
# More, but never more than the device's whole buffers: a device keeps the block for its own experts, 1/n of
# its buffers, and sends the other (n - 1)/n -- half at n = 2, three quarters at n = 4.
# At n = 1 every expert lives on every device and nothing is sent: plain data parallelism. So spreading the
# experts thinner saves memory (section 5) and costs traffic, but the traffic per device is bounded: it
# approaches `2 * g * E * B * D * 4` bytes -- all of its buffers, there and back -- however many devices share
# the experts.

# %%
# the claim: nothing is sent at n = 1; more as n grows, never all of a device's buffers
assert by_mesh[1] == 0 and by_mesh[2] < by_mesh[4] < 2 * E * B * D * 4

# %% [markdown]
# **Change one thing.** In the cell of section 1 that loads `config`, write
# `config = get_preset("vmoe", "digits-tiny-moe").replace(capacity_ratio=0.5)` and run the notebook again from that
# cell to here. What happens to B, to the white slots and the dropped choices of step 1, and to the bytes? Which
# assertion would you expect to break, if any? Set it back to `get_preset("vmoe", "digits-tiny-moe")`
# (capacity ratio 1.05) when you are done.
#
# <details><summary>What to look for</summary>
#
# B roughly halves, and with it the bytes (the formula is linear in B) and the memory of the buffers. Fewer
# white slots and many more dropped choices: the exchange gets cheaper by throwing tokens away, which is the
# capacity ratio's trade-off (chapter 3). No assertion breaks: the sharded layer still equals the one-device
# layer, because both drop the same choices -- dropping happens in the routing, before any device talks to
# another.
#
# </details>

# %% [markdown]
# ## 5. Memory per device as experts and devices grow
#
# A device holds every shared weight and E / n of the expert weights: `shared + experts / n` parameters. For
# the paper's V-MoE-B/16 (MoE every other block) with more experts, spread over as many devices as experts:

# %%
rows = []
for experts_per_layer in (8, 32, 128):
    big = get_preset("vmoe", "vmoe-b/16-every-2").replace(num_experts=experts_per_layer)
    expert_params, shared = parallel.expert_and_shared_params(big)
    rows.append((experts_per_layer, expert_params, shared))
devices = np.array([1, 2, 4, 8, 16, 32, 64, 128])
fig, ax = plt.subplots(figsize=(6.5, 3.6))
for experts_per_layer, expert_params, shared in rows:
    usable = devices[devices <= experts_per_layer]
    ax.plot(usable, 4 * (shared + expert_params / usable) / 2**30, "o-", label=f"E = {experts_per_layer}")
ax.axhline(4 * rows[0][2] / 2**30, color="grey", ls="--", label="shared weights alone")
ax.set(xscale="log", yscale="log", xlabel="devices on the expert axis", ylabel="GiB of float32 weights per device",
       title="V-MoE-B/16 (MoE every 2nd block): weights per device")
ax.legend(fontsize=8)
plt.show()
for experts_per_layer, expert_params, shared in rows:
    print(f"E={experts_per_layer:4d}: {(expert_params + shared) / 1e6:7.0f}M parameters, "
          f"{expert_params / (expert_params + shared):.0%} in experts; on {experts_per_layer} devices "
          f"{4 * (shared + expert_params / experts_per_layer) / 2**30:.2f} GiB each (x3 with Adam's moments)")

# %% [markdown]
# The same count for our small model on this mesh, against the bytes its arrays actually occupy on device 0:

# %%
expert_params, shared = parallel.expert_and_shared_params(config)
on_device_0 = sum(shard.data.nbytes for leaf in jax.tree.leaves(nnx.state(model, nnx.Param))
                  for shard in leaf.addressable_shards if shard.device.id == 0)
print(f"formula {4 * (shared + expert_params // n_expert)} bytes, measured {on_device_0} bytes on device 0")
assert on_device_0 == 4 * (shared + expert_params // n_expert)

# %% [markdown]
# ## 6. The sharded model equals the one-device model
#
# The whole V-MoE on the mesh: the batch is split over all eight devices, both MoE layers run their experts
# where they live, the all-to-alls happen inside, and the logits agree with the one-device model.

# %%
batch = parallel.shard_batch({"image": images}, mesh)["image"]
sharded_out = nnx.jit(lambda m, im: m(im))(model, batch)
single_out = nnx.jit(lambda m, im: m(im))(single_model, images)
difference = float(jnp.abs(sharded_out.logits - single_out.logits).max())
print("logits sharded over", sharded_out.logits.sharding.spec, "; largest difference:", difference)
assert difference < 1e-5
assert all(bool(jnp.array_equal(a.served, b.served)) for a, b in zip(sharded_out.routing, single_out.routing))

# %% [markdown]
# Training: the course's one loop, `train(..., mesh=mesh)` (or `moe-course train ... --mesh data=2,expert=4`).
# Gradients of replicated weights are summed over the devices, those of the experts stay where they are; the
# losses equal the one-device run's to float rounding.

# %%
run = TrainConfig(steps=8, batch_size=64, learning_rate=1e-3, warmup_steps=2, log_every=1, eval_every=0,
                  checkpoint_every=0, eval_batch_size=64, seed=SEED)
one = train(config, digits, run, progress=False)
many = train(config, digits, run, progress=False, mesh=mesh)
gap = max(abs(a["loss"] - b["loss"]) for a, b in zip(one.history, many.history))
print("one device:", [round(h["loss"], 4) for h in one.history])
print("8 devices: ", [round(h["loss"], 4) for h in many.history], f"-- largest difference {gap:.1e}")
assert gap < 1e-4 and len(one.history) == len(many.history) == run.steps

# %% [markdown]
# ## 7. Full scale, and many hosts
#
# The cell below trains V-MoE-S/32 (every other block MoE, 32 experts, the paper's Table 7 architecture) on an
# ImageNet-style folder (`root/train/<class>/*.jpeg`, `root/val/...`), sharded over **all visible
# accelerators** with the experts spread over as many of them as divide 32. It runs only with
# **`MOE_COURSE_FULL_SCALE=1`** and **`MOE_COURSE_DATA=/path/to/imagenet`** set before starting Jupyter (and
# without the eight simulated CPU devices of the first cell, which it ignores on a GPU or TPU machine).
#
# From a shell, one host with several GPUs:
#
# ```bash
# moe-course train vmoe --preset vmoe-s/32-every-2 --dataset imagefolder --data-dir /data/imagenet --mesh auto \
#     --batch-size 1024 --steps 90000 --workdir runs/vmoe-s32
# ```
#
# A GPU cluster with SLURM, 4 nodes x 8 GPUs (JAX reads the process count, id and coordinator from SLURM):
#
# ```bash
# srun --nodes=4 --ntasks-per-node=1 --gpus-per-node=8 \
#     moe-course train vmoe --preset vmoe-b/16-every-2 --dataset imagefolder --data-dir /data/imagenet \
#     --distributed --mesh data=1,expert=32 --batch-size 4096 --workdir /shared/runs/vmoe-b16
# ```
#
# Without SLURM, start the same command on every node with `--coordinator-address node0:1234 --num-processes 4
# --process-id i` (or the environment variables `JAX_COORDINATOR_ADDRESS`, `JAX_NUM_PROCESSES`,
# `JAX_PROCESS_ID`). A Cloud TPU pod slice (e.g. v4-64, 8 hosts), from your workstation:
#
# ```bash
# gcloud compute tpus tpu-vm ssh my-pod --zone us-central2-b --worker=all --command \
#   "cd moe-course && .venv/bin/moe-course train vmoe --preset vmoe-b/16-every-2 --dataset imagefolder \
#    --data-dir /data/imagenet --distributed --mesh data=1,expert=32 --batch-size 4096 --workdir gs://bucket/vmoe-b16"
# ```
#
# Each process reads and decodes only the rows of every global batch that its own devices hold (with 4 hosts,
# 1,024 of the 4,096 images a step), and `jax.make_array_from_process_local_data` assembles the global batch on
# the mesh; the batches are the one-process ones, whatever the number of hosts. Every host needs the whole
# dataset under the same path, and the workdir on a shared file system: checkpoints are written by all processes
# together and resume on any number of processes or devices. To check that the hosts agree, compare the ends of
# their logs: each prints `process p of 4 read N training images` with the same N, and the same test loss
# (docs/scale-out.md, "What each host does").

# %%
if FULL_SCALE:
    from moe_course.data import load_dataset
    from moe_course.recipes import recipe_for
    from moe_course.train import report_devices

    jax.config.update("jax_default_device", None)  # back to the accelerators
    folder = load_dataset("imagefolder", os.environ["MOE_COURSE_DATA"], image_size=224)
    big = get_preset("vmoe", "vmoe-s/32-every-2").replace(num_classes=folder.num_classes)
    report_devices(big)  # prints the devices and warns if JAX sees only a CPU
    big_mesh = parallel.make_mesh(num_experts=big.num_experts)
    print("mesh", dict(big_mesh.shape))
    workdir = os.path.join(os.environ.get("MOE_COURSE_WORKDIR", "runs"), "chapter07-vmoe-s32")
    big_run = recipe_for(big).replace(batch_size=1024, eval_batch_size=1024)
    result = train(big, folder, big_run, workdir=workdir, mesh=big_mesh)
    print(result.history[-1])
else:
    print("Full-scale cell skipped: set MOE_COURSE_FULL_SCALE=1 (and MOE_COURSE_DATA) to run it.")

# %% [markdown]
# ## Summary
#
# - Build a device mesh with a `data` and an `expert` axis, and say which experts and which images each device
#   holds.
# - Shard a model so that expert weights are split over the expert axis and everything else is replicated, and
#   read back from the arrays what each device stores.
# - Carry out an expert-parallel MoE layer by hand -- dispatch on each device, all-to-all, local experts,
#   all-to-all back, combine -- and check it against the one-device layer and the library's `shard_map` version.
# - Compute the bytes a device sends per MoE layer for any mesh, and check the count against the program XLA
#   compiled; compute the weights each device holds as experts and devices grow.
# - Train the same model sharded, equal to the one-device run, and start it on a GPU cluster or a TPU pod.

# %% [markdown]
# ## Exercises
#
# The exercise notebook `07_scale` asks you to write, in JAX on 4 CPU devices, the two all-to-all exchanges and
# your own expert-parallel MoE layer in `jax.shard_map`, equal to the one-device layer; to predict the traffic of
# a new mesh and layer, to fix a byte count, and to explain how you would lay out a mesh over two hosts (14 points,
# 2 of them graded by your instructor).
#
# Get your own copy and check it from a terminal (in JupyterLab: *File -> New -> Terminal*), in the
# repository's folder or any folder inside it:
#
# ```bash
# moe-course exercise 07
# moe-course check mywork/07_scale.ipynb
# ```
#
# The first command copies the notebook into `mywork/` (git ignores that folder) and says how to open the copy;
# open it from JupyterLab's file browser. The handout in `exercises/` is never opened: JupyterLab saves every
# notebook it opens, and the handout would then show up as changed in git.

# %% [markdown]
# ## References
#
# - Riquelme et al. 2021, "Scaling Vision with Sparse Mixture of Experts" (V-MoE),
#   [arXiv:2106.05974](https://arxiv.org/abs/2106.05974): Sec. 2.4 and App. B (experts on different devices, the
#   capacity-padded buffers), Table 7 (the V-MoE-S/32 and B/16 architectures of sections 5 and 7).
# - Lepikhin et al. 2020, "GShard: Scaling Giant Models with Conditional Computation and Automatic Sharding",
#   [arXiv:2006.16668](https://arxiv.org/abs/2006.16668): Sec. 3 (the MoE layer as dispatch and combine einsums,
#   experts sharded over devices, the all-to-all between them).
# - Fedus et al. 2021, "Switch Transformers", [arXiv:2101.03961](https://arxiv.org/abs/2101.03961): Sec. 5 (data,
#   model and expert parallelism, and how weights and tokens are split over a mesh of cores).
# - Reference code: [google-research/vmoe](https://github.com/google-research/vmoe) (`vmoe/moe.py`,
#   `sparse_moe_spmd`: the experts of a layer split over the devices of a mesh axis).
