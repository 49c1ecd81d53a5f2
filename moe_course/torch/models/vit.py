"""PyTorch twin of ``moe_course.models.vit``: the dense Vision Transformer, built from the same ViTConfig."""

from __future__ import annotations

import torch

from moe_course.configs.vit import ViTConfig
from moe_course.layers.block import LAYER_NORM_EPS
from moe_course.models.output import ModelOutput
from moe_course.models.vit import fixed_position_embeddings
from moe_course.torch.layers.block import EncoderBlock
from moe_course.torch.layers.init import lecun_normal_, linear
from moe_course.torch.precision import float32_region


class PatchEmbed(torch.nn.Module):
    """A strided convolution (kernel = stride = patch size): images (batch, C, H, W) -> tokens (batch,
    (H/p)*(W/p), width) float32, row-major over the patch grid (the JAX model's token order). It runs with
    autocast off: the float32 residual stream starts here, as in the JAX model (``layers.block.RESIDUAL_DTYPE``)."""

    def __init__(self, patch_size: int, channels: int, width: int):
        super().__init__()
        self.proj = torch.nn.Conv2d(channels, width, kernel_size=patch_size, stride=patch_size)
        lecun_normal_(self.proj.weight, channels * patch_size**2)
        torch.nn.init.zeros_(self.proj.bias)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """images: (batch, channels, height, width) -> patch embeddings (batch, patches, width) float32."""
        with float32_region(images):
            return self.proj(images.float()).flatten(2).transpose(1, 2)


class ViT(torch.nn.Module):
    """The twin of ``moe_course.models.ViT``: patch embedding + position embeddings (+ class token) -> pre-LN
    encoder -> LayerNorm -> head, with the same parameter names (``moe_course.torch.convert`` maps them).

    forward: images (batch, channels, image_size, image_size) float32 -- NCHW, PyTorch's layout; the JAX
    model takes NHWC, ``images.permute(0, 3, 1, 2)`` -> ``ModelOutput`` (torch tensors) with logits
    (batch, num_classes) and, with ``return_attention``, one (batch, heads, tokens, tokens) map per block.
    ``generator`` draws router noise in training mode (MoE models). Under ``torch.autocast`` (what a config's
    dtype="bfloat16" means here, ``moe_course.torch.precision.autocast_for``) the residual stream (patch
    embedding, embedded tokens, every block's x + f(x): autocast's LayerNorm outputs are float32 and a float32
    tensor plus a bfloat16 one is float32) and the final LayerNorm, pooling, pre-logits and head are float32,
    so the logits are float32; the blocks' branches compute in bfloat16, as in the JAX model. Raises ValueError
    for an invalid config (ViTConfig.validate) and for images of another shape.
    """

    def __init__(self, config: ViTConfig):
        super().__init__()
        config.validate()
        self.config = config
        d = config.width
        self.patch_embed = PatchEmbed(config.patch_size, config.channels, d)
        if config.posemb == "sincos2d":  # the fixed table: a buffer outside the state dict, as the JAX constant
            self.register_buffer("pos_embed", torch.from_numpy(fixed_position_embeddings(config)), persistent=False)
        else:
            self.pos_embed = torch.nn.Parameter(torch.randn(1, config.num_tokens, d) * 0.02)
        self.cls_token = torch.nn.Parameter(torch.zeros(1, 1, d)) if config.pool == "cls" else None
        self.blocks = torch.nn.ModuleList([self.make_block(i) for i in range(config.depth)])
        self.norm = torch.nn.LayerNorm(d, eps=LAYER_NORM_EPS)
        rep = config.representation_size
        self.pre_logits = linear(d, rep) if rep else None
        self.head = torch.nn.Linear(rep or d, config.num_classes)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    def make_block(self, block: int) -> torch.nn.Module:
        """Encoder block number ``block`` (from 0); MoD returns other kinds of blocks here."""
        c = self.config
        return EncoderBlock(c.width, c.heads, c.mlp_dim, dropout=c.dropout, mlp=self.make_mlp(block), gelu=c.gelu)

    def make_mlp(self, block: int) -> torch.nn.Module | None:
        """The MLP of block ``block``: None = the dense MLP; V-MoE returns MoE layers here."""
        return None

    def reduce_aux_losses(self, losses: list[torch.Tensor]) -> torch.Tensor:
        """The model's aux loss from its routed layers' aux losses: 0 for a dense ViT."""
        return torch.zeros(())

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """images (batch, C, H, W) -> tokens (batch, num_tokens, width) with position embeddings (and class token)."""
        expected = (self.config.channels, self.config.image_size, self.config.image_size)
        if tuple(images.shape[1:]) != expected:
            raise ValueError(f"images have shape {tuple(images.shape[1:])} per example; this model expects {expected} "
                             f"(channels first)")
        if self.config.value_range == "signed":  # big_vision's value_range(-1, 1), as the JAX model
            images = images * 2.0 - 1.0
        x = self.patch_embed(images)
        if self.cls_token is not None:
            x = torch.cat([self.cls_token.expand(x.shape[0], 1, x.shape[-1]), x], dim=1)
        return x + self.pos_embed

    def pool(self, x: torch.Tensor) -> torch.Tensor:
        """Final normalised tokens (batch, tokens, width) -> image representation."""
        x = x[:, 0] if self.config.pool == "cls" else x.mean(dim=1)
        return torch.tanh(self.pre_logits(x)) if self.pre_logits is not None else x

    def final_logits(self, x: torch.Tensor) -> torch.Tensor:
        """Encoder output (batch, tokens, width) -> logits (batch, classes) float32: final LayerNorm, pooling,
        pre-logits and head with autocast off."""
        with float32_region(x):
            return self.head(self.pool(self.norm(x.float())))

    def forward(self, images: torch.Tensor, *, generator: torch.Generator | None = None,
                return_attention: bool = False) -> ModelOutput:
        """images: (batch, channels, height, width) -> ModelOutput: logits (batch, classes), the aux loss of
        ``reduce_aux_losses`` (0 for a dense ViT), attention weights per block (if asked), routing records."""
        x = self.embed(images)
        maps, routing, aux_losses = [], [], []
        for block in self.blocks:
            x, weights, moe = block(x, generator=generator, return_attention=return_attention)
            maps.append(weights)
            if moe is not None:
                routing.append(moe.routing)
                aux_losses.append(moe.aux_loss)
        logits = self.final_logits(x)
        return ModelOutput(logits=logits, aux_loss=self.reduce_aux_losses(aux_losses),
                           attention=tuple(maps) if return_attention else (), routing=tuple(routing))
