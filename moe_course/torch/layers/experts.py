"""PyTorch twin of ``moe_course.layers.experts``: E expert MLPs applied to their buffers in one batched einsum."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from moe_course.torch.layers.init import lecun_normal_


class Experts(torch.nn.Module):
    """E MLPs, e_i(x) = W2_i gelu(W1_i x + b1_i) + b2_i (V-MoE Sec. 2.1, exact GELU or
    gelu="tanh").

    forward: buffers (groups, experts, capacity, width) -> same shape; buffer e goes through expert e;
    ``dropout`` acts on the hidden units in training mode. Parameters in the JAX layout (not transposed as
    ``torch.nn.Linear`` would be): fc1_kernel (E, width, hidden), fc1_bias (E, hidden), fc2_kernel
    (E, hidden, width), fc2_bias (E, width).
    """

    def __init__(self, num_experts: int, width: int, hidden: int, *, dropout: float = 0.0, gelu: str = "exact"):
        super().__init__()
        self.gelu = gelu
        self.fc1_kernel = torch.nn.Parameter(lecun_normal_(torch.empty(num_experts, width, hidden), width))
        self.fc1_bias = torch.nn.Parameter(torch.zeros(num_experts, hidden))
        self.fc2_kernel = torch.nn.Parameter(lecun_normal_(torch.empty(num_experts, hidden, width), hidden))
        self.fc2_bias = torch.nn.Parameter(torch.zeros(num_experts, width))
        self.drop = torch.nn.Dropout(dropout)

    def forward(self, buffers: torch.Tensor) -> torch.Tensor:
        """buffers: (groups, experts, capacity, width) -> the same shape; expert e's MLP on its slots."""
        h = torch.einsum("gecd,edh->gech", buffers, self.fc1_kernel) + self.fc1_bias[None, :, None]
        h = self.drop(F.gelu(h, approximate="tanh" if self.gelu == "tanh" else "none"))
        return torch.einsum("gech,ehd->gecd", h, self.fc2_kernel) + self.fc2_bias[None, :, None]
