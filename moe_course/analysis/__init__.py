"""Measurements on models, one file per topic: ``routing`` (routing records, expert-class statistics) and
``flops`` (analytic FLOP counts per model family), ``timing`` (measured step times side by side),
``modality`` (per-modality success rates, expert shares and experts used of a one-tower MoE),
``zero_shot`` (zero-shot classification with prompt ensembling, retrieval recall@k), ``sweeps`` (seed
statistics of recorded training runs) and ``limoe_runs`` (the tables and curves of the recorded LIMoE runs)."""

from moe_course.analysis.flops import (
    attention_flops,
    flops_breakdown,
    flops_per_image,
    isoflop_depth,
    mlp_flops,
    soft_moe_flops,
    soft_moe_layer_flops,
    sparse_moe_flops,
)
from moe_course.analysis.modality import (
    expert_shares,
    experts_used,
    measure_success_rates,
    priority_by_modality,
    success_rate,
    success_rates,
)
from moe_course.analysis.routing import collect_routing, expert_class_weights, token_served
from moe_course.analysis.sweeps import read_runs, seed_spread, seed_table
from moe_course.analysis.zero_shot import (
    embed_images,
    embed_texts,
    evaluate_contrastive,
    recall_at_k,
    zero_shot_predictions,
    zero_shot_weights,
)

__all__ = ["attention_flops", "collect_routing", "embed_images", "embed_texts", "evaluate_contrastive",
           "expert_class_weights", "expert_shares", "experts_used", "flops_breakdown", "flops_per_image",
           "isoflop_depth", "measure_success_rates", "mlp_flops", "priority_by_modality", "read_runs", "recall_at_k",
           "seed_spread", "seed_table", "soft_moe_flops", "soft_moe_layer_flops", "sparse_moe_flops", "success_rate",
           "success_rates", "token_served", "zero_shot_predictions", "zero_shot_weights"]
