"""Named Mixture-of-Depths ViT configurations (A-MoD, Gadhikar et al. 2024): a ViT whose every other block
(or only its later ones, Sec. 4.5) processes just a fraction C of the tokens.

A-MoD adapts pretrained DeiT-Ti/S and ViT-B/L (ImageNet-1k) at 50% and 12.5% capacity; the presets below are
those backbones with an MoD block in every second block (blocks 1, 3, 5, ... counted from 0, so the first
block is dense and hands its attention maps to the first MoD block), plus a CPU preset on the digits with 64
patch tokens, so that 12.5% capacity still keeps 8 of them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import ClassVar

from moe_course.checks import check_choices, check_integers
from moe_course.configs.vit import VIT_PRESETS, ViTConfig, backbone_of
from moe_course.routing.mod import MOD_ROUTERS, mod_capacity

MOD_PLACEMENTS = ("every-2", "last-n")
PAPER_CAPACITIES = (0.5, 0.125)


@dataclass(frozen=True)
class MoDConfig(ViTConfig):
    """A MoD ViT: every field of ViTConfig plus the MoD blocks' settings.

    capacity: C in (0, 1], the fraction of an image's tokens each MoD block processes (class token included
    and always kept). router: "attention" (A-MoD Eq. 3-5: the previous block's attention received, no
    parameters) or "standard" (Eq. 1-2: a linear router whose bounded score gates the update).
    mod_placement: "every-2" (blocks 1, 3, 5, ...) or "last-n" (the last ``mod_last_n`` of those).
    """

    capacity: float = 0.5
    router: str = "attention"
    mod_placement: str = "every-2"
    mod_last_n: int = 2

    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {
        **ViTConfig.CHOICES, "router": MOD_ROUTERS, "mod_placement": MOD_PLACEMENTS}

    def mod_blocks(self) -> tuple[int, ...]:
        """Indices (from 0) of the MoD blocks. Block 0 is never one: attention routing needs a previous block."""
        candidates = tuple(range(1, self.depth, 2))
        return candidates if self.mod_placement == "every-2" else candidates[len(candidates) - self.mod_last_n:]

    def validate(self) -> "MoDConfig":
        """Returns self, or raises ValueError naming the field, its value and what is allowed."""
        super().validate()
        mod_capacity(self.num_tokens, self.capacity)
        check_choices(self)
        if self.depth < 2:
            raise ValueError(f"depth={self.depth} is not allowed for a MoD ViT; use depth >= 2 (block 0 stays dense)")
        check_integers(self, ("mod_last_n",), minimum=1)
        if self.mod_placement == "last-n":
            odd_blocks = len(range(1, self.depth, 2))
            if self.mod_last_n > odd_blocks:
                raise ValueError(f"mod_last_n={self.mod_last_n} is not allowed for depth={self.depth}; "
                                 f"use 1 <= mod_last_n <= {odd_blocks}")
        return self


def mod_config_from_vit(vit: ViTConfig, **mod_fields) -> MoDConfig:
    """The MoD version of a dense ViT config: the same architecture (so its weights fit) plus ``mod_fields``
    (capacity, router, mod_placement, mod_last_n; also dtype, the computation dtype, which the weights do not
    depend on). Raises ValueError for a bad field."""
    return MoDConfig(**{**asdict(backbone_of(vit)), **mod_fields}).validate()


def _preset(backbone: ViTConfig, capacity: float) -> MoDConfig:
    return mod_config_from_vit(backbone, capacity=capacity).replace(name=f"mod-{backbone.name}-c{capacity}")


_IMAGENET = {name: VIT_PRESETS[name].replace(num_classes=1000, representation_size=None)
             for name in ("deit-ti/16", "deit-s/16", "vit-b/16", "vit-l/16")}

MOD_PRESETS: dict[str, MoDConfig] = {
    cfg.name: cfg
    for cfg in [
        *(_preset(backbone, c) for backbone in _IMAGENET.values() for c in PAPER_CAPACITIES),
        *(_preset(VIT_PRESETS["digits-small"], c) for c in PAPER_CAPACITIES),
    ]
}
