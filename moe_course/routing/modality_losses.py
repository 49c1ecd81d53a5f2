"""LIMoE's combined auxiliary loss: chosen losses per modality, averaged, times one weight (App. B.1).

Each modality names the losses it wants (``PER_MODALITY_LOSSES``) and its global-entropy threshold tau; each
chosen (modality, loss) pair is computed on that modality's tokens only, padding never counts. The -MI(experts;
m) loss (``JOINT_LOSSES``) spans all modalities and is chosen once. The final auxiliary loss is ``weight``
times the MEAN of all chosen terms (App. B.1, "Final aggregated auxiliary loss"; weight 0.04 in the paper).
Paper defaults (Sec. 2.2.2, App. A): local + global entropy on text, global entropy on images, plus the
classic importance and load losses; B/16 thresholds tau_text = log 9, tau_image = log 20.
"""

from __future__ import annotations

import math
from typing import Mapping, NamedTuple, Sequence

import jax
import jax.numpy as jnp

from moe_course.routing.checks import check_integer_array, check_ndim
from moe_course.routing.entropy import (
    check_tau,
    global_entropy_loss,
    local_entropy_loss,
    merged_entropy_loss,
    mutual_information_loss,
    target_entropy_loss,
)
from moe_course.routing.losses import importance_loss, load_loss, router_z_loss

MODALITIES = ("image", "text")  # modality ids 0 and 1 in the (groups, tokens) modality array; -1 = padding
PADDING = -1
PER_MODALITY_LOSSES = ("importance", "load", "z_loss", "local_entropy", "global_entropy", "target_entropy",
                       "merged_entropy")
JOINT_LOSSES = ("mutual_information",)
LIMOE_AUX_WEIGHT = 0.04
PAPER_TAUS = {"b/16": {"text": math.log(9), "image": math.log(20)}, "h/14": {"text": math.log(4), "image": math.log(25)}}


def check_loss_names(field: str, names, allowed: tuple[str, ...]) -> tuple[str, ...]:
    """``names`` as a tuple if it is a sequence of distinct names from ``allowed``, else ValueError naming
    ``field``, the bad value and the allowed names."""
    if isinstance(names, str) or not isinstance(names, Sequence):
        raise ValueError(f"{field}={names!r} is not allowed; use a tuple of loss names from {', '.join(allowed)}")
    for name in names:
        if name not in allowed:
            raise ValueError(f"{field} has unknown loss {name!r}; allowed: {', '.join(allowed)}")
    if len(set(names)) != len(names):
        raise ValueError(f"{field}={tuple(names)!r} names a loss twice; name each at most once")
    return tuple(names)


def check_multimodal_args(modality, losses, taus, joint) -> tuple[dict, tuple[str, ...]]:
    """The argument checks of ``multimodal_aux_losses`` (JAX and its PyTorch twin): modality must be a
    (groups, tokens) integer array, the keys of losses and taus modality names, joint names from
    ``JOINT_LOSSES``. Returns (taus as a dict, joint as a tuple); raises ValueError naming the argument."""
    check_ndim("modality", modality, 2, "(groups, tokens)")
    check_integer_array("modality", modality)
    taus = dict(taus or {})
    for name in list(losses) + list(taus):
        if name not in MODALITIES:
            raise ValueError(f"modality {name!r} is not known; use one of {', '.join(MODALITIES)}")
    return taus, check_loss_names("joint", joint, JOINT_LOSSES)


class MultimodalAuxLosses(NamedTuple):
    """total: scalar float32, weight x mean of the chosen terms (0 when none is chosen). terms: {"text/local_entropy":
    scalar, ..., "mutual_information": scalar} -- every chosen term, unweighted, for logging and plots."""

    total: jax.Array
    terms: dict[str, jax.Array]


def multimodal_aux_losses(
    logits: jax.Array,
    noisy_logits: jax.Array,
    modality: jax.Array,
    *,
    losses: Mapping[str, Sequence[str]],
    taus: Mapping[str, float | None] | None = None,
    joint: Sequence[str] = (),
    k: int = 1,
    noise_std: float | None = None,
    weight: float = LIMOE_AUX_WEIGHT,
) -> MultimodalAuxLosses:
    """LIMoE's auxiliary loss of one MoE layer (Sec. 2.2.2, App. B.1).

    logits, noisy_logits: (groups, tokens, experts) clean ``W x`` and the forward pass's noisy logits (the load
    loss needs them; pass the clean ones without noise and leave "load" out). modality: (groups, tokens) int,
    the index into ``MODALITIES`` of each token or ``PADDING`` (-1). losses: {modality name: loss names from
    ``PER_MODALITY_LOSSES``}. taus: {modality name: global-entropy threshold > 0, or None unthresholded};
    missing = None. joint: names from ``JOINT_LOSSES``. k: experts per token (load, target/merged entropy).
    noise_std: the router noise sigma (None = 1/E) for the load loss. weight: multiplies the mean of the terms.
    Raises ValueError naming an unknown modality or loss name, a bad tau, or a bad modality array.
    """
    taus, joint = check_multimodal_args(modality, losses, taus, joint)
    terms: dict[str, jax.Array] = {}
    for m, name in enumerate(MODALITIES):
        mask = modality == m
        tau = check_tau(taus.get(name))
        for loss in check_loss_names(f"losses[{name!r}]", losses.get(name, ()), PER_MODALITY_LOSSES):
            if loss == "importance":
                value = importance_loss(logits, mask)
            elif loss == "load":
                value = load_loss(logits, noisy_logits, k, noise_std=noise_std, mask=mask)
            elif loss == "z_loss":
                value = router_z_loss(logits, mask)
            elif loss == "local_entropy":
                value = local_entropy_loss(logits, mask)
            elif loss == "global_entropy":
                value = global_entropy_loss(logits, mask, tau=tau)
            elif loss == "target_entropy":
                value = target_entropy_loss(logits, mask, k=k)
            else:
                value = merged_entropy_loss(logits, mask, k=k)
            terms[f"{name}/{loss}"] = value
    if "mutual_information" in joint:
        terms["mutual_information"] = mutual_information_loss(logits, modality, len(MODALITIES))
    total = weight * jnp.mean(jnp.stack(list(terms.values()))) if terms else jnp.zeros((), jnp.float32)
    return MultimodalAuxLosses(total, terms)
