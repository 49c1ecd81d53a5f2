"""LIMoE configurations (Mustafa et al. 2022): a one-tower image-text model with a shared sparse MoE encoder.

A ``LIMoEConfig`` is a ``VMoEConfig`` (the image side, the encoder and its MoE layers) plus the text input,
the contrastive head and the per-modality auxiliary losses. ``placement="none"`` gives the dense one-tower
baseline with the same backbone (the paper trains such models as its baselines, Sec. 3.1).

Paper settings (Sec. 3, App. A): 32 experts every 2 blocks, K = 1, BPR during training, output
representation of 512, text sequence length 16, aux weight 0.04 on the mean of the chosen losses, and for
B/16 the global-entropy thresholds tau_text = log 9, tau_image = log 20. The losses are the paper's five
(Sec. 2.2.2, Table 3): the classic importance and load losses over all tokens of both modalities together,
local + global entropy on text, global entropy on images. The ``-classic`` presets are Fig. 3's "classic"
baseline: joint importance + load only (the figure's caption: "the standard formulation (importance + load
losses)"; the z-loss is in neither that baseline nor LIMoE's chosen five). Fig. 3's ladder on the digits:
``digits-limoe-classic`` -> ``digits-limoe-local`` (+ local entropy on text) -> ``digits-limoe`` (+ global
entropy); ``--patch-size 4`` gives 64 image tokens per ~10 text tokens, the paper's kind of imbalance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from moe_course.checks import check_integers, check_number
from moe_course.configs.vmoe import PLACEMENTS, VMoEConfig
from moe_course.routing.modality_losses import JOINT_LOSSES, PER_MODALITY_LOSSES, check_loss_names

LIMOE_PLACEMENTS = PLACEMENTS + ("none",)
PAPER_JOINT_LOSSES = ("importance", "load")  # the classic losses, over all real tokens of both modalities
PAPER_TEXT_LOSSES = ("local_entropy", "global_entropy")
PAPER_IMAGE_LOSSES = ("global_entropy",)


@dataclass(frozen=True)
class LIMoEConfig(VMoEConfig):
    """Every field of VMoEConfig (image input, encoder, MoE layers), with LIMoE's defaults, plus:

    vocab_size: text pieces (the tokenizer's vocabulary). seq_len: text tokens per caption (16, App. A).
    embed_dim: size of the shared image-text embedding (the per-modality linear projections' output).
    temperature_init: the learned logit scale's start, 10 (kept as its log; SPEC Sec. 3).
    joint_aux_losses: names from ``JOINT_LOSSES``, each computed once over all real tokens of both modalities
    (the paper's importance and load; also z_loss and mutual_information). image_aux_losses /
    text_aux_losses: names from ``PER_MODALITY_LOSSES`` computed on that modality's tokens only (the
    paper's entropy losses; the classic names here are per-modality variants for ablations). The defaults
    are the paper's five terms. image_tau / text_tau: the global-entropy thresholds (finite numbers, tau =
    log S for a soft minimum of S experts, <= 0 switches the loss off; None = unthresholded).
    aux_loss_weight: times the mean of all chosen losses (0.04). placement may also be "none": a dense one-tower model (no MoE layer, no aux loss).
    The model average-pools each modality, so pool must be "gap"; num_classes is the number of classes
    zero-shot evaluation uses (the model has no classifier head). Padding tokens take no expert slot, which
    experts choice cannot promise, so allocation must be a token-choice one.
    Raises ValueError from ``validate`` naming the field, its value and what is allowed.
    """

    pool: str = "gap"
    num_experts: int = 32
    k: int = 1
    placement: str = "every-2"
    allocation: str = "bpr"
    aux_loss_weight: float = 0.04
    vocab_size: int = 32000
    seq_len: int = 16
    embed_dim: int = 512
    temperature_init: float = 10.0
    image_aux_losses: tuple[str, ...] = PAPER_IMAGE_LOSSES
    text_aux_losses: tuple[str, ...] = PAPER_TEXT_LOSSES
    joint_aux_losses: tuple[str, ...] = PAPER_JOINT_LOSSES
    image_tau: float | None = math.log(20)
    text_tau: float | None = math.log(9)

    CHOICES: ClassVar[dict[str, tuple[str, ...]]] = {**VMoEConfig.CHOICES, "placement": LIMOE_PLACEMENTS}

    @property
    def is_dense(self) -> bool:
        """True for the dense one-tower baseline (placement "none": no MoE layer)."""
        return self.placement == "none"

    def moe_blocks(self) -> tuple[int, ...]:
        return () if self.is_dense else super().moe_blocks()

    def validate(self) -> "LIMoEConfig":
        """Returns self, or raises ValueError naming the field, its value and what is allowed."""
        check_integers(self, ("seq_len",), minimum=1)
        check_integers(self, ("vocab_size",), minimum=2)
        check_integers(self, ("embed_dim",), minimum=1)
        check_number(self, "temperature_init", minimum=0, above_minimum=True)
        check_number(self, "image_tau", optional=True)
        check_number(self, "text_tau", optional=True)
        check_loss_names("image_aux_losses", self.image_aux_losses, PER_MODALITY_LOSSES)
        check_loss_names("text_aux_losses", self.text_aux_losses, PER_MODALITY_LOSSES)
        check_loss_names("joint_aux_losses", self.joint_aux_losses, JOINT_LOSSES)
        super().validate()
        if self.pool != "gap":
            raise ValueError(f"pool={self.pool!r} is not allowed; LIMoE average-pools each modality: use 'gap'")
        if self.allocation == "experts_choice":
            raise ValueError("allocation='experts_choice' is not allowed for LIMoE (padding must take no expert "
                             "slot); use 'bpr' (the paper's), 'vanilla' or 'skip_patch'")
        if self.noise_std == 0 and "load" in self.joint_aux_losses + self.image_aux_losses + self.text_aux_losses:
            raise ValueError("noise_std=0 leaves the load loss undefined (App. A.2); drop 'load' from "
                             "joint_aux_losses/image_aux_losses/text_aux_losses or use router noise")
        return self

    @property
    def aux_losses(self) -> dict[str, tuple[str, ...]]:
        """{modality: chosen loss names}, as ``routing.multimodal_aux_losses`` takes them."""
        return {"image": self.image_aux_losses, "text": self.text_aux_losses}

    @property
    def taus(self) -> dict[str, float | None]:
        """{modality: global-entropy threshold tau or None}, as ``routing.multimodal_aux_losses`` takes them."""
        return {"image": self.image_tau, "text": self.text_tau}


def _paper(size: str, depth: int, heads: int, width: int, mlp: int, placement: str = "every-2",
           classic: bool = False) -> LIMoEConfig:
    dense = placement == "none"
    name = f"{'dense-one-tower' if dense else 'limoe'}-{size}/16{'-classic' if classic else ''}"
    losses = {"image_aux_losses": (), "text_aux_losses": ()} if classic else {}
    return LIMoEConfig(
        name=name, image_size=224, patch_size=16, width=width, depth=depth, heads=heads, mlp_dim=mlp,
        num_classes=1000, placement=placement, **losses,
    )


def _digits(name: str, placement: str, **changes) -> LIMoEConfig:
    # 32x32 cluttered digits in 8x8 patches (16 image tokens) with 16 text tokens, digits-tiny's backbone.
    return LIMoEConfig(
        name=name, image_size=32, patch_size=8, channels=1, width=64, depth=4, heads=4, mlp_dim=128,
        num_classes=10, num_experts=8, placement=placement, group_size=8, capacity_ratio=1.0, vocab_size=128,
        embed_dim=64, text_tau=math.log(2), image_tau=math.log(4), **changes,
    )


LIMOE_PRESETS: dict[str, LIMoEConfig] = {
    cfg.name: cfg
    for cfg in [
        _paper("b", 12, 12, 768, 3072),
        _paper("l", 24, 16, 1024, 4096),
        _paper("b", 12, 12, 768, 3072, classic=True),
        _paper("l", 24, 16, 1024, 4096, classic=True),
        _paper("b", 12, 12, 768, 3072, placement="none"),
        _paper("l", 24, 16, 1024, 4096, placement="none"),
        _digits("digits-limoe", "every-2"),
        _digits("digits-limoe-classic", "every-2", image_aux_losses=(), text_aux_losses=()),
        # Fig. 3's middle step: classic + local entropy on text (then digits-limoe adds the global losses).
        _digits("digits-limoe-local", "every-2", image_aux_losses=(), text_aux_losses=("local_entropy",)),
        _digits("digits-dense-one-tower", "none"),
    ]
}
