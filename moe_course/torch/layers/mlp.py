"""PyTorch twin of ``moe_course.layers.mlp``: MLP(x) = W2 gelu(W1 x), exact (erf) GELU."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from moe_course.torch.layers.init import linear


class MLP(torch.nn.Module):
    """x (..., width) -> (..., width) through ``hidden`` units (SPEC Sec. 1)."""

    def __init__(self, width: int, hidden: int, *, gelu: str = "exact"):
        super().__init__()
        self.gelu = gelu
        self.fc1, self.fc2 = linear(width, hidden), linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (..., width) -> (..., width): fc2(GELU(fc1(x))), GELU exact (erf) or "tanh" as in the JAX twin."""
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh" if self.gelu == "tanh" else "none"))
