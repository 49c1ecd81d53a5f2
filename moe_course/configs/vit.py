"""Named, typed Vision Transformer configurations: the papers' architectures and small CPU presets.

Paper sizes follow V-MoE (Riquelme et al. 2021) Table 7: S (8 blocks, 8 heads, width 512, MLP 2048),
B (12, 12, 768, 3072), L (24, 16, 1024, 4096), H (32, 16, 1280, 5120), with patch sizes 32/16/14, a
class token, a pre-logits layer of the model's width and an 18,291-way JFT-300M head at 224x224 -- the
setting Table 7's parameter counts refer to.
DeiT-Ti/S (Touvron et al. 2021) are the backbones A-MoD (Gadhikar et al. 2024) adapts, with an
ImageNet-1k head.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from moe_course.checks import check_choices, check_integers, check_number, check_text, replace_validated

POOLS = ("cls", "gap")
GELUS = ("exact", "tanh")
# Flax's two precision fields (``dtype``: computation, ``param_dtype``: parameters), as names so that configs stay
# JSON-ready. MaxText and big_vision train in bfloat16 with float32 parameters and optimizer state.
DTYPES = ("float32", "bfloat16")
POSEMBS = ("learned", "sincos2d")
VALUE_RANGES = ("unit", "signed")
JFT_CLASSES = 18291


@dataclass(frozen=True)
class ViTConfig:
    """A dense ViT (Dosovitskiy et al. 2021) as used throughout the course.

    image_size: input side in pixels (square images). patch_size: patch side in pixels; must divide
    image_size. channels: input channels. width: token dimension D. depth: encoder blocks. heads: attention
    heads; must divide width. mlp_dim: hidden size of each block's MLP. num_classes: classifier outputs.
    pool: "cls" (class token) or "gap" (global average pooling of the final tokens). representation_size:
    width of the pre-logits layer (Dense + tanh) used for JFT-300M pre-training, or None for no such layer.
    dropout: dropout rate after attention/MLP (training only). gelu: the GELU of every MLP and expert,
    "exact" (erf, the course's default) or "tanh" (its tanh approximation, ``flax.linen.gelu``'s default, which
    big_vision's and vmoe's released checkpoints were trained with; ``moe_course.reference`` sets it).
    dtype: the computation dtype of the blocks' matrix products, "float32" or "bfloat16" (Flax's ``dtype``). Kept
    in float32 whatever it says, as vmoe and big_vision keep them: the residual stream (patch embedding and
    every block's x + f(x), as vmoe's; ``layers.block.RESIDUAL_DTYPE``), router logits, softmaxes, top-k and
    priorities, the auxiliary, entropy and contrastive losses, LayerNorm statistics, attention softmaxes and the
    logits.
    param_dtype: the dtype parameters are stored (and optimised) in, "float32" (default) or "bfloat16".
    Mixed precision as the reference code runs it is dtype="bfloat16" with param_dtype="float32".
    posemb: "learned" (position embeddings trained from a normal(0.02) start, the default) or "sincos2d"
    (the fixed 2-d sine-cosine table of big_vision ``models/vit.py`` ``posemb_sincos_2d``, temperature 10,000,
    "Better plain ViT baselines", Beyer et al. 2022; never updated by training; needs width % 4 == 0).
    value_range: the pixel range the encoder sees: "unit" (the [0, 1] the datasets give, the default) or
    "signed" (the model maps [0, 1] to [-1, 1] before the patch embedding, big_vision's ``value_range(-1, 1)``
    of every ImageNet recipe).
    """

    name: str = "custom"
    image_size: int = 224
    patch_size: int = 16
    channels: int = 3
    width: int = 768
    depth: int = 12
    heads: int = 12
    mlp_dim: int = 3072
    num_classes: int = 1000
    pool: str = "cls"
    representation_size: int | None = None
    dropout: float = 0.0
    gelu: str = "exact"
    dtype: str = "float32"
    param_dtype: str = "float32"
    posemb: str = "learned"
    value_range: str = "unit"

    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {"pool": POOLS, "gelu": GELUS, "dtype": DTYPES,
                                                     "param_dtype": DTYPES, "posemb": POSEMBS,
                                                     "value_range": VALUE_RANGES}

    @property
    def num_patches(self) -> int:
        """Patch tokens per image: (image_size / patch_size) ** 2."""
        return (self.image_size // self.patch_size) ** 2

    @property
    def num_tokens(self) -> int:
        """Tokens the encoder sees per image: the patches, plus one class token when ``pool="cls"``."""
        return self.num_patches + (1 if self.pool == "cls" else 0)

    def replace(self, **changes) -> "ViTConfig":
        """A copy with ``changes`` applied, validated. Unknown fields raise ValueError."""
        return replace_validated(self, changes)

    def validate(self) -> "ViTConfig":
        """Returns self, or raises ValueError naming the field, its value and what is allowed."""
        check_text(self, "name")
        check_integers(self, ("image_size", "patch_size", "channels", "width", "depth", "heads", "mlp_dim",
                              "num_classes"), minimum=1)
        if self.image_size % self.patch_size:
            divisors = [d for d in range(1, self.image_size + 1) if self.image_size % d == 0]
            raise ValueError(
                f"patch_size={self.patch_size} does not divide image_size={self.image_size}; "
                f"allowed patch sizes: {divisors}"
            )
        if self.width % self.heads:
            raise ValueError(f"heads={self.heads} does not divide width={self.width}; use a divisor of width")
        check_integers(self, ("representation_size",), minimum=1, optional=True)
        check_choices(self)
        if self.posemb == "sincos2d" and self.width % 4:
            raise ValueError(f"width={self.width} is not allowed with posemb='sincos2d'; use a multiple of 4 "
                             f"(sine and cosine of both grid axes)")
        check_number(self, "dropout", minimum=0, maximum=1, below_maximum=True)
        return self


def backbone_of(config: ViTConfig) -> ViTConfig:
    """The dense ViT with the same backbone as ``config`` of any family (V-MoE, Soft MoE, MoD): its ViTConfig
    fields, name included, and nothing else."""
    return ViTConfig(**{f.name: getattr(config, f.name) for f in dataclasses.fields(ViTConfig)})


def _paper(size: str, patch: int, depth: int, heads: int, width: int, mlp: int) -> ViTConfig:
    return ViTConfig(
        name=f"vit-{size}/{patch}", image_size=224, patch_size=patch, width=width, depth=depth,
        heads=heads, mlp_dim=mlp, num_classes=JFT_CLASSES, representation_size=width,
    )


# The parameter-bound CPU regime (docs/results.md, "Where experts pay"): which of the source glyphs is on the canvas
# (``load_dataset("digit-glyphs")``, one class per glyph). digits-tiny's backbone; the V-MoE, Experts Choice and
# Soft MoE presets "glyphs-tiny-*" differ from it only in the MLPs of the MoE blocks, at equal forward FLOPs.
GLYPHS_TINY = ViTConfig(
    name="glyphs-tiny", image_size=32, patch_size=8, channels=1, width=64, depth=4, heads=4, mlp_dim=128,
    num_classes=800, pool="gap",  # = 10 * data.registry.GLYPHS_PER_DIGIT
)

# big_vision's ViT-S/16 as configs/vit_s16_i1k.py trains it (moe_course.recipes, I1K_SOURCE): variant 'S/16'
# (big_vision models/vit.py: width 384, depth 12, MLP 1536, 6 heads), pool_type 'gap', posemb 'sincos2d',
# rep_size True (a pre-logits layer of the width), flax.linen.gelu (tanh), pp value_range(-1, 1), 1000 classes.
VIT_S16_I1K = ViTConfig(
    name="vit-s/16-i1k", image_size=224, patch_size=16, width=384, depth=12, heads=6, mlp_dim=1536,
    num_classes=1000, pool="gap", representation_size=384, gelu="tanh", posemb="sincos2d", value_range="signed",
)
# The same architecture family at CPU size, for the i1k recipe's tiny run (64 px, 10 classes).
I1K_TINY = VIT_S16_I1K.replace(name="i1k-tiny", image_size=64, width=64, depth=2, heads=2, mlp_dim=256,
                               num_classes=10, representation_size=64)

_SIZES = {"s": (8, 8, 512, 2048), "b": (12, 12, 768, 3072), "l": (24, 16, 1024, 4096), "h": (32, 16, 1280, 5120)}

VIT_PRESETS: dict[str, ViTConfig] = {
    cfg.name: cfg
    for cfg in [
        # V-MoE Table 7 (JFT-300M head).
        *(_paper(s, p, *_SIZES[s]) for s, p in [("s", 32), ("b", 32), ("b", 16), ("l", 32), ("l", 16), ("h", 14)]),
        # A-MoD backbones (ImageNet-1k head).
        ViTConfig(name="deit-ti/16", width=192, depth=12, heads=3, mlp_dim=768, num_classes=1000),
        ViTConfig(name="deit-s/16", width=384, depth=12, heads=6, mlp_dim=1536, num_classes=1000),
        # big_vision's ImageNet-1k ViT-S/16 (recipe: moe_course.recipes) and its CPU-size twin.
        VIT_S16_I1K,
        I1K_TINY,
        # CPU presets on the 32x32 cluttered digits.
        ViTConfig(
            name="digits-tiny", image_size=32, patch_size=8, channels=1, width=64, depth=4, heads=4,
            mlp_dim=128, num_classes=10, pool="gap",
        ),
        GLYPHS_TINY,
        # Chapter 6's backbone (Mixture-of-Depths needs tokens to choose from): digits-tiny on 24x24 canvases
        # (DigitsConfig.for_image_size(24)) in 4x4-pixel patches, 36 tokens.
        ViTConfig(
            name="digits-24-p4", image_size=24, patch_size=4, channels=1, width=64, depth=4, heads=4,
            mlp_dim=128, num_classes=10, pool="gap",
        ),
        ViTConfig(
            name="digits-small", image_size=32, patch_size=4, channels=1, width=96, depth=6, heads=4,
            mlp_dim=192, num_classes=10, pool="gap",
        ),
    ]
}
