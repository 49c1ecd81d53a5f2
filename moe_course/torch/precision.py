"""Mixed precision for the PyTorch twins, the PyTorch way: ``torch.autocast`` around the forward pass, float32
parameters, and the routing kept in float32 inside it (as the JAX models keep it under ``dtype="bfloat16"``).

Under ``torch.autocast(device_type, dtype=torch.bfloat16)`` matrix products run in bfloat16. The twins leave
autocast for the patch embedding, the router logits, Soft MoE's logits and softmaxes, the MoD router scores, the
attention maps they hand back (A-MoD routes on them), the allocation, the aux losses and the final LayerNorm,
pooling and head, so those are float32 as in the JAX models (``ViTConfig``, "dtype"); the residual stream stays
float32 too (autocast's LayerNorm outputs are float32, and float32 + bfloat16 is float32).
"""

from __future__ import annotations

import contextlib

import torch

AUTOCAST_DTYPES = {"bfloat16": torch.bfloat16}


def float32_region(tensor: torch.Tensor) -> contextlib.AbstractContextManager:
    """A block in which autocast is off on ``tensor``'s device: cast the inputs with ``.float()`` and every
    product in it is float32."""
    return torch.autocast(tensor.device.type, enabled=False)


def autocast_for(config, device_type: str) -> contextlib.AbstractContextManager:
    """The context a twin of ``config`` runs in on ``device_type`` ("cuda", "cpu"): ``torch.autocast`` in
    bfloat16 for ``config.dtype == "bfloat16"``, nothing for float32. Raises ValueError for another dtype."""
    if config.dtype == "float32":
        return contextlib.nullcontext()
    if config.dtype not in AUTOCAST_DTYPES:
        raise ValueError(f"dtype={config.dtype!r} is not allowed; use 'float32' or {', '.join(map(repr, AUTOCAST_DTYPES))}")
    return torch.autocast(device_type, dtype=AUTOCAST_DTYPES[config.dtype])
