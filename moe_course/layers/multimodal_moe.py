"""LIMoE's MoE layer: V-MoE's sparse MoE over image and text tokens together, with per-modality aux losses."""

from __future__ import annotations

from typing import Mapping, Sequence

import jax

from moe_course.layers.moe import SparseMoE
from moe_course.routing import multimodal_aux_losses


class MultimodalMoE(SparseMoE):
    """A ``SparseMoE`` whose router sees image and text tokens alike (it is not told the modality; LIMoE
    Sec. 2.2) and whose auxiliary loss is LIMoE's: the chosen losses per modality, weight x their mean
    (``routing.multimodal_aux_losses``, App. B.1).

    Extra arguments: losses {modality: loss names}, taus {modality: global-entropy threshold or None},
    joint (names from ``routing.JOINT_LOSSES``). Call as ``SparseMoE`` with ``modality`` (batch, tokens) int:
    0 image, 1 text, -1 padding, and ``token_mask`` = modality >= 0 (padding takes no expert slot).
    The MoEOutput's aux_terms holds every chosen loss unweighted ("text/local_entropy", ...).
    Raises ValueError when called without ``modality``.
    """

    def __init__(self, width: int, hidden: int, num_experts: int, *, losses: Mapping[str, Sequence[str]],
                 taus: Mapping[str, float | None], joint: Sequence[str] = (), **kwargs):
        super().__init__(width, hidden, num_experts, **kwargs)
        # Tuples of pairs, not dicts: static attributes must be hashable (nnx graph definitions are cache keys).
        self.losses = tuple((m, tuple(names)) for m, names in losses.items())
        self.taus, self.joint = tuple(taus.items()), tuple(joint)
        self.expert_keep, self.pruning_mode = None, "router_pred"  # set by ``models.pruned_experts``

    def aux_loss(self, logits: jax.Array, noisy_logits: jax.Array, token_mask: jax.Array | None,
                 modality: jax.Array | None) -> tuple[jax.Array, dict]:
        if modality is None:
            raise ValueError(f"{self.layer_name}: modality=None; LIMoE's MoE layer needs each token's modality "
                             "(batch, tokens) int: 0 image, 1 text, -1 padding")
        out = multimodal_aux_losses(logits, noisy_logits, modality, losses=dict(self.losses), taus=dict(self.taus),
                                    joint=self.joint, k=self.k, noise_std=self.noise_std,
                                    weight=self.aux_loss_weight)
        return out.total, out.terms
