"""What the experts of an upcycled V-MoE do as training goes on (sparse upcycling, Komatsuzaki et al. 2023,
arXiv 2212.05055; chapter 8 and benchmarks/upcycle_sweep.py): how far the copied experts have moved apart, and
how the router spreads its weight over them."""

from __future__ import annotations

import numpy as np

from moe_course.analysis.routing import token_served
from moe_course.analysis.sweeps import seed_lead, seed_table

# The arms of benchmarks/upcycle_sweep.py (moe_course/results/upcycling.jsonl), by their ``kind``.
ARMS = {"dense-start": "dense start (N steps)", "dense": "(a) dense, continued", "upcycled": "(b) upcycled V-MoE",
        "scratch": "(c) V-MoE from scratch (N + M)"}


def expert_distance(model) -> list[float]:
    """Per MoE layer of a V-MoE, in block order: the mean over expert pairs i < j of ||W_i - W_j||_F divided by
    the mean ||W_e||_F, W_e the fc1 kernel (width, mlp_dim) of expert e. Dimensionless: 0 when the experts are
    identical copies (an upcycled layer at step 0), about sqrt(2) = 1.41 for kernels drawn independently with
    the same scale. Raises ValueError for a model without MoE layers."""
    layers = list(model.moe_layers()) if hasattr(model, "moe_layers") else []
    if not layers:
        raise ValueError(f"model is a {type(model).__name__} without MoE layers; expert_distance needs a V-MoE")
    distances = []
    for layer in layers:
        kernel = np.asarray(layer.experts.fc1_kernel[...], np.float64)
        w = kernel.reshape(kernel.shape[0], -1)
        i, j = np.triu_indices(len(w), k=1)
        distances.append(float(np.linalg.norm(w[i] - w[j], axis=1).mean() / np.linalg.norm(w, axis=1).mean()))
    return distances


def importance_entropy(record) -> float:
    """The entropy of the experts' shares of one MoE layer's combine weight on a batch, divided by log E: each
    expert's importance (V-MoE App. A: the sum of the gates it received over the served choices) over the total.
    1 when every expert gets the same weight, 0 when one expert gets all of it. record: a ``RoutingRecord``
    (``collect_routing``); Tokens Choice and Experts Choice alike. Raises ValueError when no choice was served."""
    index, gates, served = (np.asarray(a) for a in (record.expert_index, record.gates, record.served))
    experts = np.asarray(record.expert_fill).shape[-1]
    weight = np.bincount(index[served].ravel(), weights=gates[served].ravel(), minlength=experts)
    if weight.sum() <= 0:
        raise ValueError("the record serves no choice (every token dropped): no importance to share")
    share = weight[weight > 0] / weight.sum()
    return float(-(share * np.log(share)).sum() / np.log(experts))


def unserved_fraction(record, batch: int) -> float:
    """The fraction of a batch's tokens no expert served (``token_served``): only the residual carries them
    through the layer. Under Experts Choice, the tokens no expert picked."""
    return float(1 - token_served(record, batch).mean())


def upcycling_table(runs: list[dict], variant: str = "") -> str:
    """The seed table of the upcycling runs of ``variant`` (``sweeps.seed_table``, one row per arm of ``ARMS``),
    then each V-MoE arm minus the dense continued one, seed by seed (``sweeps.seed_lead``): in test accuracy, then
    in test loss (near the ceiling of accuracy, the loss still separates the arms; lower is better)."""
    lines = [seed_table(runs, variant, names=ARMS), ""]
    for kind in ("upcycled", "scratch"):
        lead = seed_lead(runs, kind, baseline="dense", variant=variant)
        lines.append(f"- {ARMS[kind]} minus {ARMS['dense']}: {lead}")
    for kind in ("upcycled", "scratch"):
        loss = seed_lead(runs, kind, baseline="dense", metric="test_loss", variant=variant)
        spread = loss.spread
        lines.append(f"- test loss, {ARMS[kind]} minus {ARMS['dense']}: {spread.mean:+.3f} ± {spread.std:.3f} "
                     f"({spread.low:+.3f} to {spread.high:+.3f}); lower on {loss.losses} of {len(loss.per_seed)} "
                     f"seeds, within 0.005 on {loss.ties}")
    return "\n".join(lines)
