"""Measurements on models, one file per topic: ``routing`` (routing records, expert-class statistics) and
``flops`` (analytic FLOP counts per model family), ``timing`` (measured step times side by side)."""

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
from moe_course.analysis.routing import collect_routing, expert_class_weights, token_served

__all__ = ["attention_flops", "collect_routing", "expert_class_weights", "flops_breakdown", "flops_per_image",
           "isoflop_depth", "mlp_flops", "soft_moe_flops", "soft_moe_layer_flops", "sparse_moe_flops", "token_served"]
