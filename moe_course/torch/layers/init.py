"""Parameter initialisation as the Flax NNX originals do it, so a fresh PyTorch model trains like a fresh JAX one."""

from __future__ import annotations

import math

import torch

# jax.nn.initializers.lecun_normal draws a normal truncated at 2 std and rescales it to unit variance.
_TRUNCATED_STD = 0.87962566103423978


@torch.no_grad()
def lecun_normal_(tensor: torch.Tensor, fan_in: int) -> torch.Tensor:
    """Fill ``tensor`` in place with LeCun-normal values: truncated normal of variance 1 / fan_in."""
    std = math.sqrt(1.0 / fan_in) / _TRUNCATED_STD
    return torch.nn.init.trunc_normal_(tensor, std=std, a=-2 * std, b=2 * std)


def linear(in_features: int, out_features: int, *, bias: bool = True) -> torch.nn.Linear:
    """``torch.nn.Linear`` initialised as ``flax.nnx.Linear``: LeCun-normal weight, zero bias."""
    layer = torch.nn.Linear(in_features, out_features, bias=bias)
    lecun_normal_(layer.weight, in_features)
    if bias:
        torch.nn.init.zeros_(layer.bias)
    return layer
