"""The dense Vision Transformer (Dosovitskiy et al. 2021; SPEC Sec. 1), built from a ViTConfig."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from moe_course.configs.vit import ViTConfig
from moe_course.layers.block import LAYER_NORM_EPS, RESIDUAL_DTYPE, EncoderBlock
from moe_course.models.output import ModelOutput


def patchify(images: jax.Array, patch_size: int) -> jax.Array:
    """Cut images into non-overlapping patches, row-major over the patch grid.

    images: (batch, height, width, channels) -> (batch, (height/p)*(width/p), p*p*channels).
    """
    b, h, w, c = images.shape
    p = patch_size
    x = images.reshape(b, h // p, p, w // p, p, c).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(b, (h // p) * (w // p), p * p * c)


def sincos2d_position_embeddings(side: int, width: int, temperature: float = 10_000.0) -> np.ndarray:
    """The fixed 2-d sine-cosine position embeddings of a ``side`` x ``side`` patch grid: (1, side**2, width)
    float32, row-major over the grid, columns [sin(x w), cos(x w), sin(y w), cos(y w)] with the width/4
    frequencies w_i = temperature ** -(i / (width/4 - 1)) (x: column, y: row) -- big_vision ``models/vit.py``
    ``posemb_sincos_2d`` (MoCo v3's). Raises ValueError unless width is a multiple of 4 and at least 8."""
    if width % 4 or width < 8:
        raise ValueError(f"width={width} is not allowed for sincos2d position embeddings; use a multiple of 4, >= 8")
    y, x = np.mgrid[:side, :side]
    quarter = width // 4
    omega = 1.0 / temperature ** (np.arange(quarter) / (quarter - 1))
    y, x = np.outer(y.ravel(), omega), np.outer(x.ravel(), omega)
    return np.concatenate([np.sin(x), np.cos(x), np.sin(y), np.cos(y)], axis=1)[None].astype(np.float32)


def fixed_position_embeddings(config: ViTConfig) -> np.ndarray:
    """The constant position embeddings of a ``posemb="sincos2d"`` config: (1, num_tokens, width) float32, the
    sincos2d table of the config's patch grid with a zero class-token entry in front where pool="cls" (big_vision
    adds the position embeddings before it prepends the class token). Not a parameter: big_vision's ``get_posemb``
    recomputes the table in every call and its checkpoints hold none. Raises ValueError for a learned config."""
    if config.posemb != "sincos2d":
        raise ValueError(f"posemb={config.posemb!r} has no fixed table; only 'sincos2d' does")
    table = sincos2d_position_embeddings(config.image_size // config.patch_size, config.width)
    if config.pool == "cls":
        table = np.concatenate([np.zeros((1, 1, config.width), np.float32), table], axis=1)
    return table


def precision(config: ViTConfig) -> dict:
    """The layers' precision keywords from a model config of any family: {"dtype": computation dtype,
    "param_dtype": parameter dtype}, both ``numpy.dtype`` (Flax's two fields; see ``ViTConfig``)."""
    return {"dtype": jnp.dtype(config.dtype), "param_dtype": jnp.dtype(config.param_dtype)}


class PatchEmbed(nnx.Module):
    """A strided convolution (kernel = stride = patch size): each patch becomes one width-D token.

    images (batch, H, W, C) -> tokens (batch, (H/p)*(W/p), width) in ``dtype``, row-major over the patch grid.
    """

    def __init__(self, patch_size: int, channels: int, width: int, *, dtype=jnp.float32, param_dtype=jnp.float32,
                 rngs: nnx.Rngs):
        p = patch_size
        self.proj = nnx.Conv(channels, width, kernel_size=(p, p), strides=(p, p), padding="VALID", dtype=dtype,
                             param_dtype=param_dtype, rngs=rngs)

    def __call__(self, images: jax.Array) -> jax.Array:
        x = self.proj(images)
        return x.reshape(x.shape[0], -1, x.shape[-1])


class ViT(nnx.Module):
    """Patch embedding + position embeddings (learned: the Param ``pos_embed``; sincos2d: a constant, and
    ``pos_embed`` is None) (+ class token) -> pre-LN encoder -> LayerNorm -> head. With
    ``config.value_range="signed"`` the images are mapped from [0, 1] to [-1, 1] first.

    Call: images (batch, image_size, image_size, channels) float32 -> ModelOutput with logits
    (batch, num_classes); ``return_attention=True`` also fills ``attention`` with one
    (batch, heads, tokens, tokens) map per block (class token first when pool="cls").
    Precision (``config.dtype`` / ``config.param_dtype``): the blocks' branches (attention, MLP or MoE) compute
    in ``dtype``; the residual stream -- the patch embedding, the embedded tokens and every block's x + f(x) --
    is float32 whatever ``dtype`` says (``layers.block.RESIDUAL_DTYPE``), as vmoe's ``VisionTransformerMoe``
    under ``encoder.dtype`` computes it (nn/vit_moe.py); the final LayerNorm's output, the pooling, the
    pre-logits layer and the head are float32, so the logits are float32 (as big_vision's head).
    Raises ValueError (from ViTConfig.validate) for an invalid config, before any parameter is made.
    """

    def __init__(self, config: ViTConfig, *, rngs: nnx.Rngs):
        config.validate()
        self.config = config
        d = config.width
        param_dtype = precision(config)["param_dtype"]
        # float32 like vmoe's ``embedding`` Conv (no dtype): the residual stream starts here (``RESIDUAL_DTYPE``)
        self.patch_embed = PatchEmbed(config.patch_size, config.channels, d, dtype=RESIDUAL_DTYPE,
                                      param_dtype=param_dtype, rngs=rngs)
        # learned: a normal(0.02) start; sincos2d: no state at all (``embed`` adds ``fixed_position_embeddings``),
        # so neither the parameter count, the optimizer nor a checkpoint holds the fixed table
        self.pos_embed = (nnx.Param(nnx.initializers.normal(stddev=0.02)(
            rngs.params(), (1, config.num_tokens, d), param_dtype)) if config.posemb == "learned" else None)
        self.cls_token = nnx.Param(jnp.zeros((1, 1, d), param_dtype)) if config.pool == "cls" else None
        self.blocks = nnx.List([self.make_block(i, rngs) for i in range(config.depth)])
        float32 = {"dtype": jnp.float32, "param_dtype": param_dtype}
        self.norm = nnx.LayerNorm(d, epsilon=LAYER_NORM_EPS, **float32, rngs=rngs)
        rep = config.representation_size
        self.pre_logits = nnx.Linear(d, rep, **float32, rngs=rngs) if rep else None
        self.head = nnx.Linear(rep or d, config.num_classes, kernel_init=nnx.initializers.zeros_init(), **float32,
                               rngs=rngs)

    def make_block(self, block: int, rngs: nnx.Rngs) -> nnx.Module:
        """Encoder block number ``block`` (from 0). Subclasses (MoD) return other kinds of blocks here."""
        c = self.config
        return EncoderBlock(c.width, c.heads, c.mlp_dim, dropout=c.dropout, rngs=rngs, mlp=self.make_mlp(block, rngs),
                            gelu=c.gelu, **precision(c))

    def make_mlp(self, block: int, rngs: nnx.Rngs) -> nnx.Module | None:
        """The MLP of block ``block``: None = the dense MLP. Subclasses (V-MoE) return MoE layers here."""
        return None

    def reduce_aux_losses(self, losses: list[jax.Array]) -> jax.Array:
        """The model's aux loss from its routed layers' (scalar) aux losses: 0 for a dense ViT; V-MoE overrides."""
        return jnp.zeros((), jnp.float32)

    def embed(self, images: jax.Array) -> jax.Array:
        """images -> tokens (batch, num_tokens, width) float32 (the residual stream) with position embeddings (and
        class token) added."""
        expected = (self.config.image_size, self.config.image_size, self.config.channels)
        if tuple(images.shape[1:]) != expected:
            raise ValueError(f"images have shape {tuple(images.shape[1:])} per example; this model expects {expected}")
        if self.config.value_range == "signed":  # big_vision's value_range(-1, 1)
            images = images * 2.0 - 1.0
        x = self.patch_embed(images)
        if self.cls_token is not None:
            cls = self.cls_token[...].astype(x.dtype)
            x = jnp.concatenate([jnp.broadcast_to(cls, (x.shape[0], 1, x.shape[-1])), x], axis=1)
        if self.pos_embed is None:  # sincos2d: a constant of the traced program
            return x + jnp.asarray(fixed_position_embeddings(self.config), x.dtype)
        return x + self.pos_embed[...].astype(x.dtype)

    def pool(self, x: jax.Array) -> jax.Array:
        """Final normalised tokens (batch, tokens, width) -> image representation (batch, width or
        representation_size)."""
        x = x[:, 0] if self.config.pool == "cls" else x.mean(axis=1)
        return jnp.tanh(self.pre_logits(x)) if self.pre_logits is not None else x

    def __call__(self, images: jax.Array, *, deterministic: bool = True, rngs: nnx.Rngs | None = None,
                 return_attention: bool = False) -> ModelOutput:
        x = self.embed(images)
        maps, routing, aux_losses = [], [], []
        for block in self.blocks:
            x, weights, moe = block(x, deterministic=deterministic, rngs=rngs, return_attention=return_attention)
            maps.append(weights)
            if moe is not None:
                routing.append(moe.routing)
                aux_losses.append(moe.aux_loss)
        aux_loss = self.reduce_aux_losses(aux_losses)
        logits = self.head(self.pool(self.norm(x)))
        return ModelOutput(logits=logits, aux_loss=aux_loss, attention=tuple(maps) if return_attention else (),
                           routing=tuple(routing))


def truncated_vit(vit: ViT, depth: int) -> ViT:
    """The dense ViT made of the first ``depth`` blocks of ``vit``: an isoFLOP baseline "obtained by reducing the
    number of layers" (A-MoD, Gadhikar et al. 2024, Sec. 4.1), so that it still starts from pretrained weights.

    vit: a dense ``ViT``. depth: blocks kept, 1 <= depth <= vit.config.depth (``analysis.isoflop_depth`` picks
    it for a FLOP budget). The patch and position embeddings, class token, blocks 0..depth-1, final LayerNorm
    and head are copied bit-identical; the config is ``vit.config`` with ``depth`` and the name
    ``"<name>-depth<depth>"``. Raises ValueError for a model that is not a dense ViT or a depth out of range.
    """
    if type(vit) is not ViT:
        raise ValueError(f"model is a {type(vit).__name__}; only a dense ViT (moe_course.models.ViT) is truncated")
    full = vit.config.depth
    if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= full:
        raise ValueError(f"depth={depth!r} is not allowed; use an integer from 1 to the model's depth {full}")
    config = vit.config.replace(depth=depth, name=f"{vit.config.name}-depth{depth}")
    model = nnx.eval_shape(lambda: ViT(config, rngs=nnx.Rngs(0)))
    state = nnx.state(vit)
    state["blocks"] = {i: state["blocks"][i] for i in range(depth)}
    nnx.update(model, state)
    return model


def count_params(build) -> int:
    """Parameters of the module ``build()`` would make, counted from shapes only (no memory allocated)."""
    abstract = nnx.eval_shape(build)
    return sum(math.prod(v.shape) for v in jax.tree.leaves(nnx.state(abstract, nnx.Param)))


def vit_param_count(config: ViTConfig) -> int:
    """Parameter count of ``ViT(config)`` without allocating it."""
    return count_params(lambda: ViT(config.validate(), rngs=nnx.Rngs(0)))
