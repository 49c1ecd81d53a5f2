"""PyTorch twin of ``moe_course.layers.experts``: E expert MLPs applied to their buffers in one batched einsum."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from moe_course.torch.layers.init import lecun_normal_


def grouped_gemm_dtype(x: torch.Tensor) -> torch.dtype | None:
    """bfloat16 when the expert products of ``x`` should run as grouped GEMMs, else None: ``torch._grouped_mm``
    exists in this torch, ``x`` is on a CUDA device of compute capability >= 9.0 (Hopper, where the kernel is a
    fused CUTLASS grouped GEMM) and the computation is bfloat16 (x's dtype, or autocast's)."""
    if not (hasattr(torch, "_grouped_mm") and x.is_cuda and torch.cuda.get_device_capability(x.device) >= (9, 0)):
        return None
    autocast = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else None
    return torch.bfloat16 if (autocast or x.dtype) == torch.bfloat16 else None


def grouped_products(x: torch.Tensor, weights: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Each expert's rows times its own matrix in one grouped GEMM: x (experts, rows, d_in), weights (experts,
    d_in, d_out) -> (experts, rows, d_out) in ``dtype`` (``torch._grouped_mm``, 3-D x 3-D; differentiable)."""
    return torch._grouped_mm(x.to(dtype), weights.to(dtype))


class Experts(torch.nn.Module):
    """E MLPs, e_i(x) = W2_i gelu(W1_i x + b1_i) + b2_i (V-MoE Sec. 2.1, exact GELU or
    gelu="tanh").

    forward: buffers (groups, experts, capacity, width) -> same shape; buffer e goes through expert e;
    ``dropout`` acts on the hidden units in training mode. Parameters in the JAX layout (not transposed as
    ``torch.nn.Linear`` would be): fc1_kernel (E, width, hidden), fc1_bias (E, hidden), fc2_kernel
    (E, hidden, width), fc2_bias (E, width).
    On a Hopper GPU in bfloat16 (``grouped_gemm_dtype``) the two products run as grouped GEMMs
    (``torch._grouped_mm``) on the expert-major layout (experts, groups * capacity, width), as the JAX twin lays
    them out; elsewhere (CPU, float32, older GPUs, a torch without it) as the batched einsums below.
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
        dtype = grouped_gemm_dtype(buffers)
        aligned = buffers.shape[-1] % 8 == 0 and self.fc1_kernel.shape[-1] % 8 == 0  # 16-byte rows of bfloat16
        if dtype is not None and aligned:
            groups, experts, capacity, width = buffers.shape
            x = buffers.transpose(0, 1).reshape(experts, groups * capacity, width)
            h = grouped_products(x, self.fc1_kernel, dtype) + self.fc1_bias[:, None].to(dtype)
            h = self.drop(F.gelu(h, approximate="tanh" if self.gelu == "tanh" else "none"))
            y = grouped_products(h, self.fc2_kernel, dtype) + self.fc2_bias[:, None].to(dtype)
            return y.reshape(experts, groups, capacity, width).transpose(0, 1)
        h = torch.einsum("gecd,edh->gech", buffers, self.fc1_kernel) + self.fc1_bias[None, :, None]
        h = self.drop(F.gelu(h, approximate="tanh" if self.gelu == "tanh" else "none"))
        return torch.einsum("gech,ehd->gecd", h, self.fc2_kernel) + self.fc2_bias[None, :, None]
