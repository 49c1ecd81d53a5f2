"""Per-modality routing statistics of a one-tower MoE (LIMoE Sec. 2.2, App. B.2, App. F).

Every function takes a layer's ``RoutingRecord`` (arrays in routing groups, (groups, group_tokens, ...)) and
the model's token ``modality`` (batch, tokens) int -- 0 image, 1 text, -1 padding -- whose tokens, laid out
example after example, are the group's tokens in order. Padding never counts. They are written with
jax.numpy, so they run inside a compiled training step (metrics over training) as well as on numpy arrays.
"""

from __future__ import annotations

import jax.numpy as jnp

from moe_course.routing import MODALITIES


def _grouped_modality(record, modality) -> jnp.ndarray:
    return jnp.asarray(modality).reshape(jnp.shape(record.served)[:2])


def success_rate(record, modality, m: int) -> jnp.ndarray:
    """Fraction of modality m's tokens that reached at least one expert (not dropped; LIMoE Sec. 2.2's "success
    rate") -> scalar float32; NaN when the batch has no token of modality m."""
    mask = _grouped_modality(record, modality) == m
    served = jnp.any(jnp.asarray(record.served), axis=-1)
    count = jnp.sum(mask)
    return jnp.where(count > 0, jnp.sum(served & mask) / jnp.maximum(count, 1), jnp.nan)


def success_rates(records, modality) -> dict[str, jnp.ndarray]:
    """{"success/<modality>/layer<i>": rate} for every MoE layer i (in block order) and modality."""
    return {f"success/{name}/layer{i}": success_rate(record, modality, m)
            for i, record in enumerate(records) for m, name in enumerate(MODALITIES)}


def expert_shares(record, modality, m: int) -> jnp.ndarray:
    """(experts,) float32: the share of modality m's tokens whose TOP-1 router choice is each expert (served or
    not) -- what LIMoE tracks during training to rank experts for pruning (App. E.4)."""
    mask = (_grouped_modality(record, modality) == m).astype(jnp.float32)
    num_experts = jnp.shape(record.expert_fill)[-1]
    top1 = jnp.asarray(record.expert_index)[..., 0]
    counts = jnp.sum((top1[..., None] == jnp.arange(num_experts)) * mask[..., None], axis=(0, 1))
    return counts / jnp.maximum(jnp.sum(mask), 1.0)


def busiest_shares(records, modality) -> dict[str, jnp.ndarray]:
    """{"busiest/<modality>/layer<i>": the largest entry of ``expert_shares``} for every MoE layer i and modality:
    the share of that modality's tokens whose top-1 choice is its most popular expert -- 1/E when spread
    evenly, 1 when one expert takes them all (LIMoE Sec. 2.2.1, Fig. 3 C2: "all text tokens going to one
    expert"). 0 when the batch has no token of the modality."""
    return {f"busiest/{name}/layer{i}": jnp.max(expert_shares(record, modality, m))
            for i, record in enumerate(records) for m, name in enumerate(MODALITIES)}


def experts_used(record, modality, m: int, *, coverage: float = 0.9) -> int:
    """The number of experts needed to serve ``coverage`` of modality m's tokens by their TOP-1 choice (LIMoE
    App. B.2, Fig. 10: "if only 3 experts are needed for 90% text success rate, text routing is not highly
    distributed"): the fewest experts, taken by share, whose shares add up to ``coverage``. 0 when the batch
    has no token of modality m. Raises ValueError unless 0 < coverage <= 1."""
    if not 0 < coverage <= 1:
        raise ValueError(f"coverage={coverage!r} is not allowed; use 0 < coverage <= 1")
    shares = jnp.sort(expert_shares(record, modality, m))[::-1]
    if float(jnp.sum(shares)) == 0.0:
        return 0
    return int(jnp.searchsorted(jnp.cumsum(shares), coverage - 1e-6) + 1)


def priority_by_modality(record, modality) -> dict[str, jnp.ndarray]:
    """{modality name: mean normalised BPR priority rank of its real tokens} -- 0 = processed first, 1 = last
    (LIMoE Sec. 2.2.3 and App. F: BPR must not simply rank one modality ahead of the other). A rank r of a
    group of N tokens is r / (N - 1). NaN for a modality without tokens. Raises ValueError for a record
    without a token order (experts choice)."""
    if record.priority_rank is None:
        raise ValueError("record.priority_rank is None (experts choice has no token order)")
    rank = jnp.asarray(record.priority_rank, jnp.float32)
    normalised = rank / max(rank.shape[1] - 1, 1)
    grouped = _grouped_modality(record, modality)
    out = {}
    for m, name in enumerate(MODALITIES):
        mask = grouped == m
        count = jnp.sum(mask)
        out[name] = jnp.where(count > 0, jnp.sum(normalised * mask) / jnp.maximum(count, 1), jnp.nan)
    return out


def measure_routing(model, dataset, split: str = "test", *, batch_size: int = 256) -> dict:
    """Routing of a whole split, image-caption pairs routed together as in training but at evaluation settings
    (no noise), per modality and MoE layer i: "success/<modality>/layer<i>" (float, the fraction of that
    modality's tokens served) and "shares/<modality>/layer<i>" ((experts,) float64, the fraction of its tokens
    whose top-1 choice is each expert, as ``expert_shares``), over all of the split's tokens. The last batch
    is padded with blank pairs, which are routed but not counted. Raises ValueError for a batch size that is
    not a multiple of the model's group_size, or a model without MoE layers."""
    import jax
    import numpy as np
    from flax import nnx

    from moe_course.data.base import eval_batches

    if not model.moe_layers():
        raise ValueError(f"{model.config.name} has no MoE layer: it drops no token")
    if batch_size <= 0 or batch_size % model.config.group_size:
        raise ValueError(f"batch_size={batch_size} is not a positive multiple of group_size={model.config.group_size}")
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    num_experts = model.config.num_experts

    @jax.jit
    def forward(params, rest, images, text, text_mask):
        out = nnx.merge(graphdef, params, rest)(images, text, text_mask)
        shape = out.modality.shape
        return ([(jnp.any(r.served, axis=-1).reshape(shape), r.expert_index[..., 0].reshape(shape))
                 for r in out.routing], out.modality)

    served_counts, totals, top1_counts = {}, {}, {}
    for batch in eval_batches(dataset, split, batch_size):
        n = len(batch["image"])
        pad = lambda a: np.pad(a, [(0, batch_size - n)] + [(0, 0)] * (a.ndim - 1))
        layers, modality = jax.device_get(forward(params, rest, pad(batch["image"]), pad(batch["text"]),
                                                  pad(batch["text_mask"])))
        modality = np.array(modality)  # a writable copy
        modality[n:] = -1
        for i, (served, top1) in enumerate(layers):
            for m, name in enumerate(MODALITIES):
                key, mask = f"{name}/layer{i}", modality == m
                served_counts[key] = served_counts.get(key, 0) + int((served & mask).sum())
                totals[key] = totals.get(key, 0) + int(mask.sum())
                top1_counts[key] = top1_counts.get(key, 0) + np.bincount(top1[mask], minlength=num_experts)
    return {**{f"success/{key}": served_counts[key] / max(totals[key], 1) for key in served_counts},
            **{f"shares/{key}": top1_counts[key] / max(totals[key], 1) for key in top1_counts}}


def measure_success_rates(model, dataset, split: str = "test", *, batch_size: int = 256) -> dict[str, float]:
    """Success rate per modality and MoE layer over a whole split: the "success/<modality>/layer<i>" entries of
    ``measure_routing`` (same arguments, same errors)."""
    routing = measure_routing(model, dataset, split, batch_size=batch_size)
    return {key: value for key, value in routing.items() if key.startswith("success/")}
