"""PyTorch twins of ``moe_course.layers``: the same class names, constructor arguments (without ``rngs``),
parameter names and results; ``moe_course.torch.convert`` copies weights between the two."""

from moe_course.torch.layers.attention import MultiHeadAttention, attention_weights
from moe_course.torch.layers.block import EncoderBlock
from moe_course.torch.layers.experts import Experts
from moe_course.torch.layers.mlp import MLP
from moe_course.torch.layers.mod import MoDBlock, MoDRecord
from moe_course.torch.layers.moe import MoEOutput, RoutingRecord, SparseMoE
from moe_course.torch.layers.soft_moe import SoftMoE, SoftRoutingRecord

__all__ = ["EncoderBlock", "Experts", "MLP", "MoDBlock", "MoDRecord", "MoEOutput", "MultiHeadAttention",
           "RoutingRecord", "SoftMoE", "SoftRoutingRecord", "SparseMoE", "attention_weights"]
