# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Chapter 4 -- LIMoE: one tower for images and text, and the entropy losses that keep it healthy
#
# Chapters 2 and 3 routed image patches. LIMoE (Mustafa et al., "Multimodal Contrastive Learning with LIMoE")
# puts images *and* their captions through one and the same sparse MoE encoder and trains it contrastively,
# like CLIP, so that an image and its caption land close together. The router is not told which tokens are
# text. That is where the trouble starts: the two modalities compete for the same expert buffers, and the
# classic balancing losses of V-MoE do not keep the minority modality healthy. The paper adds two entropy
# losses per modality and a threshold that acts as a soft minimum on the number of experts a modality uses.
#
# What you will see, each claim measured in this notebook:
# 1. image-text pairs made from the cluttered digits: captions that state the class, the size and the place
#    of the digit, and a real subword tokenizer with a padding mask;
# 2. from two towers to one tower, and the contrastive loss (Eq. 1) checked against a literal loop over pairs;
# 3. the paper's Fig. 3 at toy scale: classic losses only, then + local entropy on text, then + global
#    entropy, with the success rate of each modality over training and the experts text uses;
# 4. the threshold tau as a soft minimum on the number of experts (Figs. 9-10);
# 5. zero-shot classification with class prompts and image-text retrieval, with retrieved examples drawn;
# 6. pruning the experts text does not use (App. E.4).
#
# The three models of section 3 train side by side and are checkpointed under `MOE_COURSE_WORKDIR` (default
# `runs/`): run the notebook again and it loads them instead of training.

# %%
import math
import os
import warnings

import ipywidgets as widgets
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
from flax import nnx
from IPython.display import display

from moe_course.analysis import (embed_images, embed_texts, evaluate_contrastive, experts_used, expert_shares,
                                 flops_per_image, measure_success_rates, zero_shot_predictions, zero_shot_weights)
from moe_course.configs import get_preset
from moe_course.data import CaptionedDigits
from moe_course.models import limoe_param_count, pruned_experts
from moe_course.routing import (CapacityRoundingWarning, global_entropy_loss, local_entropy_loss,
                                multimodal_aux_losses)
from moe_course.train import TrainConfig, side_by_side, train_side_by_side
from moe_course.train.contrastive import contrastive_loss

warnings.simplefilter("ignore", CapacityRoundingWarning)
FULL_SCALE = os.environ.get("MOE_COURSE_FULL_SCALE") == "1"
WORKDIR = os.environ.get("MOE_COURSE_WORKDIR", "runs")
pairs = CaptionedDigits()  # the cluttered digits with a caption each; trains its tokenizer on the captions

# %% [markdown]
# ## 1. Image-text pairs from the digits
#
# LIMoE trains on images paired with text. Our embedded data has no captions, so we write them from what the
# generator knows about each canvas: the digit's class, its size (small / medium / large, a third of the size
# range each) and where it sits (which third of the free room, vertically and horizontally), in one of six
# sentence templates. Captions of one class therefore differ, and finding an image's own caption among many
# needs more than the class. Training captions change with every epoch, as the canvases do; validation and
# test captions are fixed.

# %%
test_labels = pairs.get("test", np.arange(pairs.split_size("test")))["label"]  # sorted by class: take six
sample = pairs.get("test", np.array([np.flatnonzero(test_labels == c)[7 * c] for c in (0, 2, 3, 5, 7, 9)]))
fig, axes = plt.subplots(1, 6, figsize=(13, 2.9), layout="constrained")
for ax, image, text in zip(axes, sample["image"], sample["caption"]):
    ax.imshow(image[..., 0], cmap="gray")
    ax.set_title(text.replace(" in the", "\nin the").replace(", at", ",\nat").replace(" near", "\nnear")
                 .replace(" at the", "\nat the").replace(" among", "\namong"), fontsize=7)
    ax.axis("off")
fig.suptitle("Test canvases and their captions", fontsize=10)

# %% [markdown]
# The text side needs tokens. A SentencePiece BPE tokenizer (the kind of subword tokenizer LIMoE uses) is
# trained here on the training captions -- a vocabulary of 128 pieces -- and every caption becomes 16 ids,
# the paper's sequence length, padded with id 0. The mask marks the real pieces: padding must never take an
# expert's buffer slot and never count in a loss or a statistic.

# %%
tokenizer = pairs.tokenizer
print(repr(str(sample["caption"][0])), "->", tokenizer.pieces(sample["caption"][0]))
print("ids ", sample["text"][0].tolist())
print("mask", sample["text_mask"][0].astype(int).tolist())
lengths = pairs.get("train", np.arange(512))["text_mask"].sum(1)
print(f"real text tokens per caption: mean {lengths.mean():.1f}, min {lengths.min()}, max {lengths.max()} "
      f"(of {pairs.seq_len}); image tokens per canvas: {get_preset('limoe', 'digits-limoe').num_patches}")
assert pairs.tokenizer.encode(list(sample["caption"]))[0].tolist() == sample["text"].tolist()  # deterministic

# %% [markdown]
# ## 2. From two towers to one tower, and the contrastive loss
#
# CLIP-style models have two encoders ("towers"): a ViT for images and a text transformer. LIMoE keeps ONE
# encoder for both. Each modality has its own entry (patch embedding for images, a token embedding for text,
# a position embedding each) and its own exit (average pooling of its tokens, padding masked, then a linear
# projection to a shared embedding of unit length). In between, the blocks are shared; attention is masked so
# that an image's tokens attend to that image and a caption's tokens to that caption -- the two towers'
# computations with one tower's weights. In the MoE layers, though, the router sees all tokens of a routing
# group together (several images and several captions) and is not told which is which.
#
# What one tower saves: the parameters of a second encoder.

# %%
limoe_config = get_preset("limoe", "digits-limoe")
dense_config = get_preset("limoe", "digits-dense-one-tower")
one_tower = limoe_param_count(dense_config)
encoder = dense_config.depth * (limoe_param_count(dense_config.replace(depth=2)) -
                                limoe_param_count(dense_config.replace(depth=1)))
print(f"dense one tower: {one_tower / 1e3:.0f}k parameters, of which {encoder / 1e3:.0f}k in the shared encoder; "
      f"two towers of the same size would need {(one_tower + encoder) / 1e3:.0f}k")
print(f"LIMoE (8 experts in blocks 1 and 3): {limoe_param_count(limoe_config) / 1e3:.0f}k parameters, "
      f"{flops_per_image(limoe_config) / 1e6:.2f} MFLOPs per pair vs dense {flops_per_image(dense_config) / 1e6:.2f}")

# %% [markdown]
# **The contrastive loss (Eq. 1).** For a batch of n pairs, the image embeddings `z_i` and text embeddings
# `z_t` (unit vectors) give an n x n matrix of similarities `s_jk = <z_i_j, z_t_k> / T`. Row j is a
# classification problem -- which of the n texts belongs to image j? -- and column k the same for text k.
# The loss is the mean over pairs of half the cross-entropy of the row (image to text) and half that of the
# column (text to image). The temperature T is learned; the model keeps `log(1/T)`, starting at log 10, so
# the scale stays positive. Below, the library's vectorised loss is compared with the same sum written out
# pair by pair.

# %%
rng = np.random.default_rng(0)
zi = rng.normal(size=(5, 8)); zi /= np.linalg.norm(zi, axis=1, keepdims=True)
zt = rng.normal(size=(5, 8)); zt /= np.linalg.norm(zt, axis=1, keepdims=True)
scale = 10.0


def literal_loss(zi, zt, scale):
    total = 0.0
    for j in range(len(zi)):
        row = [scale * zi[j] @ zt[k] for k in range(len(zt))]  # image j against every text
        col = [scale * zi[k] @ zt[j] for k in range(len(zi))]  # text j against every image
        total += 0.5 * (-row[j] + math.log(sum(math.exp(v) for v in row)))
        total += 0.5 * (-col[j] + math.log(sum(math.exp(v) for v in col)))
    return total / len(zi)


library, _ = contrastive_loss(jnp.asarray(zi), jnp.asarray(zt), jnp.log(scale))
print(f"literal loop {literal_loss(zi, zt, scale):.6f}   library {float(library):.6f}")
assert abs(literal_loss(zi, zt, scale) - float(library)) < 1e-5
grad = jax.grad(lambda log_t: contrastive_loss(jnp.asarray(zi), jnp.asarray(zt), log_t)[0])(jnp.log(scale))
print(f"d loss / d log(1/T) = {float(grad):.4f} (not zero: the temperature is learned)")
assert abs(float(grad)) > 1e-4

# %% [markdown]
# ## 3. Why a shared MoE drops text tokens, and what the entropy losses do (Fig. 3)
#
# Each expert has a buffer of fixed size per routing group (chapter 2): with k = 1, C = 1 and E = 8 experts,
# a group of 8 pairs (8 x 16 image tokens + 8 x 16 text positions) gives every expert room for 32 tokens.
# The balancing losses of V-MoE push the router to spread the tokens evenly. But nothing stops the router
# from sending a whole modality to one or two experts while the *total* still looks balanced -- and then
# those experts overflow. In the paper, image tokens outnumber text tokens about 12 to 1 (up to 27 to 1),
# so the text minority is the one that crowds into a few experts and gets dropped. Our captions are longer
# relative to our images (about 10 real text tokens beside 16 image tokens), but the arithmetic is the same:

# %%
from moe_course.routing import expert_capacity

group_tokens = limoe_config.group_size * (limoe_config.num_patches + pairs.seq_len)
capacity = expert_capacity(1, group_tokens, limoe_config.capacity_ratio, limoe_config.num_experts)
text_tokens = limoe_config.group_size * float(lengths.mean())
print(f"a group of {limoe_config.group_size} pairs: {group_tokens} token positions, {capacity} slots per expert; "
      f"about {text_tokens:.0f} real text tokens")
print(f"if all text went to one expert, at most {capacity / text_tokens:.0%} of it could be served; "
      f"spread over two, {min(1, 2 * capacity / text_tokens):.0%}")

# %% [markdown]
# The paper's remedy, computed per modality m on that modality's tokens only:
# - **local entropy** `Omega_local = mean_i H(p_m(experts | x_i))`, minimised: each token's routing
#   distribution becomes confident (low entropy);
# - **global entropy** `Omega_global = -H(mean_i p_m(experts | x_i))`, minimised: the *average* routing
#   distribution of the modality becomes spread out -- the modality as a whole uses many experts;
# - a **threshold** tau on the global loss, `max(0, tau + Omega_global)`: once the marginal entropy exceeds
#   tau the loss is exactly 0. A uniform distribution over S experts has entropy log S, so tau = log S asks
#   for "at least about S experts" -- a soft minimum (section 4).
#
# The paper's recipe has five terms: local and global entropy on text and global entropy on images, each on
# that modality's tokens only, plus the classic importance and load losses of V-MoE, computed over all
# tokens of both modalities together -- the router's whole batch, as V-MoE has them (App. B.1). The aux loss
# is 0.04 times the mean of the five. With 8 experts we use tau = log 2 for text and log 4 for images (the
# paper: log 9 and log 20 of 32).
#
# Why the classic losses alone cannot protect text: they look at both modalities together, so a balanced
# majority hides a collapsed minority. The paper's own example (Sec. 2.2.1, B/16's numbers): 32 experts, 196
# image tokens spread evenly, all 16 text tokens on one expert. Both losses range over [0, E - 1 = 31]:

# %%
experts, n_image, n_text = 32, 196, 16
first_choice = np.r_[np.arange(n_image) % experts, np.zeros(n_text, int)]  # images round robin; text: expert 0
scenario = jnp.asarray(60.0 * np.eye(experts)[first_choice][None], jnp.float32)  # one-hot router logits
scenario_modality = jnp.asarray([[0] * n_image + [1] * n_text], jnp.int32)
joint = multimodal_aux_losses(scenario, scenario, scenario_modality, losses={}, joint=("importance", "load"))
per_modality = multimodal_aux_losses(scenario, scenario, scenario_modality,
                                     losses={"image": ("importance", "load"), "text": ("importance", "load")})
print("joint (the paper's):  " + "  ".join(f"{k} {float(v):.3f}" for k, v in joint.terms.items()))
print("per modality:         " + "  ".join(f"{k} {float(v):.3f}" for k, v in per_modality.terms.items()))
assert float(joint.terms["importance"]) < 0.01 * (experts - 1) < 30 < float(per_modality.terms["text/importance"])

# %% [markdown]
# The joint losses sit within 1% of their range of the minimum while no text token can be served beyond one
# expert's buffer. Per-modality versions would flag the collapse at once (text at the maximum, 31); the
# library keeps them as a named variant for ablations (`text_aux_losses=("importance", "load", ...)`), but
# the paper's losses, and our presets, are the joint ones. The entropy losses are the paper's answer.
#
# **What our scale changes.** The paper trains for days, and by then its routers are confident: a text token
# puts nearly all its weight on one expert (App. F, Fig. 38). Our models train for a few hundred steps, and
# their routers stay close to uniform: at the paper's aux weight of 0.04, a text token's top-1 weight was
# 0.33 with classic losses and 0.37 with the paper's losses after 400 steps of 64 pairs (mean over the test
# captions, MoE layer 0, measured when we wrote this, with an earlier version of these models whose
# importance and load losses were per modality) -- the entropy terms hardly moved anything. So that the
# losses do something visible in a few minutes, the runs below use **10 times the paper's aux weight (0.4)**;
# everything else is the paper's recipe.
#
# Three models train side by side, identical except for their aux losses: **classic** (importance + load over
# all tokens, Fig. 3's baseline), **+ local** (and local entropy on text) and **paper** (+ global entropy,
# tau_text = log 2 on text and tau_image = log 4 on images: the five terms).

# %%
AUX_WEIGHT = 0.4  # 10x the paper's 0.04, see above
classic_config = get_preset("limoe", "digits-limoe-classic").replace(aux_loss_weight=AUX_WEIGHT)
configs = {
    "classic": classic_config,
    "+ local": classic_config.replace(name="digits-limoe-local", text_aux_losses=("local_entropy",)),
    "paper": limoe_config.replace(aux_loss_weight=AUX_WEIGHT),
}
CHAPTER_STEPS = 260
run_config = TrainConfig(steps=CHAPTER_STEPS, batch_size=64, learning_rate=1e-3, warmup_steps=60, log_every=25,
                         checkpoint_every=CHAPTER_STEPS, eval_batch_size=512)
results = train_side_by_side({"chapter04-" + c.name: c for c in configs.values()}, pairs, run_config,
                             workdir=WORKDIR, progress=False)
models = dict(zip(configs, (result.model for result in results.values())))
histories = dict(zip(configs, (result.history for result in results.values())))
loaded = [name for name, result in zip(configs, results.values()) if result.resumed_from == CHAPTER_STEPS]
print(f"{len(models) - len(loaded)} models trained for {CHAPTER_STEPS} steps of {run_config.batch_size} pairs"
      + (f"; loaded from the checkpoints under {WORKDIR!r}: {', '.join(loaded)}" if loaded else ""))

# %% [markdown]
# The training loop logs, for every MoE layer (blocks 1 and 3) and modality, the success rate -- the fraction
# of that modality's real tokens that reached their expert. Here they are over training, layer by layer.

# %%
fig, axes = plt.subplots(1, 4, figsize=(14, 3), sharey=True)
for col, (modality, layer) in enumerate([(m, l) for m in ("image", "text") for l in (0, 1)]):
    ax = axes[col]
    for name, history in histories.items():
        ax.plot([r["step"] for r in history], [r[f"success/{modality}/layer{layer}"] for r in history], label=name)
    ax.set_title(f"{modality}, MoE layer {layer} (block {limoe_config.moe_blocks()[layer]})", fontsize=9)
    ax.set_xlabel("training step")
axes[0].set_ylabel("success rate (fraction routed)")
axes[-1].legend(fontsize=7)
plt.tight_layout()

# %%
def late_mean(history, key, last=4):
    """Mean of a logged metric over the last ``last`` records (the end of training)."""
    return float(np.mean([r[key] for r in history[-last:]]))


late = {name: {f"{m}/{l}": late_mean(h, f"success/{m}/layer{l}") for m in ("image", "text") for l in (0, 1)}
        for name, h in histories.items()}
test_success = dict(zip(models, side_by_side(lambda m: measure_success_rates(m, pairs, "test", batch_size=512),
                                            models.values())))
for name in configs:
    print(f"{name:24s} training (last 100 steps): " + "  ".join(f"{k} {v:.3f}" for k, v in late[name].items()))
    print(f"{'':24s} test:                        " + "  ".join(
        f"{m}/{l} {test_success[name][f'success/{m}/layer{l}']:.3f}" for m in ("image", "text") for l in (0, 1)))

# %% [markdown]
# Two things to measure on the test pairs, per model and MoE layer: how confident the router is about text
# tokens (the mean top-1 routing weight of a text token; 1/8 would be uniform over the 8 experts) and which
# experts text uses (the share of text tokens whose first choice is each expert, and the number of experts
# needed to cover 90% of them -- App. B.2's proxy for "text experts").

# %%
test_batch = pairs.get("test", np.arange(512))


@nnx.jit
def routing_of(model, images, text, mask):
    out = model(images, text, mask)
    return out.routing, out.modality


confidence, text_experts, shares = {}, {}, {}
for name, model in models.items():
    records, modality = routing_of(model, test_batch["image"], test_batch["text"], test_batch["text_mask"])
    is_text = np.asarray(modality).reshape(-1) == 1
    confidence[name] = [float(np.asarray(r.gates[..., 0]).reshape(-1)[is_text].mean()) for r in records]
    text_experts[name] = [experts_used(r, modality, 1) for r in records]
    shares[name] = np.asarray(expert_shares(records[0], modality, 1))
    print(f"{name:8s} text top-1 weight per layer {np.round(confidence[name], 3).tolist()}, "
          f"experts for 90% of text {text_experts[name]}")
fig, axes = plt.subplots(1, 3, figsize=(11, 2.5), sharey=True)
for ax, (name, share) in zip(axes, shares.items()):
    ax.bar(np.arange(len(share)), share, color="tab:orange")
    ax.set_title(f"{name}: text top-1 weight {confidence[name][0]:.2f}", fontsize=8)
    ax.set_xlabel("expert (MoE layer 0)")
axes[0].set_ylabel("share of text tokens")
plt.tight_layout()

# %% [markdown]
# **What we measured** (the printed numbers; one seed, 260 steps, aux weight 0.4). The first two rows of the
# paper's Fig. 3 show at toy scale. With the classic losses alone, text spreads over 5-6 experts per layer
# and more than 90% of it is served in both layers. The local entropy loss does what it says -- text routing
# becomes confident, the mean top-1 weight of a text token rising from about 0.37 and 0.26 (classic) to 0.85
# and 0.93 when we wrote this -- and in doing so crowds text onto fewer experts (90% of it on 3 and 2 experts
# instead of 5 and 6). The joint importance and load losses do not object: images still balance the total.
# Text now overflows its experts: its success rate falls, to about 0.74 in the second MoE layer. That is the
# middle row of Fig. 3 (a partial collapse: two or three experts, not the paper's one). The paper's third row
# -- the global loss restoring text -- does not show here: with tau_text = log 2 it asks for only about 2
# experts, text already uses about 3, so the thresholded loss switches on in a few routing groups but stays
# tiny (printed below; the local loss is about 0.5) and the paper model serves text like the + local model.
# The capacity arithmetic above says why log 2 is too low for our buffers: 80 text tokens, 32 slots per
# expert, shared with images.
#
# Two checks we ran outside this notebook, with the same code and schedule (when we wrote this; the training
# rows' numbers, as printed above): a second seed gave the same picture -- text success 0.978 / 0.949 with
# classic losses, 0.791 / 0.796 with the local loss -- and a threshold that asks for enough experts brings
# the third row of Fig. 3: the paper model with tau_text = log 4 served 0.896 / 0.875 of its text, with
# log 6 0.938 / 0.906 (its text global loss reaching 0.06 and 0.11), against 0.884 / 0.738 for + local on
# the same seed, for slightly less image success (0.90-0.92 in those runs, 0.92-0.95 here).

# %%
assert all(confidence["+ local"][layer] > confidence["classic"][layer] + 0.05 for layer in (0, 1)), confidence
assert all(late["classic"][f"text/{layer}"] > 0.9 for layer in (0, 1)), late
assert all(text_experts["+ local"][layer] < text_experts["classic"][layer] for layer in (0, 1)), text_experts
assert any(late["+ local"][f"text/{layer}"] < late["classic"][f"text/{layer}"] - 0.1 for layer in (0, 1)), late
text_global = [r["aux/text/global_entropy"] for r in histories["paper"]]
text_local = [r["aux/text/local_entropy"] for r in histories["paper"]]
print(f"paper model over training: thresholded text global entropy loss max {max(text_global):.4f}, "
      f"text local entropy loss at the end {text_local[-1]:.3f}")
assert max(text_global) < 0.1 * math.log(2)  # the text marginal never fell far below the threshold
assert all(abs(late["paper"][f"text/{layer}"] - late["+ local"][f"text/{layer}"]) < 0.05 for layer in (0, 1)), late

# %% [markdown]
# ## 4. The threshold as a soft minimum (Figs. 9-10)
#
# Why does tau = log S mean "at least about S experts"? Take a modality whose tokens spread their weight
# evenly over S of the 8 experts. Its marginal distribution has entropy exactly log S, so the thresholded
# global loss `max(0, tau - H)` is positive while S < e^tau and exactly 0 from S = e^tau on: the loss pushes
# towards more experts until there are enough, then lets go, leaving the local loss free to make each token
# confident. Move the slider to see the loss for each S (the slider needs a live Jupyter kernel; a static
# page shows tau = log 2).

# %%
def uniform_logits(s, experts=8):
    """Router logits of 8 tokens per group spreading their weight evenly over the first s experts."""
    row = np.where(np.arange(experts) < s, 0.0, -1e9)
    return jnp.asarray(np.broadcast_to(row, (1, 8, experts)), jnp.float32)


def threshold_figure(tau):
    losses = [float(global_entropy_loss(uniform_logits(s), tau=tau)) for s in range(1, 9)]
    fig, ax = plt.subplots(figsize=(5, 2.8))
    ax.bar(range(1, 9), losses)
    ax.axvline(math.exp(tau), color="k", ls=":", label=f"e^tau = {math.exp(tau):.1f}")
    ax.set_xlabel("experts used evenly by the modality (S)")
    ax.set_ylabel("global entropy loss")
    ax.set_title(f"max(0, tau - log S) with tau = {tau:.2f}", fontsize=9)
    ax.legend(fontsize=8)
    plt.close(fig)
    return fig


for s, expected in [(1, math.log(2)), (2, 0.0), (4, 0.0)]:
    assert abs(float(global_entropy_loss(uniform_logits(s), tau=math.log(2))) - expected) < 1e-5
assert abs(float(local_entropy_loss(uniform_logits(1)))) < 1e-6  # one-hot tokens: no local entropy
assert abs(float(local_entropy_loss(uniform_logits(8))) - math.log(8)) < 1e-5  # uniform tokens: log E
slider = widgets.FloatSlider(value=math.log(2), min=0.1, max=math.log(8), step=0.05, description="tau",
                             continuous_update=False)
display(slider)
handle = display(threshold_figure(slider.value), display_id=True)
slider.observe(lambda change: handle.update(threshold_figure(change["new"])), names="value")

# %% [markdown]
# In the paper (Figs. 9-10) the threshold behaves exactly like that: as tau_text grows, the models use more
# text experts and fewer image experts. In our runs above, tau_text = log 2 sits below what text already
# uses (about 3 experts after the local loss, 5-6 without it), so the loss hardly acts; at log 4 and log 6
# it acted and text was served again (section 3). Below, the entropy of each model's text first-choice
# shares (MoE layer 0) -- a direct reading of how spread out text routing is -- against the thresholds.

# %%
for name, share in shares.items():
    h = float(-(share[share > 0] * np.log(share[share > 0])).sum())
    print(f"{name:8s} entropy of text first choices {h:.3f} nats = log {math.exp(h):.1f}  "
          f"(tau_text = log 2 = {math.log(2):.3f}; uniform over 8 = log 8 = {math.log(8):.3f})")
    assert h > math.log(2)

# %% [markdown]
# ## 5. Zero-shot classification and retrieval
#
# A contrastive model classifies without a classifier: embed prompts that name a class and nothing about
# any one image, average them per class (CLIP's prompt ensembling), embed the image, and pick the class whose
# averaged prompt embedding is most similar. Our prompts are four plain ones ("a seven", "the digit seven",
# ...) and every caption template filled with every size word and position phrase ("a small seven in the top
# left", ...): 166 per class, so the class embedding covers every size and place the captions talk about. Retrieval asks, for each test image, whether its own caption
# is the most similar of all 1,050 test captions (recall@1) or among the top 5, and the same from text to
# image. Images and texts are embedded separately here (each batch holds one modality), as at test time in
# the paper.

# %%
scores = dict(zip(models, side_by_side(lambda m: evaluate_contrastive(m, pairs, "test", batch_size=512),
                                       models.values())))
for name, s in scores.items():
    print(f"{name:24s} zero-shot {s['zero_shot_accuracy']:.3f}  image->text R@1 {s['i2t_recall@1']:.3f} "
          f"R@5 {s['i2t_recall@5']:.3f}  text->image R@1 {s['t2i_recall@1']:.3f} R@5 {s['t2i_recall@5']:.3f}")

# %% [markdown]
# **Honest numbers.** After a few hundred steps the models have learned something -- retrieval recall@5 is
# far above chance (5 of 1,050 = 0.005) -- but zero-shot accuracy is barely above chance (0.1), and the three
# aux-loss settings are within noise of each other. Contrastive learning needs many more steps than
# classification: the command-line recipe `moe-course train limoe --preset digits-limoe` trains the paper
# model for 3,000 steps of 128 pairs, and that run reaches the zero-shot accuracy reported in docs/results.md. Load
# such a run here with `moe_course.train.restore.load_run(workdir).model` to look at a better model.

# %%
for name, s in scores.items():
    assert s["i2t_recall@5"] > 0.05 and s["t2i_recall@5"] > 0.05, (name, s)

# %% [markdown]
# Three test captions and the four test images the paper model finds most similar to each (green: the
# caption's own image).

# %%
model = models["paper"]
test_all = pairs.get("test", np.arange(pairs.split_size("test")))
image_emb = embed_images(model, test_all["image"], batch_size=512)
text_emb = embed_texts(model, test_all["text"], test_all["text_mask"], batch_size=512)
queries = [3, 400, 800]
fig, axes = plt.subplots(len(queries), 4, figsize=(7, 5.4))
for row, q in zip(axes, queries):
    best = np.argsort(-(image_emb @ text_emb[q]))[:4]
    for ax, index in zip(row, best):
        ax.imshow(test_all["image"][index][..., 0], cmap="gray")
        ax.set_xticks([]), ax.set_yticks([])
        for spine in ax.spines.values():
            spine.set_color("tab:green" if index == q else "lightgray"), spine.set_linewidth(3)
    row[0].set_ylabel(test_all["caption"][q].replace(" in the", "\nin the").replace(" at the", "\nat the"),
                      fontsize=7, rotation=0, ha="right", va="center")
fig.suptitle("text -> image retrieval, top 4 (paper model)", fontsize=10)
plt.tight_layout()

# %% [markdown]
# ## 6. Pruning the experts text does not use (App. E.4)
#
# For a text-only forward pass -- embedding the class prompts, say -- the experts that text hardly uses can
# be removed from each MoE layer. Rank the experts by the share of text tokens they received (here on the
# validation captions), drop the least used, and embed the prompts again. Two ways to route around the
# removed experts: **router_drop** takes them out of the softmax (the kept experts' gates grow), and
# **router_pred** keeps the router's probabilities over all experts and only restricts the choice (the gates
# keep the scale the model was trained with).

# %%
val = pairs.get("val", np.arange(512))
records, modality = routing_of(model, val["image"], val["text"], val["text_mask"])
text_shares = [np.asarray(expert_shares(record, modality, 1)) for record in records]
prompt_ids, prompt_mask = pairs.prompts()
classes, templates, seq_len = prompt_ids.shape


def zero_shot_with(keep_counts, mode):
    """Zero-shot accuracy of the paper model with only the ``keep`` most text-used experts of each layer."""
    keep = [np.isin(np.arange(len(s)), np.argsort(-s)[:n]) for s, n in zip(text_shares, keep_counts)]
    with pruned_experts(model, keep, mode=mode):
        prompts = embed_texts(model, prompt_ids.reshape(-1, seq_len), prompt_mask.reshape(-1, seq_len),
                              batch_size=512)
    weights = zero_shot_weights(prompts.reshape(classes, templates, -1))
    return float(np.mean(zero_shot_predictions(image_emb, weights) == test_all["label"]))


kept = [8, 4, 2, 1]
pruning = {mode: [zero_shot_with([n, n], mode) for n in kept] for mode in ("router_drop", "router_pred")}
fig, ax = plt.subplots(figsize=(5, 3))
for mode, accuracies in pruning.items():
    ax.plot(kept, accuracies, "o-", label=mode)
ax.axhline(1 / classes, color="gray", linestyle=":", label=f"chance (1/{classes})")
ax.set_ylim(0, max(0.3, 1.3 * max(max(a) for a in pruning.values())))  # from 0: the gaps at their true size
ax.set_xlabel("experts kept per MoE layer for text (most used first)")
ax.set_ylabel("zero-shot test accuracy")
ax.set_title(f"Pruning text experts, paper model ({len(test_all['label']):,} test images)", fontsize=9)
ax.invert_xaxis()
ax.legend(fontsize=8, loc="lower left")
for mode, accuracies in pruning.items():
    print(mode, " ".join(f"{n} kept: {a:.3f}" for n, a in zip(kept, accuracies)))

# %% [markdown]
# Keeping all 8 experts gives the unpruned model's accuracy in both modes (the same experts, the same gates).
# With fewer experts the two modes differ only in the gates: router_drop renormalises them over the kept
# experts, router_pred keeps the trained scale. The paper finds router_pred the better one when many experts
# go; at our scale the printed accuracies are what we measured, and with zero-shot accuracy this close to
# chance (0.1) after a few hundred steps, the differences between them say little.

# %%
assert pruning["router_drop"][0] == pruning["router_pred"][0] == scores["paper"]["zero_shot_accuracy"], pruning

# %% [markdown]
# ## 7. Full scale
#
# The same code builds the paper's models -- `limoe-b/16` (and its dense one-tower baseline
# `dense-one-tower-b/16`) and `limoe-l/16`: 32 experts in every second block, K = 1, BPR, text of 16 tokens.
# Their sizes come from shapes only:

# %%
for name in ("limoe-b/16", "dense-one-tower-b/16", "limoe-l/16"):
    config = get_preset("limoe", name)
    print(f"{name}: {limoe_param_count(config) / 1e9:.2f}B parameters, "
          f"{flops_per_image(config) / 1e9:.1f} GFLOPs forward per image-text pair")

# %% [markdown]
# The cell below trains LIMoE-B/16 on an image-caption set laid out as `moe_course.data.caption_files`
# describes (COCO captions JSON, or `image<TAB>caption` lines, beside the image folders). It runs only when
# you set **`MOE_COURSE_FULL_SCALE=1`** before starting Jupyter, with **`MOE_COURSE_DATA`** pointing at that
# folder -- on a GPU or TPU machine. From a shell: `moe-course train limoe --preset limoe-b/16 --dataset
# captions --data-dir PATH --steps 20000 --batch-size 1024`, then `moe-course evaluate --workdir
# runs/limoe-b-16` for retrieval recall and per-modality success rates.

# %%
if FULL_SCALE:
    from moe_course.data import load_dataset
    from moe_course.train import report_devices, train

    captions = load_dataset("captions", os.environ["MOE_COURSE_DATA"], image_size=224)
    big = get_preset("limoe", "limoe-b/16").replace(vocab_size=captions.tokenizer.vocab_size)
    big_train = TrainConfig(steps=20_000, batch_size=1024, learning_rate=1e-3, warmup_steps=1000, weight_decay=0.1,
                            checkpoint_every=1000, log_every=100)
    report_devices(big)  # prints the devices and warns if JAX sees only a CPU
    big_model = train(big, captions, big_train, workdir=os.path.join(WORKDIR, "chapter04-limoe-b-16")).model
    print(evaluate_contrastive(big_model, captions, "test"), measure_success_rates(big_model, captions, "test"))
else:
    print("Full-scale cell skipped: set MOE_COURSE_FULL_SCALE=1 (and MOE_COURSE_DATA) to run it.")
