"""Named V-MoE configurations (Riquelme et al. 2021): a ViT whose MLPs in some blocks are sparse MoE layers.

Placement (Sec. 2.3, Table 7): "every-2" puts an MoE layer in every other block (blocks 1, 3, 5, ... counted
from 0, i.e. the even blocks counted from 1); "last-n" puts one in the last ``moe_last_n`` of those;
"second-half" puts one in every block of the second half (blocks depth//2 .. depth-1), as the Soft MoE paper
does (Puigcerver et al., Sec. 3). All of
Table 7's V-MoE models use E = 32 experts and train with capacity ratio C = 1.05; the presets below carry
those settings and their Table 7 parameter counts.
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass
from typing import ClassVar

from moe_course.checks import check_flag, check_integers, check_number
from moe_course.configs.vit import GLYPHS_TINY, JFT_CLASSES, VIT_S16_I1K, ViTConfig
from moe_course.routing.allocation import COMBINE_WEIGHTS
from moe_course.routing.capacity import ROUNDINGS, expert_capacity

PLACEMENTS = ("every-2", "last-n", "second-half")
ALLOCATIONS = ("vanilla", "bpr", "skip_patch", "experts_choice")
PRIORITIES = ("max", "sum")
ROUTER_ORDERS = ("softmax_then_topk", "topk_then_softmax")
DISPATCHES = ("gather", "einsum")
AUX_LOSS_REDUCTIONS = ("mean", "sum")


@dataclass(frozen=True)
class VMoEConfig(ViTConfig):
    """A V-MoE: every field of ViTConfig plus the MoE layers' settings.

    num_experts: E. k: experts per token (TOP_k, Sec. 2.2). capacity_ratio: C in B_e = round(k*N*P*C/E)
    (Sec. 2.4). placement / moe_last_n: which blocks are MoE (see module docstring). group_size: images per
    routing group; tokens compete for expert buffers only inside their group (all images of a group compete
    under BPR). allocation: "vanilla" (App. C Alg. 1), "bpr" (Alg. 2), "skip_patch" (Alg. 3, keeps the top
    ``skip_keep_fraction`` of tokens by priority, then BPR) or "experts_choice" (Zhou et al. 2022).
    priority: BPR score, "max" gate or "sum" of the top-k gates. router_order: TOP_k after the softmax
    (V-MoE) or softmax over the TOP_k logits (Shazeer et al. 2017; App. A.1 ablation). noise_std: router
    noise std during training (None = 1/E, Sec. 2.2). expert_dropout: dropout inside experts during training.
    aux_loss_weight: lambda on each MoE layer's L_aux = 0.5 L_imp + 0.5 L_load (App. A.2).
    aux_loss_reduction: how the model combines its MoE layers' weighted aux losses: "mean" (default) or
    "sum". google-research/vmoe sums them (vmoe/nn/vit_moe.py, ``EncoderMoe``: "Sum auxiliary losses from
    all blocks"), so with n MoE layers its aux term weighs n times this library's default; the paper
    (App. A) gives lambda = 0.01 per layer and does not say. The default "mean" keeps the aux term's weight
    against the task loss the same whatever the placement (Last-2 or Every-2), so one lambda serves the CPU
    presets; the presets named for the paper (``vmoe-*-every-2``, ``vmoe-*-last-n``, the Table 7 rows and the
    "-i1k" variants) use "sum", as vmoe's code does (16 layers summed for H/14 Every-2).
    capacity_rounding: how B_e is rounded, one of ``moe_course.routing.ROUNDINGS``; "vmoe_round"
    reproduces vmoe's rounding (halves to even, a capacity of 0 raises; see ``expert_capacity``).
    capacity_multiple_of: None, or raise every B_e to the next multiple of it, as vmoe's dispatcher does by
    default (``capacity_multiple_of=4``, with ``capacity_rounding="ceil"``; ``moe_course.reference.vmoe`` sets both).
    dispatch: "gather" (index based, memory linear in group size) or "einsum" (one-hot).
    combine_weights: Expert Choice's combine weights, "probabilities" (the router's, Zhou et al.) or
    "token_normalized" (each token's divided by their sum over the experts that took it, as sparse upcycling
    does for vision: Komatsuzaki et al. 2023, Sec. 2.2); only allowed to differ from the default with
    allocation="experts_choice".
    check_finite: debug mode. Every MoE layer checks, with ``jax.experimental.checkify``, that its input
    tokens and router logits are finite; the training and evaluation steps then raise an error naming the
    layer and the routing group of the first non-finite token (see ``SparseMoE``). Off by default: the
    check costs a device-to-host transfer per step.
    Raises ValueError from ``validate`` naming the field, its value and what is allowed.
    """

    num_experts: int = 32
    k: int = 2
    capacity_ratio: float = 1.05
    placement: str = "last-n"
    moe_last_n: int = 2
    group_size: int = 8
    allocation: str = "vanilla"
    priority: str = "max"
    skip_keep_fraction: float = 1.0
    router_order: str = "softmax_then_topk"
    noise_std: float | None = None
    expert_dropout: float = 0.0
    aux_loss_weight: float = 0.01
    capacity_rounding: str = "round"
    capacity_multiple_of: int | None = None
    dispatch: str = "gather"
    aux_loss_reduction: str = "mean"
    combine_weights: str = "probabilities"
    check_finite: bool = False

    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {
        **ViTConfig.CHOICES, "placement": PLACEMENTS, "allocation": ALLOCATIONS, "priority": PRIORITIES,
        "router_order": ROUTER_ORDERS, "dispatch": DISPATCHES, "capacity_rounding": ROUNDINGS,
        "aux_loss_reduction": AUX_LOSS_REDUCTIONS, "combine_weights": COMBINE_WEIGHTS,
    }

    def moe_blocks(self) -> tuple[int, ...]:
        """Indices (from 0) of the blocks whose MLP is an MoE layer."""
        if self.placement == "second-half":
            return tuple(range(self.depth // 2, self.depth))
        candidates = tuple(range(1, self.depth, 2))
        return candidates if self.placement == "every-2" else candidates[len(candidates) - self.moe_last_n:]

    def validate(self) -> "VMoEConfig":
        """Returns self, or raises ValueError naming the field, its value and what is allowed."""
        super().validate()
        check_integers(self, ("num_experts", "k", "group_size", "moe_last_n"), minimum=1)
        check_integers(self, ("capacity_multiple_of",), minimum=1, optional=True)
        if self.k > self.num_experts:
            raise ValueError(f"k={self.k} is not allowed; use 1 <= k <= num_experts={self.num_experts}")
        check_number(self, "capacity_ratio", minimum=0, above_minimum=True)
        even_blocks = len(range(1, self.depth, 2))
        if self.placement == "last-n" and self.moe_last_n > even_blocks:
            raise ValueError(f"moe_last_n={self.moe_last_n} is not allowed for depth={self.depth}; "
                             f"use 1 <= moe_last_n <= {even_blocks}")
        check_number(self, "skip_keep_fraction", minimum=0, maximum=1, above_minimum=True)
        check_number(self, "noise_std", minimum=0, optional=True)
        check_number(self, "expert_dropout", minimum=0, maximum=1, below_maximum=True)
        check_number(self, "aux_loss_weight", minimum=0)
        check_flag(self, "check_finite")
        if self.combine_weights != "probabilities" and self.allocation != "experts_choice":
            raise ValueError(f"combine_weights={self.combine_weights!r} is only allowed with "
                             f"allocation='experts_choice' (allocation={self.allocation!r}); use "
                             f"combine_weights='probabilities'")
        if self.capacity_rounding == "vmoe_round":  # vmoe raises where the capacity rounds to 0: say so now
            tokens_per_group = self.group_size * self.num_tokens
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                expert_capacity(self.k, tokens_per_group, self.capacity_ratio, self.num_experts,
                                rounding=self.capacity_rounding, multiple_of=self.capacity_multiple_of)
        return self


def _paper(size: str, patch: int, depth: int, heads: int, width: int, mlp: int, placement: str, last_n: int):
    suffix = "every-2" if placement == "every-2" else f"last-{last_n}"
    return VMoEConfig(
        name=f"vmoe-{size}/{patch}-{suffix}", image_size=224, patch_size=patch, width=width, depth=depth,
        heads=heads, mlp_dim=mlp, num_classes=JFT_CLASSES, representation_size=width, num_experts=32, k=2,
        capacity_ratio=1.05, placement=placement, moe_last_n=last_n, aux_loss_reduction="sum",
    )


# Table 7 rows: (size, patch, placement, n) -> parameters in millions, as printed in the paper.
VMOE_TABLE_7_PARAMS = {
    "vmoe-s/32-last-2": 166.7, "vmoe-s/32-every-2": 296.9,
    "vmoe-b/32-last-2": 395.0, "vmoe-b/32-every-2": 980.6,
    "vmoe-l/32-last-2": 845.8, "vmoe-l/32-every-2": 3448.2,
    "vmoe-b/16-last-2": 393.3, "vmoe-b/16-every-2": 979.0,
    "vmoe-l/16-last-2": 843.6, "vmoe-l/16-every-2": 3446.0,
    "vmoe-h/14-last-5": 2688.6, "vmoe-h/14-every-2": 7160.8,
}
GLYPHS_MOE = dict(num_experts=16, k=1, capacity_ratio=1.05, placement="last-n", moe_last_n=2, group_size=8)

_SIZES = {"s": (8, 8, 512, 2048), "b": (12, 12, 768, 3072), "l": (24, 16, 1024, 4096), "h": (32, 16, 1280, 5120)}


def _from_name(name: str) -> VMoEConfig:
    size, rest = name[len("vmoe-"):].split("/")
    patch, placement = rest.split("-", 1)
    last_n = 0 if placement == "every-2" else int(placement.split("-")[1])
    return _paper(size, int(patch), *_SIZES[size], "every-2" if placement == "every-2" else "last-n", last_n or 2)


# V-MoE-S/16 on big_vision's ImageNet-1k recipe (moe_course.recipes): vit-s/16-i1k's backbone with MoE layers in
# every other block or the last two of them, k = 1 or 2, BPR (V-MoE Sec. 4), 8 experts (our choice: ImageNet is
# 1/240 of JFT-300M), groups of 8 images. Equal forward FLOPs to the dense model: the capacity ratio makes every
# expert buffer hold k * C * tokens / E = tokens / E slots (C = 1/k), so the experts compute exactly one dense MLP
# per token; only the router (2 T D E) and the combine (2 T k D) are extra (docs/scale-out.md prints the counts).
def _i1k(placement: str, k: int) -> VMoEConfig:
    suffix = "every-2" if placement == "every-2" else "last-2"
    return VMoEConfig(**{**asdict(VIT_S16_I1K), "name": f"vmoe-s/16-i1k-{suffix}-k{k}"}, num_experts=8, k=k,
                      capacity_ratio=1.0 / k, placement=placement, moe_last_n=2, group_size=8, allocation="bpr",
                      aux_loss_reduction="sum")


VMOE_I1K_PRESETS = {cfg.name: cfg for cfg in (_i1k(p, k) for p in ("every-2", "last-n") for k in (1, 2))}

VMOE_PRESETS: dict[str, VMoEConfig] = {
    **VMOE_I1K_PRESETS,
    **{name: _from_name(name) for name in VMOE_TABLE_7_PARAMS},
    # CPU presets on the 32x32 cluttered digits: digits-tiny's backbone with MoE in blocks 1 and 3.
    "digits-tiny-moe": VMoEConfig(
        name="digits-tiny-moe", image_size=32, patch_size=8, channels=1, width=64, depth=4, heads=4, mlp_dim=128,
        num_classes=10, pool="gap", num_experts=8, k=2, capacity_ratio=1.05, placement="every-2", group_size=8,
    ),
    # The parameter-bound regime on digit-glyphs (configs/vit.py, GLYPHS_TINY): 16 experts in blocks 1 and 3,
    # k = 1, so each token costs one expert MLP as in the dense model: Tokens Choice with BPR, and Experts Choice.
    **{cfg.name: cfg for cfg in (
        VMoEConfig(**{**asdict(GLYPHS_TINY), "name": "glyphs-tiny-moe"}, **GLYPHS_MOE, allocation="bpr"),
        VMoEConfig(**{**asdict(GLYPHS_TINY), "name": "glyphs-tiny-ec"}, **GLYPHS_MOE, allocation="experts_choice"),
    )},
    "digits-fine-moe": VMoEConfig(
        name="digits-fine-moe", image_size=32, patch_size=4, channels=1, width=64, depth=4, heads=4, mlp_dim=128,
        num_classes=10, pool="gap", num_experts=8, k=2, capacity_ratio=1.05, placement="every-2", group_size=4,
    ),
}
