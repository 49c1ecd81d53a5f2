"""LIMoE's combined auxiliary loss: chosen joint and per-modality losses, averaged, times one weight (App. B.1).

Two kinds of terms, padding never counting in either:
- JOINT terms (``JOINT_LOSSES``) see all real tokens of both modalities together. The classic losses --
  importance, load (V-MoE App. A) and the router z-loss -- are the paper's when chosen here: LIMoE computes
  them without a modality index (App. B.1), which is why they can be satisfied by perfectly balanced image
  tokens while every text token sits on one expert (Sec. 2.2.1). The -MI(experts; m) loss also spans both
  modalities. A joint term is logged under its bare name ("importance").
- PER-MODALITY terms (``PER_MODALITY_LOSSES``), each modality with its own names and global-entropy threshold
  tau, computed on that modality's tokens only and logged as "text/local_entropy". The entropy losses are
  per modality in the paper (Sec. 2.2.2); the classic losses chosen here ("text/importance") are a variant
  for ablations, not the paper's: they punish a text collapse the paper's joint ones do not see.
The final auxiliary loss is ``weight`` times the MEAN of all chosen terms (App. B.1, "Final aggregated
auxiliary loss"; weight 0.04 in the paper). The paper's 5 terms (Sec. 2.2.2, Table 3): joint importance and
load, local + global entropy on text, global entropy on images; B/16 thresholds tau_text = log 9,
tau_image = log 20.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
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
CLASSIC_LOSSES = ("importance", "load", "z_loss")  # V-MoE's balancing losses and ST-MoE's z-loss
ENTROPY_LOSSES = ("local_entropy", "global_entropy", "target_entropy", "merged_entropy")
PER_MODALITY_LOSSES = CLASSIC_LOSSES + ENTROPY_LOSSES
JOINT_LOSSES = CLASSIC_LOSSES + ("mutual_information",)
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
    """total: scalar float32, weight x mean of the chosen terms (0 when none is chosen). terms: {"importance":
    scalar, ..., "text/local_entropy": scalar, ...} -- every chosen term, unweighted, for logging and plots:
    joint terms under their bare names, per-modality terms as "modality/loss"."""

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
    """LIMoE's auxiliary loss of one MoE layer (Sec. 2.2.1-2.2.2, App. B.1).

    logits, noisy_logits: (groups, tokens, experts) clean ``W x`` and the forward pass's noisy logits (the load
    loss needs them; pass the clean ones without noise and leave "load" out). modality: (groups, tokens) int,
    the index into ``MODALITIES`` of each token or ``PADDING`` (-1). losses: {modality name: loss names from
    ``PER_MODALITY_LOSSES``}, each computed on that modality's tokens. taus: {modality name: global-entropy
    threshold (a finite number; <= 0 switches the loss off), or None unthresholded}; missing = None. joint:
    names from ``JOINT_LOSSES``, each computed once over all real tokens of every modality (the paper's
    importance and load). k: experts per token (load, target/merged entropy). noise_std: the router noise
    sigma (None = 1/E) for the load loss. weight: multiplies the mean of the terms.
    Raises ValueError naming an unknown modality or loss name, a bad tau, or a bad modality array.
    """
    terms = aux_terms(JAX_LOSSES, logits, noisy_logits, modality, losses=losses, taus=taus, joint=joint, k=k,
                      noise_std=noise_std)
    total = weight * jnp.mean(jnp.stack(list(terms.values()))) if terms else jnp.zeros((), jnp.float32)
    return MultimodalAuxLosses(total, terms)


def aux_terms(fns, logits, noisy_logits, modality, *, losses, taus, joint, k, noise_std) -> dict:
    """The chosen terms of ``multimodal_aux_losses`` (same arguments), unweighted: {"importance": scalar, ...,
    "text/local_entropy": scalar, ...}, computed with ``fns`` (``JAX_LOSSES`` or the PyTorch twins' namespace;
    see ``named_loss``, plus ``mutual_information_loss``). Raises the ValueErrors ``multimodal_aux_losses``
    documents, before any loss is computed."""
    taus, joint = check_multimodal_args(modality, losses, taus, joint)
    chosen = {name: check_loss_names(f"losses[{name!r}]", losses.get(name, ()), PER_MODALITY_LOSSES)
              for name in MODALITIES}
    taus = {name: check_tau(taus.get(name)) for name in MODALITIES}
    terms = {}
    for loss in joint:
        if loss == "mutual_information":
            terms[loss] = fns.mutual_information_loss(logits, modality, len(MODALITIES))
        else:
            terms[loss] = named_loss(fns, loss, logits, noisy_logits, modality != PADDING, tau=None, k=k,
                                     noise_std=noise_std)
    for m, name in enumerate(MODALITIES):
        for loss in chosen[name]:
            terms[f"{name}/{loss}"] = named_loss(fns, loss, logits, noisy_logits, modality == m, tau=taus[name],
                                                 k=k, noise_std=noise_std)
    return terms


def named_loss(fns, loss: str, logits, noisy_logits, mask, *, tau, k, noise_std):
    """One named loss (from ``PER_MODALITY_LOSSES``) on the tokens where ``mask`` (groups, tokens) holds.
    fns: the framework's loss functions as attributes (``importance_loss``, ``load_loss``, ``router_z_loss``
    and the four entropy losses) -- ``JAX_LOSSES`` here, the PyTorch twins in ``moe_course.torch.routing``."""
    if loss == "importance":
        return fns.importance_loss(logits, mask)
    if loss == "load":
        return fns.load_loss(logits, noisy_logits, k, noise_std=noise_std, mask=mask)
    if loss == "z_loss":
        return fns.router_z_loss(logits, mask)
    if loss == "local_entropy":
        return fns.local_entropy_loss(logits, mask)
    if loss == "global_entropy":
        return fns.global_entropy_loss(logits, mask, tau=tau)
    if loss == "target_entropy":
        return fns.target_entropy_loss(logits, mask, k=k)
    return fns.merged_entropy_loss(logits, mask, k=k)


# The JAX loss functions by name, for ``aux_terms``; the PyTorch twin passes its own (``TORCH_LOSSES``).
JAX_LOSSES = SimpleNamespace(
    importance_loss=importance_loss, load_loss=load_loss, router_z_loss=router_z_loss,
    local_entropy_loss=local_entropy_loss, global_entropy_loss=global_entropy_loss,
    target_entropy_loss=target_entropy_loss, merged_entropy_loss=merged_entropy_loss,
    mutual_information_loss=mutual_information_loss,
)
