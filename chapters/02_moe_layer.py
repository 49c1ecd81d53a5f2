# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Chapter 2 -- From a mixture of experts to a sparse MoE layer
#
# <details><summary>Terms this chapter uses, each linked to its definition</summary>
#
# [auxiliary loss](../docs/glossary.md#term-auxiliary-loss),
# [Batch Prioritized Routing (BPR)](../docs/glossary.md#term-Batch-Prioritized-Routing-BPR),
# [buffer capacity](../docs/glossary.md#term-buffer-capacity),
# [capacity ratio](../docs/glossary.md#term-capacity-ratio), [combine](../docs/glossary.md#term-combine),
# [dispatch](../docs/glossary.md#term-dispatch), [dropped token](../docs/glossary.md#term-dropped-token),
# [expert](../docs/glossary.md#term-expert), [Experts Choice](../docs/glossary.md#term-Experts-Choice),
# [gate](../docs/glossary.md#term-gate), [group](../docs/glossary.md#term-group),
# [importance loss](../docs/glossary.md#term-importance-loss), [load loss](../docs/glossary.md#term-load-loss),
# [mixture of experts](../docs/glossary.md#term-mixture-of-experts), [MoD](../docs/glossary.md#term-MoD),
# [MoE layer](../docs/glossary.md#term-MoE-layer), [patch](../docs/glossary.md#term-patch),
# [priority](../docs/glossary.md#term-priority), [router](../docs/glossary.md#term-router),
# [slot](../docs/glossary.md#term-slot), [Soft MoE](../docs/glossary.md#term-Soft-MoE),
# [token](../docs/glossary.md#term-token), [TOP-k](../docs/glossary.md#term-TOP-k),
# [V-MoE](../docs/glossary.md#term-V-MoE), [vanilla routing](../docs/glossary.md#term-vanilla-routing).
#
# </details>
#
# ![Diagram: a pre-LN encoder block whose MLP is a sparse MoE layer; inside it a router, top-k, per-expert buffers, four experts and the combine step, with a dropped token riding the residual](../docs/_static/diagrams/02_moe_layer.svg)
#
# *The MoE layer replaces the MLP of a pre-LN block; a token whose expert's buffer is full is dropped and rides the
# residual.*
# [Routers side by side](../docs/routers.md) compares this chapter's routing with the others'.
#
# Chapter 1 ended with a remark: most of a ViT's parameters sit in the MLPs. A Mixture-of-Experts layer
# keeps many MLPs -- the *experts* -- and lets every token use only a few of them. This chapter builds the
# sparse MoE layer of V-MoE (Riquelme et al. 2021, Sec. 2 and App. A, C) one step at a time, on real tokens,
# and checks each step against the library (`moe_course.routing`, `SparseMoE`).
#
# What you will see, each measured here:
# 1. a dense mixture of experts: every expert runs on every token, weighted by a gate;
# 2. the router: noise of standard deviation 1/E during training, and why V-MoE takes the top k *after*
#    the softmax;
# 3. expert capacity: a fixed number of buffer slots per expert, and why that drops tokens;
# 4. the three allocation algorithms of App. C as the paper's loops, equal to the library's vectorised
#    versions, and which tokens vanilla routing and Batch Prioritized Routing drop;
# 5. dispatch and combine with one-hot einsums and with indices, and what each costs in memory;
# 6. the two auxiliary losses, and what one of them cannot see;
# 7. everything together in the library's `SparseMoE` layer.
#
# Nothing is trained here.

# %%
import math
import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from scipy.special import erf
from scipy.stats import spearmanr

from moe_course.configs import get_preset
from moe_course.data import ClutteredDigits, patches_on_box
from moe_course.layers.experts import Experts
from moe_course.layers.moe import SparseMoE
from moe_course.models import ViT
from moe_course.routing import (
    AUX_LOSS_WEIGHT,
    Allocation,
    CapacityRoundingWarning,
    add_router_noise,
    apply_experts,
    auxiliary_losses,
    batch_prioritized_allocation,
    buffer_token_index,
    combine_tensor,
    dispatch_tensor,
    einsum_combine,
    einsum_dispatch,
    expert_capacity,
    gather_combine,
    gather_dispatch,
    importance_loss,
    importance_per_expert,
    load_loss,
    load_per_expert,
    skip_patch_allocation,
    top_k_routing,
    vanilla_allocation,
)
from moe_course.settings import chapter_seed
from moe_course.viz import show_buffers, show_dispatch_combine, show_dropped_patches

started = time.perf_counter()
SEED = chapter_seed()  # MOE_COURSE_SEED, 0 when unset: the random weights and noise draws below follow it
print("JAX devices:", jax.devices(), "| seed", SEED)

# %% [markdown]
# ## 1. A mixture of experts, dense
#
# A mixture-of-experts layer with `E` experts computes, for one token `x`,
#
# `MoE(x) = sum_i g(x)_i e_i(x)`,
#
# where each expert `e_i` is an MLP with its own weights (as in V-MoE) and the gate `g(x)` is a vector of `E` weights
# that depends on the token. If `g` is a softmax, every weight is positive, so every expert must run on every token:
# `E` MLPs per token. What follows makes `g` sparse.
#
# Our tokens are real: four cluttered test digits, cut into patches and embedded by a fresh `digits-tiny` ViT of
# chapter 1 -- 64 tokens of width 64.
#
# <details><summary>The tokens, precisely</summary>
#
# Each digit is cut into a 4x4 grid of 8x8-pixel patches (16 per image), embedded by the patch embedding plus the
# position embedding. The experts have the ViT's MLP shape.
#
# </details>

# %%
digits = ClutteredDigits()
batch = digits.get("test", np.arange(4))
vit_config = get_preset("vit", "digits-tiny")
vit = ViT(vit_config, rngs=nnx.Rngs(SEED))
tokens = vit.embed(jnp.asarray(batch["image"]))  # (images, patches, width)
x = tokens.reshape(1, -1, vit_config.width)  # one group of 64 tokens: (groups, tokens, width)
WIDTH, HIDDEN, E = vit_config.width, vit_config.mlp_dim, 4
print("tokens:", tokens.shape, "-> one group:", x.shape, f"| {E} experts, each an MLP {WIDTH} -> {HIDDEN} -> {WIDTH}")

# %% [markdown]
# The experts are the library's `Experts` module: `E` MLPs stored as stacked weight tensors, run by one batched
# einsum, each on its own buffer of tokens. Below, a plain loop computes `sum_i g(x)_i e_i(x)` with a softmax gate;
# then the experts module, where every expert's buffer holds *all* tokens -- that is what "dense" means.

# %%
experts = Experts(E, WIDTH, HIDDEN, rngs=nnx.Rngs(SEED + 2))
router = nnx.Linear(WIDTH, E, use_bias=False, rngs=nnx.Rngs(SEED + 1))  # the router's W: (width, experts)


def expert_weights(module):
    """The stacked expert weights of an ``Experts`` module as numpy arrays (W1, b1, W2, b2), expert axis first."""
    return tuple(np.asarray(getattr(module, n)[...]) for n in ("fc1_kernel", "fc1_bias", "fc2_kernel", "fc2_bias"))


def expert_mlp(weights, e, token):
    """e_e(x) = W2_e gelu(W1_e x + b1_e) + b2_e for one token (width,), exact GELU, in numpy."""
    w1, b1, w2, b2 = weights
    h = token @ w1[e] + b1[e]
    h = 0.5 * h * (1 + erf(h / np.sqrt(2)))
    return h @ w2[e] + b2[e]


weights_1 = expert_weights(experts)


x_np = np.asarray(x[0])  # (tokens, width)
dense_gate = np.asarray(jax.nn.softmax(router(x)[0]))  # (tokens, experts), every entry > 0
loop = np.zeros_like(x_np)
for t in range(len(x_np)):
    for i in range(E):
        loop[t] += dense_gate[t, i] * expert_mlp(weights_1, i, x_np[t])

all_tokens_everywhere = jnp.broadcast_to(x[:, None], (1, E, *x.shape[1:]))  # (groups, experts, tokens, width)
every_expert_output = experts(all_tokens_everywhere)[0]  # (experts, tokens, width): E MLP runs per token
dense_moe = jnp.einsum("te,etd->td", dense_gate, every_expert_output)
print(f"expert MLP evaluations: {E * x.shape[1]} for {x.shape[1]} tokens ({E} per token)")
assert np.allclose(dense_moe, loop, atol=1e-5)

# %% [markdown]
# **Sparse gate.** Keep only the `k` largest gate values of each token and set the others to zero. The sum
# then has `k` non-zero terms, and the `E - k` other experts need not run at all: the same output from
# `k` MLP evaluations per token instead of `E`. With `E = 32` and `k = 2` (V-MoE's default), a layer holds 32
# MLPs' worth of parameters at the compute of two.

# %%
k = 2
sparse_route = top_k_routing(router(x), k)  # the library's TOP-k (section 2): the k largest gates, unchanged
top = np.asarray(sparse_route.expert_index[0])  # (tokens, k) the k experts with the largest gate
sparse_gate = np.zeros_like(dense_gate)
np.put_along_axis(sparse_gate, top, np.asarray(sparse_route.gates[0]), axis=1)
only_k_run = np.stack([sum(dense_gate[t, e] * expert_mlp(weights_1, e, x_np[t]) for e in top[t])
                       for t in range(len(x_np))])  # only the k chosen experts run
zeros_in_the_dense_sum = np.einsum("te,etd->td", sparse_gate, np.asarray(every_expert_output))
print(f"sparse gate: {int((sparse_gate > 0).sum(1).max())} of {E} experts per token, "
      f"{k * x.shape[1]} MLP evaluations instead of {E * x.shape[1]}")
assert (sparse_gate > 0).sum(1).max() == k and np.allclose(only_k_run, zeros_in_the_dense_sum, atol=1e-5)

# %% [markdown]
# ## 2. The router
#
# V-MoE's gate is `g(x) = TOP_k(softmax(W x + eps))` (Sec. 2.3): a linear map `W` of the token gives one logit per
# expert, noise `eps` is added, a softmax turns the logits into probabilities, and `TOP_k` keeps the `k` largest of
# those probabilities and zeroes the rest.
#
# **The noise** is Gaussian with standard deviation `1/E`, and only while training. We measure its standard deviation
# on many draws:
#
# <details><summary>The noise, precisely</summary>
#
# It is drawn independently for every token and expert; at evaluation the router is deterministic. `add_router_noise`
# adds it when given a PRNG key and returns the logits untouched without one.
#
# </details>

# %%
for num_experts in (4, 32):
    zeros = jnp.zeros((1, 100_000, num_experts))
    noise = np.asarray(add_router_noise(zeros, jax.random.key(num_experts)))
    print(f"E = {num_experts:2d}: measured noise std {noise.std():.5f}, 1/E = {1 / num_experts:.5f}, "
          f"mean {noise.mean():+.5f}")
    assert abs(noise.std() * num_experts - 1) < 0.01 and abs(noise.mean()) * num_experts < 0.01
logits = router(x)  # (groups, tokens, experts): W x
assert np.array_equal(add_router_noise(logits, None), logits)  # evaluation: no key, no noise

# %% [markdown]
# How much does that noise change the routing? V-MoE reports that it altered about 15% of the decisions in
# early layers of its trained models and 2-3% in deep ones.

# %% [markdown]
# **Predict, then run.** Our router is untrained and `E = 4`, so the noise has standard deviation 0.25. Over 200
# noise draws on our 64 tokens, will it change *more* or *fewer* TOP-1 choices than the 15% of V-MoE's early layers?
# The cell also prints how far apart a token's logits are across the experts.

# %%
clean_top1 = np.asarray(top_k_routing(logits, 1).expert_index[..., 0])
keys = jax.random.split(jax.random.key(SEED + 7), 200)
noisy_top1 = np.stack([np.asarray(top_k_routing(logits, 1, key).expert_index[..., 0]) for key in keys])
flipped = (noisy_top1 != clean_top1).mean()
spread = np.asarray(logits).std(-1).mean()
print(f"TOP-1 choice changed by the noise: {flipped:.0%} of decisions "
      f"(logit spread across experts {spread:.3f} vs noise std {1 / E:.3f})")

# %% [markdown]
# <details><summary>What the output shows</summary>
#
# More. A fresh router's weights are small, so the logits of a token differ across experts by about as much
# as the noise itself (compare the two numbers printed): the softmax is close to uniform and a noise draw
# easily reorders the experts. A trained router has learnt logits far apart for most tokens, and the same
# noise then flips only the few tokens that sit near a boundary between two experts -- which is why V-MoE's
# deep, well-trained layers see 2-3%.
#
# </details>

# %%
assert flipped > 0.15  # the claim: more than the paper's early layers, an untrained router is easily swayed

# %% [markdown]
# **TOP_k after the softmax.** The gates are the selected softmax probabilities themselves, not renormalised: with `k
# < E` they sum to less than one. Shazeer et al. (2017) applied the two steps the other way round, `softmax(TOP_k(W x
# + eps))`, whose gates always sum to one. `top_k_routing` has both (`order=`); both choose the same experts.

# %%
vmoe = top_k_routing(logits, 2)
shazeer = top_k_routing(logits, 2, order="topk_then_softmax")
vmoe_sums, shazeer_sums = np.asarray(vmoe.gates.sum(-1)), np.asarray(shazeer.gates.sum(-1))
print(f"k = 2, sum of a token's gates: V-MoE order {vmoe_sums.min():.3f} to {vmoe_sums.max():.3f}, "
      f"softmax-after-top-k {shazeer_sums.min():.3f} to {shazeer_sums.max():.3f}")
assert np.array_equal(vmoe.expert_index, shazeer.expert_index)
assert np.allclose(vmoe.gates, jnp.take_along_axis(vmoe.probs, vmoe.expert_index, -1), atol=1e-7)
assert vmoe_sums.max() < 1 and np.allclose(shazeer_sums, 1, atol=1e-6)

# %% [markdown]
# Why does the order matter? With `k = 1` and the softmax after TOP_k, the gate is exactly 1 for every token, and the
# router gets no gradient at all: it cannot learn (V-MoE App. A.1). A tiny check with `jax.grad`: five random tokens
# of width 8, four experts that are fixed linear maps, and the loss `sum(MoE(x))` as a function of the router's `W`.
#
# <details><summary>The derivation</summary>
#
# After a softmax over a single selected logit, the gate is exactly 1 for every token, whatever `W` is. Which expert
# is selected does depend on `W`, but only through an `argmax` -- a step function, flat almost everywhere. So the
# output `1 * e_{argmax}(x)` has zero gradient with respect to the router weights. With V-MoE's order the gate is the
# selected softmax probability, a smooth function of all logits, and the router gets a gradient through it.
#
# </details>

# %%
kx, kw, ke = jax.random.split(jax.random.key(SEED + 3), 3)
small_x = jax.random.normal(kx, (1, 5, 8))  # (groups, tokens, width)
small_w = jax.random.normal(kw, (8, 4))  # router weights (width, experts)
expert_maps = jax.random.normal(ke, (4, 8, 8))  # expert e: z -> z @ expert_maps[e]


def tiny_moe_loss(w, k, order):
    route = top_k_routing(small_x @ w, k, order=order)
    chosen = jnp.einsum("gtd,gtkde->gtke", small_x, expert_maps[route.expert_index])  # (g, t, k, width)
    return jnp.sum(route.gates[..., None] * chosen)


router_gradient = jax.jit(jax.grad(tiny_moe_loss), static_argnums=(1, 2))  # d loss / d W
for k_ in (1, 2):
    for order in ("softmax_then_topk", "topk_then_softmax"):
        gates = top_k_routing(small_x @ small_w, k_, order=order).gates
        grad = router_gradient(small_w, k_, order)
        print(f"k = {k_}, {order:18s}: gates of token 0 {np.round(np.asarray(gates[0, 0]), 3)}, "
              f"|d loss / d W| = {float(jnp.abs(grad).sum()):.4f}")
        if k_ == 1 and order == "topk_then_softmax":
            assert np.allclose(gates, 1.0) and np.all(np.asarray(grad) == 0.0)
        else:
            assert float(jnp.abs(grad).sum()) > 1e-3

# %% [markdown]
# <details><summary>And with k = 2?</summary>
#
# With `k = 2` the other order does give a gradient (the two selected logits still compete in their softmax); V-MoE
# found its own order better there too (App. A.1, Table 2), and uses it throughout.
#
# </details>
#
# ## 3. Expert capacity
#
# On an accelerator every expert processes a buffer of fixed size, so that shapes are known at compile time. V-MoE
# sizes it as `B_e = round(k N P C / E)` (Sec. 2.4): the `k * N * P` choices that `N` images of `P` tokens make,
# shared evenly over `E` experts, times the **capacity ratio** `C`. With `C = 1` the buffers hold exactly all the
# choices *if* the router spreads them perfectly evenly; `C > 1` leaves slack; `C < 1` forces choices to be dropped.
# Routing happens within a **group** of tokens, so `N * P` is the group size: here our 64 tokens, 4 experts.
# `expert_capacity` computes `B_e`, and warns when rounding moves the ratio `B_e E / (k N P)` by over 1%.

# %%
TOKENS = x.shape[1]
print(f"group of {TOKENS} tokens, E = {E}: buffer slots per expert B_e (effective C where rounding moved it)")
print("   C    " + "".join(f"{c:>10}" for c in (0.1, 0.25, 0.5, 1.0, 1.05, 1.25, 2.0)))
capacity_table = {}
for k_ in (1, 2):
    cells = []
    for c in (0.1, 0.25, 0.5, 1.0, 1.05, 1.25, 2.0):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", CapacityRoundingWarning)
            b = expert_capacity(k_, TOKENS, c, E)
        capacity_table[k_, c] = b
        cells.append(f"{b:>4d}" + (f" ({b * E / (k_ * TOKENS):.2f})" if caught else "       "))
    print(f"  k = {k_} " + "".join(f"{cell:>10}" for cell in cells))
assert capacity_table[2, 1.0] == 2 * TOKENS // E and capacity_table[1, 0.1] == round(TOKENS * 0.1 / E)
big = expert_capacity(2, 16_384, 1.05, 32)
print(f"a paper-size group: 16,384 tokens, k = 2, C = 1.05, E = 32 -> B_e = {big} "
      f"(2 * 16384 * 1.05 / 32 = {2 * 16384 * 1.05 / 32:.1f})")
assert big == round(2 * 16_384 * 1.05 / 32)

# %% [markdown]
# **Why tokens get dropped.** Even at `C = 1`, an expert that is chosen by more tokens than it has slots
# must turn the surplus away. Our router is not balanced, so with `k = 1` and `C = 1` (16 slots each):

# %%
demand = np.bincount(clean_top1[0], minlength=E)  # TOP-1 choices per expert
b_1 = expert_capacity(1, TOKENS, 1.0, E)
print(f"choices per expert {demand.tolist()}, slots per expert {b_1}: "
      f"{int(np.maximum(demand - b_1, 0).sum())} of {TOKENS} tokens dropped")
assert demand.max() > b_1

# %% [markdown]
# A dropped token is not lost: the MoE layer sits inside a residual connection, so the token passes on unchanged,
# with no expert update in that layer (Sec. 2.4). *Which* choices are dropped when an expert is full is the
# allocation algorithm's decision.
#
# <details><summary>How much is dropped in training</summary>
#
# The auxiliary losses of section 6 push the router towards balance, so that training at `C = 1.05` drops little.
#
# </details>
#
# ## 4. Allocation: who gets the slots
#
# V-MoE fills the buffers greedily (App. C), all TOP-1 choices first, then all TOP-2 choices, and so on, visiting the
# tokens in some order; a choice gets a slot if its expert has one left:
# - **vanilla routing** (Algorithm 1) visits tokens in their order in the group;
# - **Batch Prioritized Routing, BPR** (Algorithm 2) first sorts the tokens of the whole group by a priority score,
#   the largest gate `s(x) = max_i g(x)_i`, highest first;
# - **skip-patch** (Algorithm 3) sorts like BPR, then keeps only a fraction `S` of the tokens.
#
# <details><summary>The order, precisely</summary>
#
# A TOP-`i` choice always has priority over any TOP-`j` choice with `i < j`. BPR's sort runs over the whole group, so
# the images compete. Skip-patch skips the remaining tokens altogether.
#
# </details>
#
# Here are the three, as literal loops over one group:

# %%
def fill_buffers(expert_index, token_order, capacity, num_experts):
    """The shared body of Algorithms 1-3. expert_index: (tokens, k). Returns slot (tokens, k), -1 = dropped."""
    tokens, k = expert_index.shape
    buffers = [[] for _ in range(num_experts)]  # empty buffers of `capacity` slots
    slot = np.full((tokens, k), -1)
    for i in range(k):  # TOP-1 choices of all tokens first, then TOP-2, ...
        for p in token_order:
            e = int(expert_index[p, i])
            if len(buffers[e]) < capacity:  # expert e not full: add token p to its buffer
                slot[p, i] = len(buffers[e])
                buffers[e].append(p)
            # else: skip the i-th assignment of token p
    return slot


def algorithm_1_vanilla(expert_index, gates, capacity, num_experts):
    return fill_buffers(expert_index, range(len(expert_index)), capacity, num_experts)


def sort_by_priority(gates):
    """Tokens by score s(p) = max gate, decreasing; Python's sort is stable, so ties keep group order."""
    scores = [float(max(row)) for row in gates]
    return sorted(range(len(gates)), key=lambda p: -scores[p])


def algorithm_2_bpr(expert_index, gates, capacity, num_experts):
    return fill_buffers(expert_index, sort_by_priority(gates), capacity, num_experts)


def algorithm_3_skip_patch(expert_index, gates, capacity, num_experts, keep_fraction):
    kept = max(1, math.floor(keep_fraction * len(gates) + 0.5))  # M = S * N tokens, rounded
    return fill_buffers(expert_index, sort_by_priority(gates)[:kept], capacity, num_experts)


# %% [markdown]
# The library does the same without Python loops (as google-research/vmoe does). We compare the two on random router
# outputs for several `k`, capacity ratios and skip fractions: every served mask and every slot must agree.
#
# <details><summary>The vectorised algorithm, and the ties</summary>
#
# Sort the tokens into processing order, lay the choices out TOP-1 round first, and a cumulative count of the one-hot
# expert choices gives each choice its position in its expert's buffer; positions past the capacity are dropped. The
# random router outputs come from logits on a coarse grid, so that many tokens have exactly equal scores: ties must
# be broken the same way, lower token index first.
#
# </details>

# %%
checked, routed_groups, groups_with_ties = 0, 0, 0
with warnings.catch_warnings():
    warnings.simplefilter("ignore", CapacityRoundingWarning)  # tiny groups: rounding moves C a lot
    for seed in range(3):
        grid_logits = jax.random.randint(jax.random.key(seed), (3, 12, E), 0, 4).astype(jnp.float32) / 2
        for k_ in (1, 2, 3):
            route = top_k_routing(grid_logits, k_)
            index, gates = np.asarray(route.expert_index), np.asarray(route.gates)
            for c in (0.1, 0.5, 1.0, 1.05, 2.0):
                capacity = expert_capacity(k_, 12, c, E)
                choices = (route.expert_index, route.gates, capacity, E)
                library = {  # name: (the library's allocation, the literal algorithm, its extra argument)
                    "vanilla": (vanilla_allocation(*choices), algorithm_1_vanilla, {}),
                    "bpr": (batch_prioritized_allocation(*choices), algorithm_2_bpr, {}),
                }
                for s in (0.25, 0.5, 0.8):
                    allocation = skip_patch_allocation(*choices, keep_fraction=s)
                    library[f"skip {s}"] = (allocation, algorithm_3_skip_patch, {"keep_fraction": s})
                for name, (allocation, literal, extra) in library.items():
                    for g in range(3):
                        slot = literal(index[g], gates[g], capacity, E, **extra)
                        assert np.array_equal(np.asarray(allocation.slot[g]), slot), (name, seed, k_, c, g)
                        assert np.array_equal(np.asarray(allocation.served[g]), slot >= 0)
                        checked += 1
            scores = gates.max(-1)  # (groups, tokens) BPR priority
            groups_with_ties += sum(len(np.unique(scores[g])) < scores.shape[1] for g in range(3))
            routed_groups += 3
print(f"{checked} allocations equal to the literal loops; {groups_with_ties} of the {routed_groups} routed groups "
      f"have tied priority scores")
assert groups_with_ties > 0

# %% [markdown]
# **Which tokens are dropped.** Back to our four real images, with `k = 1` and `C = 0.5`: each expert has 8 slots for
# 64 tokens, so at least half of the tokens must be dropped. Dropped patches are tinted red below (as in V-MoE Fig.
# 5; the green box marks the digit). The group holds the images one after another: tokens 0-15 are image 0, 16-31
# image 1, and so on.

# %% [markdown]
# **Predict, then run.** Under vanilla routing, which of the four images will lose the most patches? And
# under BPR -- the same image, or no image in particular?

# %%
route = top_k_routing(logits, 1)
b_half = expert_capacity(1, TOKENS, 0.5, E)
vanilla = vanilla_allocation(route.expert_index, route.gates, b_half, E)
bpr = batch_prioritized_allocation(route.expert_index, route.gates, b_half, E)
served_vanilla = np.asarray(vanilla.served[0, :, 0]).reshape(4, -1)  # (images, patches)
served_bpr = np.asarray(bpr.served[0, :, 0]).reshape(4, -1)
show_dropped_patches(batch["image"], {"vanilla": served_vanilla, "BPR": served_bpr}, vit_config.patch_size,
                     titles=[f"image {i} of the group" for i in range(4)], boxes=batch["box"], show_counts=True);

# %% [markdown]
# <details><summary>What the output shows</summary>
#
# Vanilla routing serves choices first come, first served, in the order of the group: image 0's tokens are
# visited first and find free slots, and by the time image 3's tokens arrive most buffers are full -- so the
# *last* images lose most. BPR visits the tokens by their priority score, the router's largest gate, over the
# whole group, so where a token sits in the group no longer matters; its drops follow the router's
# confidence, spread over all four images.
#
# </details>

# %% [markdown]
# **Change one thing.** In the cell above, change `0.5` in `b_half = expert_capacity(1, TOKENS, 0.5, E)` to `0.25`
# (four slots per expert); re-run that cell, then the next two code cells (the one printing `B_e` and the buffers'
# picture). Before you do: which rows of the picture change the most, and does the image order of vanilla's
# losses get stronger or weaker? Put `0.5` back afterwards.
#
# <details><summary>Answer</summary>
#
# Four slots per expert serve 16 of the 64 tokens instead of 32, and the vanilla row changes the most: the first
# image's tokens still come first and take nearly every slot, so the image that was half served before loses
# almost all of its patches -- the image order of vanilla's losses gets *stronger*, because the buffers are full
# sooner. The BPR row thins out on every image at once: its drops still follow the router's confidence, not the
# position in the group. With seed 0 on our machine, the printed tokens served per image went from vanilla
# `[16, 13, 3, 0]` and BPR `[11, 7, 8, 6]` at `C = 0.5` to vanilla `[15, 1, 0, 0]` and BPR `[6, 5, 2, 3]` at
# `C = 0.25`; another seed draws another router, so your counts differ, but vanilla's should pile up on image 0.
# The checks of the next two cells hold at both ratios.
#
# </details>

# %% [markdown]
# What the picture shows, checked below: under vanilla, a served token was never visited after a dropped token of the
# same expert, so dropping piles up at the end of the group; under BPR, with `k = 1`, every expert serves the `B_e`
# tokens with its largest gates.
#
# <details><summary>Which tokens does an untrained router keep?</summary>
#
# The cell also prints how many tokens each allocation serves and the gate mass they carry. This router is untrained,
# and its confidence mostly follows how long a token vector is (the rank correlation is printed below) -- ink patches
# happen to give longer vectors than the dark background, so BPR already leans towards the digit here. With a
# *trained* router (chapter 3) the confident tokens are the ones the router has learnt to tell apart.
#
# </details>

# %%
gate = np.asarray(route.gates[0, :, 0])
expert = np.asarray(route.expert_index[0, :, 0])
mass = {name: float((gate * np.asarray(a.served[0, :, 0])).sum()) for name, a in (("vanilla", vanilla), ("BPR", bpr))}
on_digit = patches_on_box(batch["box"], vit_config.image_size, vit_config.patch_size)  # (images, patches)
print(f"B_e = {b_half}; served tokens per image, vanilla {served_vanilla.sum(1).tolist()}, "
      f"BPR {served_bpr.sum(1).tolist()}")
print(f"served gate mass: vanilla {mass['vanilla']:.3f}, BPR {mass['BPR']:.3f}; share of served tokens on the "
      f"digit: vanilla {on_digit[served_vanilla].mean():.0%}, BPR {on_digit[served_bpr].mean():.0%} "
      f"(all tokens: {on_digit.mean():.0%})")
assert served_vanilla.sum() == served_bpr.sum() == np.minimum(np.bincount(expert, minlength=E), b_half).sum()
for e in range(E):
    positions = np.flatnonzero(expert == e)
    served_e = np.asarray(vanilla.served[0, positions, 0])
    assert served_e.all() or positions[served_e].max() < positions[~served_e].min()
    best = np.sort(gate[positions])[::-1][:b_half]  # the B_e largest gates of expert e
    assert np.allclose(np.sort(gate[positions][np.asarray(bpr.served[0, positions, 0])])[::-1], best)
assert mass["BPR"] >= mass["vanilla"] and served_vanilla[0].sum() > served_vanilla[-1].sum()
norm_vs_score = spearmanr(np.linalg.norm(x_np, axis=-1), gate).statistic
print(f"rank correlation of token length and BPR priority score: {norm_vs_score:.2f}")
assert norm_vs_score > 0.5

# %% [markdown]
# **Inside the buffers.** The allocation itself is a table: each expert has `B_e` slots, filled one after another.
# Below, the buffers of the same two allocations: every slot holds a token id (0-63), coloured by its image; in red
# at the end of a row, the choices that expert turned away.
#
# <details><summary>Reading the table off an allocation</summary>
#
# `buffer_token_index` reads the table off an allocation; section 5 uses it to move the tokens.
#
# </details>

# %%
def dropped_per_expert(allocation):
    """(experts,) the choices each expert turned away in group 0: chosen minus served."""
    chosen = np.asarray(allocation.expert_index[0]).ravel()
    served_choice = np.asarray(allocation.served[0]).ravel()
    return np.bincount(chosen[~served_choice], minlength=E)


slot_tokens = {name: np.asarray(buffer_token_index(a)[0]) for name, a in (("vanilla", vanilla), ("BPR", bpr))}
show_buffers(slot_tokens, TOKENS, dropped={"vanilla": dropped_per_expert(vanilla), "BPR": dropped_per_expert(bpr)},
             token_group=np.arange(TOKENS) // 16);
assert all((s < TOKENS).sum() == served_vanilla.sum() for s in slot_tokens.values())

# %% [markdown]
# **Explain the plot.** Three things to explain from the two panels: why every expert has the same number of
# filled slots in both; why vanilla's token ids increase along every row while BPR's jump around; and why an
# expert with empty slots never shows a red count.
#
# <details><summary>Answer</summary>
#
# An expert fills `min(demand, B_e)` slots whatever the order, so only *which* tokens get them differs. Vanilla
# visits the tokens in group order, so a buffer fills in increasing token id and the colours run from image 0
# onwards until the slots run out; BPR visits them by decreasing priority, so ids and images mix. A choice is
# dropped only when its expert is full: an expert with a free slot has turned nobody away.
#
# </details>

# %% [markdown]
# ## 5. Dispatch and combine, two ways
#
# An allocation gives every choice a slot in an expert's buffer. **Dispatch** copies the tokens into the buffers, the
# experts run on their buffers, and **combine** sends each output back to its token, weighted by the gate -- dropped
# choices add nothing.
#
# **The one-hot way** (GShard, google-research/vmoe): a dispatch tensor with a 1 where token `t` sits in slot `b` of
# expert `e`, and a combine tensor, the same with the gate in place of the 1. Then both steps are einsums. We build
# them with a loop and compare with the library's, at `k = 2` and `C = 0.5` (some choices dropped):
#
# <details><summary>The shapes</summary>
#
# Buffers: `(groups, experts, capacity, width)`, empty slots hold zeros. Dispatch tensor: `(groups, tokens, experts,
# capacity)`; the combine tensor has the same shape.
#
# </details>

# %%
route = top_k_routing(logits, 2)
b_moe = expert_capacity(2, TOKENS, 0.5, E)
allocation = batch_prioritized_allocation(route.expert_index, route.gates, b_moe, E)
one_hot = np.zeros((1, TOKENS, E, b_moe), np.float32)
weighted = np.zeros((1, TOKENS, E, b_moe), np.float32)
for t in range(TOKENS):
    for i in range(2):
        e, b = int(allocation.expert_index[0, t, i]), int(allocation.slot[0, t, i])
        if b >= 0:  # served
            one_hot[0, t, e, b] = 1.0
            weighted[0, t, e, b] = float(allocation.gates[0, t, i])
assert np.array_equal(dispatch_tensor(allocation), one_hot) and np.allclose(combine_tensor(allocation), weighted)
buffers = jnp.einsum("gteb,gtd->gebd", one_hot, x)  # dispatch
outputs = experts(buffers)  # expert e runs on buffer e only
y_einsum = jnp.einsum("gteb,gebd->gtd", weighted, outputs)  # combine
print(f"dispatch tensor {one_hot.shape} (groups, tokens, experts, capacity), "
      f"{int(one_hot.sum())} ones for {int(np.asarray(allocation.served).sum())} served choices")
assert np.allclose(buffers, einsum_dispatch(x, allocation), atol=1e-6)
assert np.allclose(y_einsum, einsum_combine(outputs, allocation), atol=1e-6)
show_dispatch_combine(one_hot[0], weighted[0]);

# %% [markdown]
# **Explain the plot.** Each row is a token, each column a slot of one expert's buffer (orange lines separate the
# experts). How many marks can a row have, and what does a row with none mean? Why does a column hold at most one?
# What sets a mark's colour in the combine tensor?
#
# <details><summary>Answer</summary>
#
# A row has at most `k = 2` marks, one per served choice, in two different experts' blocks; an empty row is a
# token whose choices were all dropped -- it passes through the layer on the residual connection only. A slot
# holds one token, so a column has at most one mark; empty columns are unused slots. The combine tensor is
# the dispatch tensor with each 1 replaced by the gate of that choice, a softmax probability below 1 -- the
# einsums of the next cells multiply by exactly these numbers.
#
# </details>

# %% [markdown]
# **The index way** (the library's default): record, for every buffer slot, which token fills it, and gather; combine
# gathers each choice's output from its slot and sums with the gates. No tensor with `tokens x experts x capacity`
# entries is ever formed. Same numbers:
#
# <details><summary>Empty slots</summary>
#
# `buffer_token_index` points an empty slot one past the last token, at an appended row of zeros.
#
# </details>

# %%
slot_token = np.asarray(buffer_token_index(allocation))  # (groups, experts, capacity)
print("token in each slot of expert 0:", slot_token[0, 0].tolist(), f"({TOKENS} = empty slot)")
padded = jnp.concatenate([x, jnp.zeros((1, 1, WIDTH))], axis=1)
assert np.allclose(padded[0][slot_token[0]], buffers[0], atol=1e-6)  # gather == one-hot einsum
y_gather = gather_combine(experts(gather_dispatch(x, allocation)), allocation)
assert np.allclose(y_gather, y_einsum, atol=1e-5)

# %% [markdown]
# **Implement.** Write the index way's combine, with no loop over tokens: `my_combine(outputs, allocation)`;
# once it equals `gather_combine`, the gradient check below runs on it.
#
# <details><summary>The arrays</summary>
#
# `outputs`: the experts' outputs `(groups, experts, capacity, width)`. `allocation.expert_index`, `.slot` and
# `.gates`: `(groups, tokens, k)`; a dropped choice has slot -1 and adds nothing. Each token sums, over its
# choices, the gate times the output in the choice's slot. Advanced indexing (`outputs[g, e, b]` with index
# arrays) and `jnp.where` are enough. The check uses three allocations with dropped choices.
#
# </details>

# %%
def my_combine(outputs, allocation):
    """outputs: (groups, experts, capacity, width) float32 -> (groups, tokens, width) float32."""
    raise NotImplementedError("your code here")


# %%
from moe_course.implement import use_yours

combine_cases = []
for k_, c_ in ((2, 0.5), (1, 0.25), (2, 1.0)):
    route_ = top_k_routing(logits, k_)
    allocation_ = vanilla_allocation(route_.expert_index, route_.gates, expert_capacity(k_, TOKENS, c_, E), E)
    combine_cases.append((experts(gather_dispatch(x, allocation_)), allocation_))
combine_fn = use_yours(my_combine, gather_combine, combine_cases)

# %% [markdown]
# <details><summary>One way to write it</summary>
#
# ```python
# def my_combine(outputs, allocation):
#     groups = jnp.arange(outputs.shape[0])[:, None, None]  # broadcasts against (groups, tokens, k)
#     slot = jnp.maximum(allocation.slot, 0)  # a valid index for dropped choices, masked out next
#     picked = outputs[groups, allocation.expert_index, slot]  # (groups, tokens, k, width)
#     weights = jnp.where(allocation.slot >= 0, allocation.gates, 0.0)
#     return jnp.einsum("gtk,gtkd->gtd", weights, picked)
# ```
#
# </details>

# %% [markdown]
# Equal outputs are not enough for training: the gradients must agree too. Below, a whole sparse MoE step (router,
# top-k, BPR allocation, dispatch, experts, combine) is differentiated with each implementation.
#
# <details><summary>Why the gradient with respect to the tokens</summary>
#
# It flows through both the expert inputs and the gates, since the router's logits are computed from the same tokens.
#
# </details>

# %%
w_router = router.kernel[...]
cotangent = jax.random.normal(jax.random.key(SEED + 5), x.shape)


def moe_step(tokens_, implementation):
    route_ = top_k_routing(tokens_ @ w_router, 2)
    allocation_ = batch_prioritized_allocation(route_.expert_index, route_.gates, b_moe, E)
    if implementation == "yours":  # the index way's dispatch, then the combine of the Implement task above
        return combine_fn(experts(gather_dispatch(tokens_, allocation_)), allocation_)
    return apply_experts(tokens_, allocation_, experts, implementation=implementation)


values, grads = {}, {}
for implementation in ("einsum", "gather", "yours"):
    loss = jax.jit(lambda tokens_, impl=implementation: jnp.sum(cotangent * moe_step(tokens_, impl)))
    values[implementation], grads[implementation] = jax.value_and_grad(loss)(x)
gap = float(jnp.abs(grads["einsum"] - grads["gather"]).max())
print(f"loss einsum {float(values['einsum']):.6f}, gather {float(values['gather']):.6f}; "
      f"largest gradient difference {gap:.2e} (gradient scale {float(jnp.abs(grads['gather']).max()):.3f})")
whose = "your" if combine_fn is my_combine else "the library's"
print(f"with {whose} combine: loss {float(values['yours']):.6f}, largest gradient difference from einsum "
      f"{float(jnp.abs(grads['einsum'] - grads['yours']).max()):.2e}")
assert np.allclose(values["einsum"], values["gather"], rtol=1e-5)
assert np.allclose(grads["einsum"], grads["gather"], atol=1e-6) and float(jnp.abs(grads["gather"]).sum()) > 0

# %% [markdown]
# **Memory.** The dispatch tensor has `tokens x E x B_e` entries, and `B_e` itself grows with the group (`B_e ~ k C
# tokens / E`), so its size is `~ k C tokens^2`: quadratic in the group size. The index arrays are linear. Below, the
# shapes the library's functions would produce, computed with `jax.eval_shape` (nothing is allocated):
#
# <details><summary>What is counted</summary>
#
# The index arrays: expert, slot and gate per choice, plus the token of each buffer slot. Settings: `k = 2`, `C =
# 1.05`, `E = 32`, float32 and int32 (4 bytes each).
#
# </details>

# %%
def abstract_allocation(tokens_, k=2, c=1.05, num_experts=32):
    capacity = expert_capacity(k, tokens_, c, num_experts)
    choice = lambda dtype: jax.ShapeDtypeStruct((1, tokens_, k), dtype)
    rank = jax.ShapeDtypeStruct((1, tokens_), jnp.int32)
    return Allocation(choice(jnp.int32), choice(jnp.float32), choice(jnp.int32), rank, num_experts, capacity)


def nbytes(*shapes):
    return sum(math.prod(s.shape) * s.dtype.itemsize for s in shapes)


memory = {}
print(f"{'tokens':>7} {'B_e':>5} {'one-hot dispatch':>17} {'index arrays':>13}")
for n in (1024, 2048, 4096, 8192, 16_384):
    a = abstract_allocation(n)
    dense_bytes = nbytes(jax.eval_shape(dispatch_tensor, a))
    index_bytes = nbytes(a.expert_index, a.slot, a.gates, jax.eval_shape(buffer_token_index, a))
    memory[n] = dense_bytes, index_bytes
    print(f"{n:7d} {a.capacity:5d} {dense_bytes / 2**20:13.1f} MiB {index_bytes / 2**10:9.1f} KiB")
ratio = memory[16_384][0] / memory[16_384][1]
print(f"at 16,384 tokens the one-hot dispatch tensor is {ratio:,.0f} times the index arrays "
      f"(and the combine tensor is as large again)")
for n in (1024, 2048, 4096, 8192):
    assert abs(memory[2 * n][0] / memory[n][0] - 4) < 0.02 and abs(memory[2 * n][1] / memory[n][1] - 2) < 0.01

# %% [markdown]
# Two GiB for one layer's dispatch mask of one group: the library uses indices by default
# (`SparseMoE(dispatch="einsum")` switches).
#
# ## 6. The auxiliary losses
#
# Left alone, a router tends to overload a few experts while others idle. V-MoE adds two balancing losses (App. A.2),
# each the squared coefficient of variation `(std / mean)^2` of a per-expert sum over a group's tokens:
# - **importance**: the clean router probabilities -- how much total weight each expert receives;
# - **load**: a smooth stand-in for how many tokens each expert is *assigned*.
#
# <details><summary>The derivation: the two quantities, and their weight</summary>
#
# The model adds `0.01 * (0.5 L_imp + 0.5 L_load)` to its task loss. `Imp_e = sum_x softmax(W x)_e`. For the load,
# for token `x` the threshold is its `k`-th largest noisy logit; `p_e(x)` is the probability that expert `e`'s logit,
# with fresh noise of std `sigma = 1/E`, would clear it, `1 - Phi((threshold - (W x)_e) / sigma)`; `load_e` sums it.
#
# </details>
#
# Why both? Balanced weights do not mean balanced assignments. As in App. A Table 3, take `k = 1`, three experts and
# tokens whose router probabilities alternate between (0.6, 0.33, 0.07) and (0.07, 0.33, 0.6): every expert gets the
# same total weight, but expert 1 (the middle one) is never anyone's TOP-1.
#
# <details><summary>The example's numbers</summary>
#
# The proportions 0.9 : 0.5 : 0.1 of the paper's table. Logits `log(w)` give exactly those probabilities, since a
# softmax of `log w` is `w / sum(w)`.
#
# </details>

# %%
weights = np.array([[0.9, 0.5, 0.1], [0.1, 0.5, 0.9]] * 4)  # 8 tokens, alternating
table3_logits = jnp.asarray(np.log(weights)[None], jnp.float32)  # (groups, tokens, experts)
selected = np.asarray(top_k_routing(table3_logits, 1).expert_index[0, :, 0])
print("token  w_0  w_1  w_2  TOP-1")
for t in range(4):
    print(f"x_{t + 1}   {weights[t, 0]:.1f}  {weights[t, 1]:.1f}  {weights[t, 2]:.1f}  expert {selected[t]}")
importance = np.asarray(importance_per_expert(table3_logits)[0])
noisy = add_router_noise(table3_logits, jax.random.key(SEED + 11))  # a training-time draw, sigma = 1/3
load_clean = np.asarray(load_per_expert(table3_logits, table3_logits, 1)[0])
l_imp = float(importance_loss(table3_logits))
l_load = float(load_loss(table3_logits, table3_logits, 1))
l_load_noisy = float(load_loss(table3_logits, noisy, 1))
print(f"TOP-1 count per expert {np.bincount(selected, minlength=3).tolist()}; "
      f"importance {[round(float(v), 4) for v in importance]}; load {[round(float(v), 3) for v in load_clean]}")
print(f"importance loss {l_imp:.2e}; load loss {l_load:.3f} (threshold without noise), "
      f"{l_load_noisy:.3f} (with a noise draw)")
assert np.bincount(selected, minlength=3)[1] == 0
assert l_imp < 1e-6 and l_load > 0.3 and l_load_noisy > 0.1

# %% [markdown]
# The importance loss sees nothing wrong; the load loss does, and its gradient pushes the middle expert's
# logit up for every token (a negative gradient: gradient descent raises it):

# %%
load_gradient = np.asarray(jax.grad(lambda l: load_loss(l, l, 1))(table3_logits)[0])  # (tokens, experts)
print("d L_load / d logit of the middle expert, per token:", [round(float(v), 3) for v in load_gradient[:, 1]])
assert (load_gradient[:, 1] < 0).all()

# %% [markdown]
# On our real tokens, with a noise draw as in training, the library's `auxiliary_losses` gives
# both parts and their mean:

# %%
route = top_k_routing(logits, 2, jax.random.key(SEED + 12))
aux = auxiliary_losses(logits, route.noisy_logits, 2)
print(f"real tokens, fresh router: L_imp {float(aux.importance):.4f}, L_load {float(aux.load):.4f}, "
      f"L_aux {float(aux.total):.4f}; added to the task loss: {AUX_LOSS_WEIGHT} * L_aux = "
      f"{AUX_LOSS_WEIGHT * float(aux.total):.5f}")
assert np.isclose(float(aux.total), 0.5 * float(aux.importance) + 0.5 * float(aux.load), rtol=1e-6)

# %% [markdown]
# ## 7. All together: the `SparseMoE` layer
#
# `moe_course.layers.moe.SparseMoE` strings the steps together: router -> capacity -> allocation -> dispatch ->
# experts -> combine, plus the auxiliary loss. It returns its output, the weighted auxiliary loss and a
# `RoutingRecord` of what went where.
#
# Eight test images, two groups of four (64 tokens per group), four experts, `k = 2`, `C = 1.05`, vanilla routing --
# V-MoE's training setting at toy size. First, the claim that the layer computes exactly `sum over the served choices
# of gate * expert(token)`, checked token by token.
#
# <details><summary>The layer's input, record, and a rounding warning</summary>
#
# It takes `(batch, tokens, width)` and cuts the batch into groups of `group_size` images whose tokens compete for
# the same buffers. The `RoutingRecord` holds the chosen experts, gates, which choices were served, the priority rank
# of every token and the fill of every expert's buffer. The check loops over the layer's own weights and record. The
# layer warns that 34 slots give an effective capacity ratio of 1.06 rather than 1.05: the rounding of section 3 at
# toy group size.
#
# </details>

# %%
eight = digits.get("test", np.arange(8))
layer_tokens = vit.embed(jnp.asarray(eight["image"]))  # (8, 16, 64)
layer = SparseMoE(WIDTH, HIDDEN, E, k=2, capacity_ratio=1.05, group_size=4, allocation="vanilla",
                  rngs=nnx.Rngs(SEED + 4))
out = layer(layer_tokens)
record = out.routing
layer_weights = expert_weights(layer.experts)
grouped = np.asarray(layer_tokens).reshape(2, 64, WIDTH)  # the layer's groups: 4 images after one another
literal = np.zeros_like(grouped)
for g in range(2):
    for t in range(64):
        for i in range(2):
            if record.served[g, t, i]:
                e = int(record.expert_index[g, t, i])
                literal[g, t] += float(record.gates[g, t, i]) * expert_mlp(layer_weights, e, grouped[g, t])
assert np.allclose(out.output, literal.reshape(8, 16, WIDTH), atol=1e-5)
served = np.asarray(record.served)
print(f"output {out.output.shape}; B_e = {record.capacity} slots per expert and group; "
      f"served choices: TOP-1 {served[..., 0].mean():.1%}, TOP-2 {served[..., 1].mean():.1%}")
print(f"expert fill (groups, experts): {np.asarray(record.expert_fill).tolist()}; "
      f"weighted aux loss {float(out.aux_loss):.5f}")
assert (np.asarray(record.expert_fill) <= record.capacity).all()
assert np.array_equal(np.asarray(record.expert_fill).sum(1), served.sum((1, 2)))

# %% [markdown]
# A fresh router is far from balanced: two experts fill their buffers and turn choices away while the others idle, so
# even at `C = 1.05` many choices are dropped; training with the auxiliary losses evens this out. Routing settings
# are plain attributes of the layer: they change without touching its weights (V-MoE Sec. 3.1, App. E.4).
#
# <details><summary>More on the drops, and on changing routing</summary>
#
# Many TOP-2 choices (and some TOP-1 choices) are dropped; the auxiliary losses are those of section 6.
# `moe_course.models.with_routing` changes the routing of a whole model. A smaller capacity ratio drops more choices.
#
# </details>

# %% [markdown]
# **Predict, then run.** At `C = 0.1`, with `k = 2`: about what share of a group's choices is dropped? And which
# of vanilla routing and BPR serves more gate mass (the sum of the gates of the served choices), now that each token makes two choices?

# %%
ratios = (2.0, 1.05, 0.75, 0.5, 0.25, 0.1)
dropped, served_mass, slots = {}, {}, {}
with warnings.catch_warnings():
    warnings.simplefilter("ignore", CapacityRoundingWarning)  # B_e of 3 slots is not exactly C = 0.1
    for allocation_name in ("vanilla", "bpr"):
        layer.allocation = allocation_name
        for c in ratios:
            layer.capacity_ratio = c
            rec = layer(layer_tokens).routing
            slots[c] = rec.capacity
            dropped[allocation_name, c] = 1 - float(np.asarray(rec.served).mean())
            served_mass[allocation_name, c] = float((np.asarray(rec.gates) * np.asarray(rec.served)).sum())
print("   C    B_e   dropped choices (vanilla, BPR)   served gate mass (vanilla, BPR)")
for c in ratios:
    print(f"{c:5.2f} {slots[c]:5d}   {dropped['vanilla', c]:12.1%} {dropped['bpr', c]:8.1%}"
          f"   {served_mass['vanilla', c]:18.2f} {served_mass['bpr', c]:8.2f}")
layer.allocation, layer.capacity_ratio = "vanilla", 1.05

# %% [markdown]
# <details><summary>What the output shows</summary>
#
# At `C = 0.1` at most `E x B_e = 4 x 3 = 12` of a group's 128 choices find a slot, so nearly all are dropped --
# and the same number for both, at every `C`: an expert serves `min(demand, B_e)` choices whatever order it visits them
# in, and the demand (which experts the tokens chose) does not depend on the allocation. The order decides
# *which* choices are served: BPR visits the most confident tokens first, so at `C = 0.1`, where each expert
# takes only a handful of the 128 choices of its group, it keeps the larger gates and serves more gate mass.
# With `k = 1` that is a guarantee (section 4's check): each expert serves the `B_e` tokens with its largest
# gates, the most gate mass any order can serve. With `k = 2` it is not: the TOP-1 round comes first, and a
# token's second gate can be larger than another token's first. With a trained router, this is where the two
# part ways in accuracy (chapter 3).
#
# </details>

# %% [markdown]
# **Claim: the allocation decides which choices are served, not how many** -- the drops grow as `C` shrinks,
# equal for both at every `C` -- **and at `C = 0.1` BPR serves more gate mass.**

# %%
drops = [dropped["vanilla", c] for c in ratios]
assert all(a <= b for a, b in zip(drops, drops[1:])) and drops[-1] > drops[1] + 0.5
assert all(dropped["vanilla", c] == dropped["bpr", c] for c in ratios)
assert served_mass["bpr", 0.1] > served_mass["vanilla", 0.1]

# %% [markdown]
# ## The same layer in PyTorch
#
# Every routing function and layer of this chapter has a PyTorch twin in `moe_course.torch`, with the same names,
# arguments and errors. Given the NNX layer's weights (`torch_state_dict`), the twin makes the *same decisions*:
# experts, served and dropped choices, buffer fill. Here at `C = 0.5` with BPR we compare the outputs, the aux loss
# and the gradient with respect to the tokens. (PyTorch is optional: `pip install 'moe-course[torch]'`, see the
# README.)
#
# <details><summary>The twins and the weight layout</summary>
#
# The twins: `moe_course.torch.routing.top_k_routing`, `...allocate`, `...dispatch`, and
# `moe_course.torch.layers.SparseMoE`. A `Linear` kernel `(in, out)` becomes a `weight` `(out, in)`; the expert
# kernels keep their `(E, in, out)` layout. Ties are included, since both break them towards the lower index. At `C =
# 0.5` this untrained router has more than half of the choices dropped.
#
# </details>

# %%
try:
    import torch
except ImportError:  # the rest of the course does not need PyTorch
    torch = None
    print("PyTorch is not installed; skipping the comparison (pip install 'moe-course[torch]', see the README)")

if torch is not None:
    from moe_course.torch.convert import torch_state_dict
    from moe_course.torch.layers import SparseMoE as TorchSparseMoE

    settings = dict(k=2, capacity_ratio=0.5, group_size=4, allocation="bpr")
    twin = TorchSparseMoE(WIDTH, HIDDEN, E, **settings).eval()  # eval mode: no router noise, as the JAX call
    twin.load_state_dict(torch_state_dict(layer))
    layer.capacity_ratio, layer.allocation = 0.5, "bpr"

    def jax_loss(tokens):
        out = layer(tokens)
        return out.output.sum() + out.aux_loss, out

    (_, jax_out), jax_grad = jax.value_and_grad(jax_loss, has_aux=True)(layer_tokens)
    torch_tokens = torch.from_numpy(np.array(layer_tokens)).requires_grad_()
    torch_out = twin(torch_tokens)
    (torch_out.output.sum() + torch_out.aux_loss).backward()
    layer.capacity_ratio, layer.allocation = 1.05, "vanilla"

    same_choices = np.array_equal(jax_out.routing.expert_index, torch_out.routing.expert_index.numpy())
    same_served = np.array_equal(jax_out.routing.served, torch_out.routing.served.numpy())
    output_gap = np.abs(np.asarray(jax_out.output) - torch_out.output.detach().numpy()).max()
    aux_gap = abs(float(jax_out.aux_loss) - torch_out.aux_loss.item())
    grad_gap = np.abs(np.asarray(jax_grad) - torch_tokens.grad.numpy()).max()
    print(f"same experts: {same_choices}; same served/dropped choices: {same_served} "
          f"({1 - np.asarray(jax_out.routing.served).mean():.0%} dropped)")
    print(f"largest difference: output {output_gap:.1e}, aux loss {aux_gap:.1e}, d/dtokens {grad_gap:.1e}")
    assert same_choices and same_served
    assert np.array_equal(jax_out.routing.expert_fill, torch_out.routing.expert_fill.numpy())
    assert output_gap < 1e-5 and aux_gap < 1e-5 and grad_gap < 1e-4

# %% [markdown]
# The differences are float32 rounding, five orders of magnitude below anything that could flip a decision here.
#
# <details><summary>Whole models in both frameworks</summary>
#
# The two frameworks sum in different orders. `moe_course.torch.convert.to_torch` converts whole models the same way
# (V-MoE, Soft MoE ViT, MoD ViT), and `moe-course evaluate --framework both` evaluates a trained run in both
# frameworks (docs/pytorch.md).
#
# </details>
#
# ## What's next
#
# Chapter 3 puts `SparseMoE` into every other block of a ViT -- V-MoE -- and trains it. With a *trained* router, this
# chapter's questions get their real answers.
#
# <details><summary>Which questions</summary>
#
# Which patches BPR drops at low capacity (drawn on the images), how accuracy falls with `C` under vanilla routing
# versus BPR (V-MoE Fig. 7), how experts specialise on classes in deep versus early layers, and what changing `k` at
# inference does -- all on the cluttered digits.
#
# </details>

# %% [markdown]
# ## Summary
#
# - A sparse MoE layer runs only the `k` experts with the largest gates per token; taking V-MoE's top `k` *after* the
#   softmax gives the router a gradient at `k = 1`.
# - You can size an expert's buffer, `B_e = round(k N P C / E)`, and say why an unbalanced router drops choices even
#   at `C = 1`.
# - You can run V-MoE's allocation algorithms (App. C) by hand, and tell vanilla routing from BPR by their buffers.
# - You can dispatch and combine with one-hot tensors or with indices, and say why the first costs memory quadratic
#   in the group size.
# - You can tell the importance loss from the load loss, and build a router that one sees and the other does not.

# %% [markdown]
# ## Exercises
#
# The exercise notebook `02_moe_layer`: build this chapter's sparse MoE layer in `jax.numpy`, piece by piece, until
# it equals `SparseMoE`; take its router gradient in both gate orders; predict, debug and explain (29 points + 2 by
# the instructor).
#
# Get your own copy and check it from a terminal (in JupyterLab: *File -> New -> Terminal*), in the
# repository's folder or any folder inside it:
#
# ```bash
# moe-course exercise 02
# moe-course check mywork/02_moe_layer.ipynb
# ```
#
# The first command copies the notebook into `mywork/` (git ignores that folder) and says how to open the copy;
# open it from JupyterLab's file browser. The handout in `exercises/` is never opened: JupyterLab saves every
# notebook it opens, and the handout would then show up as changed in git.

# %% [markdown]
# ## References
#
# - Riquelme et al. 2021, *Scaling Vision with Sparse Mixture of Experts* (V-MoE),
#   [arXiv:2106.05974](https://arxiv.org/abs/2106.05974): Sec. 2.3 (the router and its noise), Sec. 2.4
#   (expert capacity), App. A.1 (top-k after the softmax, Table 2), App. A.2 (importance and load losses,
#   Table 3), App. C (Algorithms 1-3), Fig. 5 (dropped patches). Reference code:
#   [google-research/vmoe](https://github.com/google-research/vmoe) (`vmoe/nn/routing.py`).
# - Shazeer et al. 2017, *Outrageously Large Neural Networks: The Sparsely-Gated Mixture-of-Experts Layer*,
#   [arXiv:1701.06538](https://arxiv.org/abs/1701.06538): the noisy top-k gate with the softmax after the top k.
# - Lepikhin et al. 2020, *GShard*, [arXiv:2006.16668](https://arxiv.org/abs/2006.16668): the one-hot
#   dispatch and combine tensors of section 5.

# %%
print(f"chapter 2 ran in {time.perf_counter() - started:.0f} s")
