"""Soft MoE ViT configurations (Puigcerver et al., "From Sparse to Soft Mixtures of Experts").

A ``SoftMoEConfig`` is a ``VMoEConfig`` plus the router kind, so one config family describes the Soft MoE
model and its same-backbone baselines: ``router="soft"`` puts a Soft MoE layer (``slots_per_expert`` slots
per expert, one routing group per image) in the blocks ``moe_blocks()`` names; ``router="sparse"`` puts
V-MoE's ``SparseMoE`` there instead, with ``allocation`` choosing Tokens Choice ("vanilla" / "bpr" /
"skip_patch": each token picks its top-k experts) or Experts Choice ("experts_choice": each expert picks its
top tokens), both with capacity-limited buffers over routing groups of ``group_size`` images. Everything
else -- patch embedding, blocks, widths, expert shapes, head -- is the same. With the dense ViT of the same
backbone this gives the four models of the paper's Fig. 3.

Paper sizes: the standard ViT S/16 (12 blocks, 6 heads, width 384, MLP 1536), B/16 (12, 12, 768, 3072) and
L/16 (24, 16, 1024, 4096) at 224x224, with Soft MoE layers of 128 experts and one slot per expert in every
block of the second half (Sec. 3 of the paper; SPEC Sec. 4). They carry an ImageNet-1k head (the paper
pre-trains on JFT-4B, whose head we do not reproduce).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from moe_course.checks import check_integers
from moe_course.configs.vit import GLYPHS_TINY, VIT_S16_I1K
from moe_course.configs.vmoe import GLYPHS_MOE, VMoEConfig

ROUTERS = ("soft", "sparse")
SOFT_MOE_EXPERTS = 128


@dataclass(frozen=True)
class SoftMoEConfig(VMoEConfig):
    """Every field of VMoEConfig, plus:

    router: "soft" (Soft MoE layers) or "sparse" (V-MoE's SparseMoE; the VMoEConfig routing fields apply).
    slots_per_expert: p, slots each expert processes per image (soft router only); the layer has
    num_experts * p slots. With router="soft", group_size does not matter to the model (every image is its
    own group); it still must divide the batch sizes. k, capacity_ratio, allocation, noise and the auxiliary
    loss are ignored by the soft router.
    """

    router: str = "soft"
    slots_per_expert: int = 1
    placement: str = "second-half"

    @property
    def num_slots(self) -> int:
        """Slots per Soft MoE layer and image, n * p."""
        return self.num_experts * self.slots_per_expert

    def validate(self) -> "SoftMoEConfig":
        """Returns self, or raises ValueError naming the field, its value and what is allowed."""
        super().validate()
        check_integers(self, ("slots_per_expert",), minimum=1)
        if self.router not in ROUTERS:
            raise ValueError(f"router={self.router!r} is not allowed; use one of {', '.join(map(repr, ROUTERS))}")
        return self


def _paper(size: str, width: int, depth: int, heads: int, mlp: int) -> SoftMoEConfig:
    return SoftMoEConfig(
        name=f"soft-moe-{size}/16", image_size=224, patch_size=16, width=width, depth=depth, heads=heads,
        mlp_dim=mlp, num_classes=1000, num_experts=SOFT_MOE_EXPERTS, slots_per_expert=1, group_size=1,
    )


SOFT_MOE_PRESETS: dict[str, SoftMoEConfig] = {
    cfg.name: cfg
    for cfg in [
        _paper("s", 384, 12, 6, 1536),
        _paper("b", 768, 12, 12, 3072),
        _paper("l", 1024, 24, 16, 4096),
        # CPU preset on the 32x32 cluttered digits: digits-tiny's backbone (16 patch tokens) with Soft MoE in
        # blocks 2 and 3, 16 experts of one slot each -- as many slots as tokens, so the experts do the work of
        # one dense MLP per image.
        SoftMoEConfig(
            name="digits-tiny-soft", image_size=32, patch_size=8, channels=1, width=64, depth=4, heads=4,
            mlp_dim=128, num_classes=10, pool="gap", num_experts=16, slots_per_expert=1, group_size=1,
        ),
        # The parameter-bound regime on digit-glyphs: glyphs-tiny's backbone, Soft MoE where glyphs-tiny-moe has
        # its MoE layers, 16 experts of one slot -- 16 slots for 16 tokens, the dense model's FLOPs.
        SoftMoEConfig(**{**asdict(GLYPHS_TINY), "name": "glyphs-tiny-soft"},
                      **{**GLYPHS_MOE, "group_size": 1}, slots_per_expert=1),
        # Soft MoE-S/16 on big_vision's ImageNet-1k recipe (moe_course.recipes): vit-s/16-i1k's backbone, Soft MoE
        # in the blocks V-MoE's every-2 uses, 41 experts x 4 slots = 164 slots: the slot count whose layer costs a
        # dense MLP's FLOPs, router logits, dispatch and combine included (6 T S D + 4 S D H = 4 T D H gives
        # S = 4 T H / (6 T + 4 H) = 164.5 for T = 196, D = 384, H = 1536; analysis.flops).
        SoftMoEConfig(**{**asdict(VIT_S16_I1K), "name": "soft-moe-s/16-i1k"}, num_experts=41, slots_per_expert=4,
                      placement="every-2", group_size=1),
    ]
}
