"""LIMoE (Mustafa et al. 2022, Sec. 2.2): ONE transformer encoder for images and text, with sparse MoE layers.

Images are cut into patches (a strided convolution, as ViT) and text ids are looked up in a token embedding;
each modality adds its own learned position embedding. Then an example's image tokens and caption tokens
form one sequence through one shared encoder. Attention is masked block-diagonally, so an image token
attends only to its image's tokens and a text token only to its caption's real (non-padding) tokens: the
two towers' computations, in one tower's weights. The MoE layers, though, route every token of the routing
group -- image patches and text pieces of several examples -- through one router that is not told the
modality, so the modalities compete for the same expert buffers (Sec. 2.2.1). Padding never takes a buffer
slot and never counts in a loss or a statistic. The final tokens are average-pooled per modality (padding
masked), linearly projected per modality and L2-normalised; the contrastive loss (Eq. 1, ``train.contrastive``)
compares them with a learned logit scale (``log_temperature``, initialised at log 10).

Either modality may be left out: ``model(images=...)`` embeds images only (zero-shot evaluation), and
``model(text=...)`` text only (class prompts); the MoE layers then route that modality's tokens alone.
"""

from __future__ import annotations

import contextlib
import math
from typing import Iterator, Sequence

import numpy as np

import jax
import jax.numpy as jnp
from flax import nnx, struct

from moe_course.configs.limoe import LIMoEConfig
from moe_course.data.tokenizer import PAD_ID
from moe_course.layers.block import LAYER_NORM_EPS, RESIDUAL_DTYPE, EncoderBlock
from moe_course.layers.multimodal_moe import MultimodalMoE
from moe_course.models.vit import PatchEmbed, count_params, precision
from moe_course.models.vmoe import sparse_moe_settings
from moe_course.routing import MODALITIES, PADDING, PRUNING_MODES
from moe_course.routing.checks import check_choice

IMAGE, TEXT = MODALITIES.index("image"), MODALITIES.index("text")


@struct.dataclass
class ContrastiveOutput:
    """What a one-tower model returns.

    image_embedding: (batch, embed_dim) float32, L2-normalised, or None without images; text_embedding the
    same for texts. log_temperature: scalar, log of the logit scale. aux_loss: scalar, the mean over MoE
    layers of their weighted aux losses (0 for the dense model). aux_terms: {loss name: scalar} each chosen
    loss unweighted, averaged over MoE layers. routing: one RoutingRecord per MoE layer, in block order.
    modality: (batch, tokens) int32 of the encoder sequence -- 0 image, 1 text, -1 padding -- the token
    order of the routing records (image tokens, then text tokens, per example).
    """

    image_embedding: jax.Array | None
    text_embedding: jax.Array | None
    log_temperature: jax.Array
    aux_loss: jax.Array
    aux_terms: dict = struct.field(default_factory=dict)
    routing: tuple = ()
    modality: jax.Array | None = None


def l2_normalise(x: jax.Array, eps: float = 1e-6) -> jax.Array:
    """x / max(||x||, eps) along the last axis."""
    return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), eps)


def masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    """Mean of x (batch, tokens, d) over the tokens where mask (batch, tokens) holds -> (batch, d)."""
    weights = mask.astype(x.dtype)[..., None]
    return jnp.sum(x * weights, axis=1) / jnp.maximum(jnp.sum(weights, axis=1), 1.0)


def one_tower_attention_mask(modality: jax.Array) -> jax.Array:
    """(batch, tokens) int modality ids (-1 padding) -> (batch, tokens, tokens) bool: a query attends to the
    real tokens of its own modality; every token also attends to itself (so a padding query has a key)."""
    same = modality[:, :, None] == modality[:, None, :]
    real_key = (modality != PADDING)[:, None, :]
    return (same & real_key) | jnp.eye(modality.shape[1], dtype=bool)[None]


class LIMoE(nnx.Module):
    """The one-tower image-text model of the module docstring, built from a ``LIMoEConfig``.

    Call: images (batch, S, S, C) float32 and/or text (batch, seq_len) int32 with text_mask (batch, seq_len)
    bool (None: every id != PAD_ID is real) -> ContrastiveOutput. With both, row j of images and text is
    pair j. ``batch`` must be a multiple of ``config.group_size`` when the model has MoE layers.
    Precision (``config.dtype`` / ``param_dtype``): the encoder's branches (attention, MLP or MoE) compute in
    ``dtype``; the residual stream (the patch and token embeddings and every block's x + f(x)) is float32, as in
    ``ViT``; the final LayerNorm's output, the pooling, the projections and the normalised embeddings are
    float32, so the contrastive logits and loss are float32, as the routers and their losses are.
    Raises ValueError for an invalid config (before any parameter is made), for no input, for inputs of the
    wrong shape, or for images and text of different batch sizes.
    """

    def __init__(self, config: LIMoEConfig, *, rngs: nnx.Rngs):
        config.validate()
        for field, allowed in (("posemb", "learned"), ("value_range", "unit")):
            if getattr(config, field) != allowed:
                raise ValueError(f"{field}={getattr(config, field)!r} is not available for LIMoE; use {allowed!r}")
        self.config = c = config
        init = nnx.initializers.normal(stddev=0.02)
        mixed = precision(c)
        param_dtype = mixed["param_dtype"]
        float32 = {"dtype": jnp.float32, "param_dtype": param_dtype}
        residual = {"dtype": RESIDUAL_DTYPE, "param_dtype": param_dtype}  # the embeddings start the stream (ViT)
        self.patch_embed = PatchEmbed(c.patch_size, c.channels, c.width, **residual, rngs=rngs)
        self.image_pos_embed = nnx.Param(init(rngs.params(), (1, c.num_patches, c.width), param_dtype))
        self.token_embed = nnx.Embed(c.vocab_size, c.width, embedding_init=init, **residual, rngs=rngs)
        self.text_pos_embed = nnx.Param(init(rngs.params(), (1, c.seq_len, c.width), param_dtype))
        self.blocks = nnx.List([
            EncoderBlock(c.width, c.heads, c.mlp_dim, dropout=c.dropout, rngs=rngs, mlp=self._mlp(block, rngs),
                         gelu=c.gelu, **mixed)
            for block in range(c.depth)
        ])
        self.norm = nnx.LayerNorm(c.width, epsilon=LAYER_NORM_EPS, **float32, rngs=rngs)
        self.image_proj = nnx.Linear(c.width, c.embed_dim, use_bias=False, **float32, rngs=rngs)
        self.text_proj = nnx.Linear(c.width, c.embed_dim, use_bias=False, **float32, rngs=rngs)
        self.log_temperature = nnx.Param(jnp.asarray(math.log(c.temperature_init), jnp.float32))

    def _mlp(self, block: int, rngs: nnx.Rngs) -> MultimodalMoE | None:
        c = self.config
        if block not in c.moe_blocks():
            return None
        return MultimodalMoE(c.width, c.mlp_dim, c.num_experts, losses=c.aux_losses, taus=c.taus,
                             joint=c.joint_aux_losses, **sparse_moe_settings(c, block), **precision(c), rngs=rngs)

    def moe_layers(self) -> list[MultimodalMoE]:
        """The MoE layers, in block order (empty for the dense one-tower model)."""
        return [block.mlp for block in self.blocks if isinstance(block.mlp, MultimodalMoE)]

    def _inputs(self, images, text, text_mask) -> tuple[list[jax.Array], list[jax.Array]]:
        """Per-modality token sequences (batch, n_m, width) with position embeddings, and their modality ids."""
        c = self.config
        tokens, ids = [], []
        if images is not None:
            expected = (c.image_size, c.image_size, c.channels)
            if tuple(images.shape[1:]) != expected:
                raise ValueError(f"images have shape {tuple(images.shape[1:])} per example; this model expects {expected}")
            patches = self.patch_embed(images)
            tokens.append(patches + self.image_pos_embed[...].astype(patches.dtype))
            ids.append(jnp.full((images.shape[0], c.num_patches), IMAGE, jnp.int32))
        if text is not None:
            if text.ndim != 2 or text.shape[1] != c.seq_len:
                raise ValueError(f"text has shape {tuple(text.shape)}; this model expects (batch, seq_len={c.seq_len})")
            if text_mask is None:
                text_mask = text != PAD_ID
            elif text_mask.shape != text.shape:
                raise ValueError(f"text_mask has shape {tuple(text_mask.shape)}; it must match text {tuple(text.shape)}")
            pieces = self.token_embed(text)
            tokens.append(pieces + self.text_pos_embed[...].astype(pieces.dtype))
            ids.append(jnp.where(text_mask, TEXT, PADDING).astype(jnp.int32))
        if not tokens:
            raise ValueError("images=None and text=None: give images, text or both")
        if len({t.shape[0] for t in tokens}) > 1:
            raise ValueError(f"images and text have different batch sizes {[t.shape[0] for t in tokens]}; row j of "
                             "both must be pair j")
        return tokens, ids

    def __call__(self, images: jax.Array | None = None, text: jax.Array | None = None,
                 text_mask: jax.Array | None = None, *, deterministic: bool = True,
                 rngs: nnx.Rngs | None = None) -> ContrastiveOutput:
        tokens, ids = self._inputs(images, text, text_mask)
        x = jnp.concatenate(tokens, axis=1)
        modality = jnp.concatenate(ids, axis=1)
        token_mask = modality != PADDING
        attention_mask = one_tower_attention_mask(modality)
        routing, aux_losses, aux_terms = [], [], []
        for block in self.blocks:
            x, _, moe = block(x, deterministic=deterministic, rngs=rngs, attention_mask=attention_mask,
                              token_mask=token_mask, modality=modality)
            if moe is not None:
                routing.append(moe.routing)
                aux_losses.append(moe.aux_loss)
                aux_terms.append(moe.aux_terms)
        x = self.norm(x)
        n_image = self.config.num_patches if images is not None else 0
        image_embedding = text_embedding = None
        if images is not None:
            image_embedding = l2_normalise(self.image_proj(jnp.mean(x[:, :n_image], axis=1)))
        if text is not None:
            text_embedding = l2_normalise(self.text_proj(masked_mean(x[:, n_image:], token_mask[:, n_image:])))
        aux = sum(aux_losses) / len(aux_losses) if aux_losses else jnp.zeros((), jnp.float32)
        terms = {k: sum(t[k] for t in aux_terms) / len(aux_terms) for k in (aux_terms[0] if aux_terms else {})}
        return ContrastiveOutput(image_embedding, text_embedding, self.log_temperature[...], aux, terms,
                                 tuple(routing), modality)


@contextlib.contextmanager
def pruned_experts(model: LIMoE, keep: Sequence, mode: str = "router_pred") -> Iterator[LIMoE]:
    """``with pruned_experts(model, keep): ...`` -- inference with only some experts of each MoE layer (LIMoE
    App. E.4: prune the experts a modality hardly uses before a single-modality forward pass).

    keep: one (experts,) bool array per MoE layer (in block order), True for the experts that stay; at least
    k per layer. mode: "router_drop" (the softmax runs over the kept experts) or "router_pred" (the router's
    probabilities over all experts, TOP_k among the kept ones); see ``routing.pruned_top_k_routing``. The
    weights are untouched, the next call re-traces, and the full model is back when the block ends (also
    after an error). Raises ValueError for an unknown mode, a keep list of the wrong length, a mask of the
    wrong shape or one with fewer than k experts, before anything is changed.
    """
    check_choice("mode", mode, PRUNING_MODES)
    layers = model.moe_layers()
    if len(keep) != len(layers):
        raise ValueError(f"keep has {len(keep)} masks; the model has {len(layers)} MoE layers: give one per layer")
    masks = [np.asarray(mask, bool) for mask in keep]
    for i, (layer, mask) in enumerate(zip(layers, masks)):
        if mask.shape != (layer.num_experts,) or mask.sum() < layer.k:
            raise ValueError(f"keep[{i}] has shape {mask.shape} with {int(mask.sum())} kept experts; it must be "
                             f"({layer.num_experts},) with at least k={layer.k} True")
    for layer, mask in zip(layers, masks):
        layer.expert_keep, layer.pruning_mode = tuple(bool(v) for v in mask), mode
    try:
        yield model
    finally:
        for layer in layers:
            layer.expert_keep = None


def limoe_param_count(config: LIMoEConfig) -> int:
    """Parameter count of ``LIMoE(config)`` without allocating it."""
    return count_params(lambda: LIMoE(config.validate(), rngs=nnx.Rngs(0)))
