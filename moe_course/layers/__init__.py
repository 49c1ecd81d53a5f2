"""Flax NNX layers. Each returns its output and, where it routes, a routing record."""

from moe_course.layers.attention import MultiHeadAttention, attention_weights
from moe_course.layers.block import LAYER_NORM_EPS, EncoderBlock
from moe_course.layers.experts import Experts
from moe_course.layers.mlp import MLP
from moe_course.layers.mod import MoDBlock, MoDRecord
from moe_course.layers.moe import MoEOutput, RoutingRecord, SparseMoE
from moe_course.layers.soft_moe import SoftMoE, SoftRoutingRecord

__all__ = ["EncoderBlock", "Experts", "LAYER_NORM_EPS", "MLP", "MoDBlock", "MoDRecord", "MoEOutput",
           "MultiHeadAttention", "RoutingRecord", "SoftMoE", "SoftRoutingRecord", "SparseMoE", "attention_weights"]
