"""Analytic forward FLOPs per image of every model family, so that "matched cost" is computed, not eyeballed.

Convention: one multiply-add is 2 FLOPs, and only the matrix products are counted (patch embedding,
attention projections and the two attention products, MLPs and experts, routers, Soft MoE dispatch and
combine, the head). Biases, LayerNorms, softmaxes, GELUs, the L2 normalisation and index gathers are left
out: they are O(tokens * width) and a few percent at most at the course's sizes. Training costs about three
times the forward FLOPs (forward + two products per weight in the backward pass) for every family alike, so
ratios between models are the same for training and inference.

What each family adds to a block, for T tokens of width D and an MLP of hidden size H:
- dense ViT: MLP ``2 * 2 T D H`` (two matrices).
- V-MoE / Tokens Choice and Experts Choice (``SparseMoE``): router ``2 T D E``; the experts process every
  slot of their buffers, full or empty: ``E * B / group_size`` slots per image with
  ``B = expert_capacity(k, group_size * T, C, E)`` (V-MoE Sec. 2.4), each ``2 * 2 D H``; the combine step's
  weighted sum over a token's choices ``2 T k' D`` with k' = k (k' = E for Experts Choice, which the library
  combines through an Allocation with one choice per expert).
- Soft MoE: logits ``2 T D S`` for S = n*p slots, slots ``D^T X`` ``2 T S D``, experts ``S * 2 * 2 D H``,
  output ``C Y~`` ``2 T S D`` (Eq. 1-3 of Puigcerver et al.).
- Mixture-of-Depths (A-MoD): an MoD block runs its attention and MLP on K = round(C T) tokens only, plus a
  standard router's ``2 T D`` (attention routing averages maps that already exist: no matrix product).
- LIMoE and the dense one-tower model (``LIMoEConfig``): counted per image-text PAIR, whose T = P + L tokens
  (P patches, L = seq_len text positions, padding included: it runs through attention and dense MLPs, and
  the expert buffers are sized for it) share one encoder sequence. Attention is counted over all T tokens,
  as the implementation computes it (a block-diagonal mask keeps the modalities apart; separate towers
  would skip the 2 * 2 * 2 P L D cross products). The token embedding is a lookup (0 FLOPs); the head is
  the two linear projections to ``embed_dim``, ``2 * 2 D embed_dim``; the similarity matrix of the loss is
  left out (it depends on the batch, not the model).
"""

from __future__ import annotations

import warnings

from moe_course.configs.limoe import LIMoEConfig
from moe_course.configs.mod import MoDConfig
from moe_course.configs.soft_moe import SoftMoEConfig
from moe_course.configs.vit import ViTConfig, backbone_of
from moe_course.configs.vmoe import VMoEConfig
from moe_course.routing import CapacityRoundingWarning, expert_capacity, mod_capacity


def mlp_flops(tokens: int, width: int, hidden: int) -> int:
    """A two-layer MLP width -> hidden -> width on ``tokens`` tokens: 4 T D H."""
    return 2 * 2 * tokens * width * hidden


def attention_flops(tokens: int, width: int) -> int:
    """Multi-head self-attention: q, k, v, out projections 8 T D^2, scores Q K^T 2 T^2 D, weighted values 2 T^2 D."""
    return 4 * 2 * tokens * width * width + 2 * 2 * tokens * tokens * width


def tokens_per_example(config: ViTConfig) -> int:
    """Encoder tokens per example: an image's ``num_tokens``, or an image-text pair's P + seq_len for LIMoE."""
    return config.num_patches + config.seq_len if isinstance(config, LIMoEConfig) else config.num_tokens


def sparse_moe_flops(config: VMoEConfig) -> int:
    """One SparseMoE block's FLOPs per example (router + full expert buffers + combine), see the module docstring."""
    t, d, e = tokens_per_example(config), config.width, config.num_experts
    with warnings.catch_warnings():  # the count uses whatever integer capacity the layer uses
        warnings.simplefilter("ignore", CapacityRoundingWarning)
        capacity = expert_capacity(config.k, config.group_size * t, config.capacity_ratio, e,
                                   rounding=config.capacity_rounding, multiple_of=config.capacity_multiple_of)
    slots = e * capacity / config.group_size  # expert slots per image
    choices = e if config.allocation == "experts_choice" else config.k
    return round(2 * t * d * e + slots * mlp_flops(1, d, config.mlp_dim) + 2 * t * choices * d)


def soft_moe_layer_flops(tokens: int, width: int, hidden: int, slots: int) -> int:
    """A Soft MoE layer on one image of ``tokens`` tokens with ``slots`` = n*p slots: logits ``X Phi``, slots
    ``D^T X`` and output ``C Y~`` (3 * 2 T D S), and the experts' MLPs on the S slots (4 S D H); Eq. 1-3."""
    return 3 * 2 * tokens * width * slots + mlp_flops(slots, width, hidden)


def soft_moe_flops(config: SoftMoEConfig) -> int:
    """One Soft MoE block's FLOPs per image for ``config`` (``soft_moe_layer_flops`` of its sizes)."""
    return soft_moe_layer_flops(config.num_tokens, config.width, config.mlp_dim, config.num_slots)


def flops_breakdown(config: ViTConfig) -> dict[str, int]:
    """Forward FLOPs per image by part: {"embed", "attention", "mlp", "moe", "head"} (all blocks summed).

    config: a ViTConfig (dense ViT), VMoEConfig (V-MoE: Tokens or Experts Choice by ``allocation``),
    SoftMoEConfig (router "soft" or "sparse"), MoDConfig, or LIMoEConfig (per image-text pair; "head" = the two
    projections). "mlp" covers the dense blocks' MLPs (an MoD block's on its kept tokens, with its router),
    "moe" the MoE blocks. Raises ValueError (from validate) for an invalid config.
    """
    config.validate()
    t, d = tokens_per_example(config), config.width
    moe_blocks = set(config.moe_blocks()) if isinstance(config, VMoEConfig) else set()
    if isinstance(config, SoftMoEConfig) and config.router == "soft":
        moe_block = soft_moe_flops(config)
    elif moe_blocks:
        moe_block = sparse_moe_flops(config)
    else:
        moe_block = 0
    mod_blocks = len(config.mod_blocks()) if isinstance(config, MoDConfig) else 0
    kept = mod_capacity(t, config.capacity) if mod_blocks else t
    router = 2 * t * d if mod_blocks and config.router == "standard" else 0
    head_in = config.representation_size or d
    head = 2 * head_in * config.num_classes + (2 * d * head_in if config.representation_size else 0)
    if isinstance(config, LIMoEConfig):
        head = 2 * 2 * d * config.embed_dim
    return {
        "embed": 2 * config.num_patches * config.patch_size ** 2 * config.channels * d,
        "attention": (config.depth - mod_blocks) * attention_flops(t, d) + mod_blocks * attention_flops(kept, d),
        "mlp": ((config.depth - len(moe_blocks) - mod_blocks) * mlp_flops(t, d, config.mlp_dim)
                + mod_blocks * (mlp_flops(kept, d, config.mlp_dim) + router)),
        "moe": len(moe_blocks) * moe_block,
        "head": head,
    }


def flops_per_image(config: ViTConfig) -> int:
    """Total forward FLOPs per image (per image-text pair for LIMoE) of the model ``config`` describes (sum of
    ``flops_breakdown``)."""
    return sum(flops_breakdown(config).values())


def isoflop_depth(config: ViTConfig) -> int:
    """Blocks of the dense ViT on ``config``'s backbone whose forward FLOPs per image come closest to those of
    ``config`` (A-MoD Sec. 4.1 and Table 1: the isoFLOP baseline is the pretrained model with fewer layers).

    config: any model config of the course (MoDConfig, VMoEConfig, SoftMoEConfig, ViTConfig). Returns an int
    in 1..config.depth; on a tie the shallower model. Raises ValueError (from validate) for an invalid config.
    """
    target = flops_per_image(config)
    dense = backbone_of(config)
    costs = {depth: flops_per_image(dense.replace(depth=depth)) for depth in range(1, config.depth + 1)}
    return min(costs, key=lambda depth: (abs(costs[depth] - target), depth))
