"""PyTorch twin of ``moe_course.train.mixup``: big_vision's mixup (``big_vision/utils.py`` ``get_mixup``).

One ratio per batch, r = max(a, 1 - a) with a ~ Beta(p, p); every example mixed with the batch rolled by one
(``torch.roll(x, 1, dims=0)``), the one-hot labels with the same r. The draw comes from ``generator``: a 63-bit
seed from it feeds ``numpy.random.default_rng(seed).beta(p, p)`` (torch's Beta sampler takes no generator).
"""

from __future__ import annotations

import numpy as np
import torch


def mixup_ratio(p: float, generator: torch.Generator | None = None) -> float:
    """max(a, 1 - a), a ~ Beta(p, p), from ``generator`` (None: torch's default generator); in [0.5, 1]."""
    if not p > 0:
        raise ValueError(f"mixup p={p!r} is not allowed; use p > 0 (0 means no mixup: do not call mixup)")
    seed = int(torch.randint(0, 2**63 - 1, (), generator=generator))
    a = float(np.random.default_rng(seed).beta(p, p))
    return max(a, 1.0 - a)


def mixup(images: torch.Tensor, labels: torch.Tensor, *, p: float, generator: torch.Generator | None = None,
          ratio: float | None = None) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(mixed images, mixed labels, r): ``r * x + (1 - r) * roll(x, 1, dims=0)`` for both, r = ``ratio`` or
    ``mixup_ratio(p, generator)``. images (batch, ...) float (NCHW or NHWC alike); labels (batch, classes)
    float. Raises ValueError for p <= 0 or different batch sizes."""
    if images.shape[0] != labels.shape[0]:
        raise ValueError(f"images ({images.shape[0]}) and labels ({labels.shape[0]}) have different batch sizes")
    r = mixup_ratio(p, generator) if ratio is None else float(ratio)
    mix = lambda x: r * x + (1.0 - r) * torch.roll(x, shifts=1, dims=0)  # noqa: E731
    return mix(images), mix(labels), r
