"""PyTorch twin of ``moe_course.routing.router``: noisy logits, softmax over experts, TOP_k (V-MoE Sec. 2.3).

Same names, arguments, results and errors as the JAX module (see its docstring for the algorithm and the
non-finite convention), with one substitution: the JAX PRNG ``key`` becomes a ``torch.Generator``. Because
a generator's draws differ from JAX's, the noise functions also take ``noise``: a standard-normal draw of the
logits' shape, scaled by ``noise_std`` here -- feed the same draw to both frameworks and they agree.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from moe_course.routing.checks import check_floating
from moe_course.routing.router import ORDERS, check_routing_args, default_noise_std, router_noise_std

__all__ = ["ORDERS", "RouterOutput", "add_router_noise", "default_noise_std", "nonfinite_tokens",
           "router_probabilities", "top_k", "top_k_routing"]


def top_k(values: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest entries along the last axis and their indices, largest first, as ``jax.lax.top_k`` ranks
    them: among equal values the lower index first (``torch.topk`` does not promise an order), and +0 above -0
    (JAX sorts floats in IEEE total order; torch's sort treats them as equal). (..., n) -> (..., k)."""
    by_sign = torch.argsort(torch.signbit(values).to(torch.uint8), dim=-1, stable=True)  # +0 before -0
    order = torch.sort(torch.gather(values, -1, by_sign), dim=-1, descending=True, stable=True).indices
    index = torch.gather(by_sign, -1, order[..., :k])
    return torch.gather(values, -1, index), index


def add_router_noise(logits: torch.Tensor, generator: torch.Generator | None = None, *,
                     noise_std: float | None = None, noise: torch.Tensor | None = None) -> torch.Tensor:
    """Noisy router logits ``W x + eps`` with ``eps = noise_std * z``, z standard normal per entry.

    logits: (..., experts) floating, usually (groups, tokens, experts). generator: draws z (training); None
    and no ``noise`` (evaluation) returns the logits unchanged. noise: z itself, a (..., experts) tensor of
    the logits' shape (e.g. the JAX layer's ``jax.random.normal(key, shape)``); give generator or noise, not
    both. noise_std: None means 1 / E (V-MoE Sec. 2.3); 0 adds nothing. Returns float32 logits.
    Raises ValueError for non-floating logits, a negative or non-finite noise_std, a noise of another
    shape, or both generator and noise.
    """
    check_floating("logits", logits)
    logits = logits.float()
    std = router_noise_std(noise_std, logits.shape[-1])
    if generator is not None and noise is not None:
        raise ValueError("generator and noise are both given; pass one (noise is the standard-normal draw itself)")
    if noise is not None and tuple(noise.shape) != tuple(logits.shape):
        raise ValueError(f"noise has shape {tuple(noise.shape)}; it must match logits {tuple(logits.shape)}")
    if std == 0.0 or (generator is None and noise is None):
        return logits
    if noise is None:
        noise = torch.randn(logits.shape, generator=generator, device=logits.device, dtype=torch.float32)
    return logits + std * noise.to(logits)


class RouterOutput(NamedTuple):
    """As ``moe_course.routing.RouterOutput``, torch tensors: expert_index (groups, tokens, k) int32, gates
    (groups, tokens, k) float32, probs and noisy_logits (groups, tokens, experts) float32."""

    expert_index: torch.Tensor
    gates: torch.Tensor
    probs: torch.Tensor
    noisy_logits: torch.Tensor


def nonfinite_tokens(values: torch.Tensor) -> torch.Tensor:
    """(..., n) -> (...) bool: True for every row (token) holding a NaN or an infinity."""
    return ~torch.isfinite(values).all(dim=-1)


def _nan_where_nonfinite(values: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    return torch.where(nonfinite_tokens(logits)[..., None], torch.nan, values)


def router_probabilities(logits: torch.Tensor, generator: torch.Generator | None = None, *,
                         noise_std: float | None = None, noise: torch.Tensor | None = None) -> torch.Tensor:
    """softmax over experts of the (noisy) logits: (..., experts) -> (..., experts) float32, rows sum to 1.
    Noise as in ``add_router_noise``. A row with a non-finite logit is all NaN."""
    noisy = add_router_noise(logits, generator, noise_std=noise_std, noise=noise)
    return _nan_where_nonfinite(torch.softmax(noisy, dim=-1), noisy)


def top_k_routing(logits: torch.Tensor, k: int, generator: torch.Generator | None = None, *,
                  noise_std: float | None = None, order: str = "softmax_then_topk",
                  noise: torch.Tensor | None = None) -> RouterOutput:
    """Pick k experts per token and their gates (V-MoE Sec. 2.3; App. A.1 for ``order``), as the JAX
    ``top_k_routing``: "softmax_then_topk" gates are the k largest probabilities, not renormalised;
    "topk_then_softmax" (Shazeer et al. 2017) gates are a softmax over the k selected noisy logits.

    logits: (..., experts) floating. k: 1 <= k <= experts. generator / noise: router noise (see
    ``add_router_noise``). Ties go to the lower expert index. Raises ValueError naming k, order, noise_std or
    logits, with the JAX function's messages.
    """
    k = check_routing_args(logits, k, order)
    noisy = add_router_noise(logits, generator, noise_std=noise_std, noise=noise)
    probs = _nan_where_nonfinite(torch.softmax(noisy, dim=-1), noisy)
    if order == "softmax_then_topk":
        gates, expert_index = top_k(probs, k)
    else:
        top_logits, expert_index = top_k(noisy, k)
        gates = torch.softmax(top_logits, dim=-1)
    return RouterOutput(expert_index.int(), _nan_where_nonfinite(gates, noisy), probs, noisy)
