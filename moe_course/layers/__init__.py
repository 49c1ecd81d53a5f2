"""Flax NNX layers. Each returns its output and, where it routes, a routing record."""

from moe_course.layers.attention import MultiHeadAttention, attention_weights
from moe_course.layers.block import LAYER_NORM_EPS, EncoderBlock
from moe_course.layers.mlp import MLP

__all__ = ["EncoderBlock", "LAYER_NORM_EPS", "MLP", "MultiHeadAttention", "attention_weights"]
