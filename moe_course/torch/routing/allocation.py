"""PyTorch twin of ``moe_course.routing.allocation``: which token choices get a buffer slot (V-MoE App. C).

Vanilla (Algorithm 1), Batch Prioritized Routing (Algorithm 2), skip-patch (Algorithm 3) and experts choice
(Zhou et al. 2022), vectorised exactly as the JAX module (see its docstring): tokens sorted into processing
order, choices flattened K-major, a cumulative sum of one-hot choices gives each choice its buffer position.
Sorting is stable, so ties between equal priority scores go to the lower token index, as in JAX.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import torch

from moe_course.routing.allocation import COMBINE_WEIGHTS, METHODS, SCORES, check_choice_arrays, kept_tokens
from moe_course.routing.checks import check_choice, check_floating, check_int, check_ndim
from moe_course.torch.routing.router import top_k

__all__ = ["COMBINE_WEIGHTS", "METHODS", "SCORES", "Allocation", "ExpertsChoice", "allocate", "allocate_in_order",
           "batch_prioritized_allocation", "experts_choice_allocation", "experts_choice_as_allocation", "token_normalized_weights",
           "kept_tokens", "one_hot", "priority_scores", "skip_patch_allocation", "vanilla_allocation"]


def one_hot(index: torch.Tensor, num_classes: int, dtype: torch.dtype = torch.int64) -> torch.Tensor:
    """(...) int -> (..., num_classes): 1 at ``index``, all 0 for an index outside [0, num_classes), e.g. -1
    (``jax.nn.one_hot``'s rule; ``torch.nn.functional.one_hot`` raises there)."""
    return (index[..., None] == torch.arange(num_classes, device=index.device)).to(dtype)


@dataclasses.dataclass(frozen=True)
class Allocation:
    """As ``moe_course.routing.Allocation``, torch tensors: expert_index, gates, slot (groups, tokens, k)
    (slot -1 = dropped), priority_rank (groups, tokens) int32 or None; num_experts E; capacity B."""

    expert_index: torch.Tensor
    gates: torch.Tensor
    slot: torch.Tensor
    priority_rank: torch.Tensor | None
    num_experts: int
    capacity: int

    @property
    def served(self) -> torch.Tensor:
        """(groups, tokens, k) bool: True where the choice got a buffer slot."""
        return self.slot >= 0

    @property
    def combine_weights(self) -> torch.Tensor:
        """(groups, tokens, k): gates of served choices, 0 for dropped ones; a non-finite gate is kept."""
        keep = self.served | ~torch.isfinite(self.gates)
        return torch.where(keep, self.gates, torch.zeros_like(self.gates))

    @property
    def expert_fill(self) -> torch.Tensor:
        """(groups, experts) int32: how many of each expert's ``capacity`` slots are used."""
        hot = one_hot(self.expert_index.long(), self.num_experts) * self.served[..., None]
        return hot.sum(dim=(1, 2)).int()


def priority_scores(gates: torch.Tensor, *, score: str = "max") -> torch.Tensor:
    """BPR priority score per token (V-MoE Sec. 4.1): (groups, tokens, k) -> (groups, tokens); "max" or "sum"."""
    check_choice("score", score, SCORES)
    return gates.amax(dim=-1) if score == "max" else gates.sum(dim=-1)


def _take_tokens(values: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """values (groups, tokens, ...) reordered along tokens by index (groups, tokens) (``take_along_axis``)."""
    index = index.long().reshape(*index.shape, *([1] * (values.ndim - 2))).expand(-1, -1, *values.shape[2:])
    return torch.gather(values, 1, index)


def allocate_in_order(expert_index: torch.Tensor, order: torch.Tensor, capacity: int, num_experts: int, *,
                      num_kept: int | None = None, excluded: torch.Tensor | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Fill the expert buffers K-major, visiting tokens in ``order`` (the common core of Algorithms 1-3).

    Arguments and results as the JAX ``allocate_in_order``: expert_index (groups, tokens, k), order (groups,
    tokens) a permutation, num_kept, excluded (groups, tokens) bool -> (slot (groups, tokens, k) int32 with
    -1 for dropped choices, priority_rank (groups, tokens) int32).
    """
    groups, tokens, k = expert_index.shape
    in_order = _take_tokens(expert_index.long(), order)
    choices = in_order.transpose(1, 2).reshape(groups, k * tokens)  # K-major: all TOP-1, then TOP-2 ...
    hot = one_hot(choices, num_experts)  # (G, k*T, E)
    taking_part = torch.ones(groups, tokens, dtype=torch.bool, device=expert_index.device)
    if num_kept is not None and num_kept < tokens:
        taking_part = taking_part & (torch.arange(tokens, device=expert_index.device) < num_kept)
    if excluded is not None:
        taking_part = taking_part & ~_take_tokens(excluded, order)
    taking_part = taking_part.repeat(1, k)
    hot = hot * taking_part[..., None]
    position = torch.gather(hot.cumsum(dim=1), 2, choices[..., None])[..., 0] - 1
    slot = torch.where(taking_part & (position < capacity), position, -1).int()
    slot = slot.reshape(groups, k, tokens).transpose(1, 2)
    rank = torch.argsort(order, dim=1).int()
    return _take_tokens(slot, rank), rank


def _nonfinite(gates: torch.Tensor) -> torch.Tensor:
    return ~torch.isfinite(gates).all(dim=-1)


def _excluded(gates: torch.Tensor, token_mask: torch.Tensor | None) -> torch.Tensor:
    """(groups, tokens) bool: tokens that take no slot -- non-finite gates, or False in ``token_mask``."""
    excluded = _nonfinite(gates)
    if token_mask is None:
        return excluded
    if tuple(token_mask.shape) != tuple(excluded.shape):
        raise ValueError(f"token_mask has shape {tuple(token_mask.shape)}; it must be (groups, tokens) = "
                         f"{tuple(excluded.shape)}")
    return excluded | ~token_mask.bool()


def _priority_order(gates: torch.Tensor, score: str, excluded: torch.Tensor) -> torch.Tensor:
    # Highest score first, stable (ties: lower token index first); excluded tokens last.
    scores = torch.where(excluded, -torch.inf, priority_scores(gates, score=score))
    return torch.argsort(-scores, dim=1, stable=True).int()


def _allocation(expert_index, gates, capacity, num_experts, order, excluded, num_kept=None) -> Allocation:
    slot, rank = allocate_in_order(expert_index, order, capacity, num_experts, num_kept=num_kept,
                                   excluded=excluded)
    return Allocation(expert_index.int(), gates, slot, rank, num_experts, capacity)


def vanilla_allocation(expert_index: torch.Tensor, gates: torch.Tensor, capacity: int, num_experts: int, *,
                       token_mask: torch.Tensor | None = None) -> Allocation:
    """Vanilla routing (V-MoE App. C, Algorithm 1): TOP-i rounds in turn, tokens in group order.
    expert_index, gates: (groups, tokens, k) from ``top_k_routing``. token_mask: (groups, tokens) bool or
    None; False tokens (padding) take no slot. Errors as the JAX function."""
    check_choice_arrays(expert_index, gates, num_experts, capacity)
    groups, tokens, _ = expert_index.shape
    order = torch.arange(tokens, dtype=torch.int32, device=expert_index.device).expand(groups, tokens)
    return _allocation(expert_index, gates, capacity, num_experts, order, _excluded(gates, token_mask))


def batch_prioritized_allocation(expert_index: torch.Tensor, gates: torch.Tensor, capacity: int,
                                 num_experts: int, *, score: str = "max",
                                 token_mask: torch.Tensor | None = None) -> Allocation:
    """Batch Prioritized Routing (V-MoE Sec. 4.1, Algorithm 2): tokens by priority score, highest first;
    tokens masked out by ``token_mask`` take no slot and rank last."""
    check_choice_arrays(expert_index, gates, num_experts, capacity)
    excluded = _excluded(gates, token_mask)
    return _allocation(expert_index, gates, capacity, num_experts, _priority_order(gates, score, excluded), excluded)


def skip_patch_allocation(expert_index: torch.Tensor, gates: torch.Tensor, capacity: int, num_experts: int, *,
                          keep_fraction: float, score: str = "max",
                          token_mask: torch.Tensor | None = None) -> Allocation:
    """Skip-patch routing (V-MoE App. C.1, Algorithm 3): only the top ``keep_fraction`` of tokens, then BPR;
    token_mask as ``batch_prioritized_allocation``."""
    check_choice_arrays(expert_index, gates, num_experts, capacity)
    num_kept = kept_tokens(expert_index.shape[1], keep_fraction)
    excluded = _excluded(gates, token_mask)
    return _allocation(expert_index, gates, capacity, num_experts, _priority_order(gates, score, excluded), excluded,
                       num_kept)


def allocate(expert_index: torch.Tensor, gates: torch.Tensor, capacity: int, num_experts: int, *,
             method: str = "bpr", score: str = "max", keep_fraction: float | None = None,
             token_mask: torch.Tensor | None = None) -> Allocation:
    """One entry point for the three token-choice allocations, as the JAX ``allocate`` (same errors);
    token_mask: (groups, tokens) bool or None, False tokens take no buffer slot."""
    check_choice("method", method, METHODS)
    if method == "skip_patch":
        if keep_fraction is None:
            raise ValueError("keep_fraction=None is not allowed for method='skip_patch'; use 0 < keep_fraction <= 1")
        return skip_patch_allocation(expert_index, gates, capacity, num_experts, keep_fraction=keep_fraction,
                                     score=score, token_mask=token_mask)
    if keep_fraction is not None:
        raise ValueError(f"keep_fraction={keep_fraction!r} is only allowed with method='skip_patch'; use None")
    if method == "vanilla":
        return vanilla_allocation(expert_index, gates, capacity, num_experts, token_mask=token_mask)
    return batch_prioritized_allocation(expert_index, gates, capacity, num_experts, score=score,
                                        token_mask=token_mask)


class ExpertsChoice(NamedTuple):
    """As ``moe_course.routing.ExpertsChoice``: token_index (groups, experts, capacity) int32, best first;
    weights (groups, experts, capacity) float, their router probabilities."""

    token_index: torch.Tensor
    weights: torch.Tensor


def token_normalized_weights(token_index: torch.Tensor, weights: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """As the JAX function: each token's weights (groups, experts, capacity) divided by their sum over the
    experts that took it (sparse upcycling, Komatsuzaki et al. 2023, Sec. 2.2)."""
    index = token_index.long().flatten(1)
    total = weights.new_zeros((weights.shape[0], num_tokens)).scatter_add(1, index, weights.flatten(1))
    return weights / torch.gather(total, 1, index).view_as(weights)


def experts_choice_allocation(probs: torch.Tensor, capacity: int, *,
                              combine_weights: str = "probabilities") -> ExpertsChoice:
    """Each expert takes the ``capacity`` tokens of its group with the highest router probability (ties: lower
    token index first; tokens with non-finite probabilities last). probs: (groups, tokens, experts).
    combine_weights: "probabilities" or "token_normalized", as in the JAX function."""
    check_ndim("probs", probs, 3, "(groups, tokens, experts)")
    check_floating("probs", probs)
    capacity = check_int("capacity", capacity, minimum=1, maximum=probs.shape[1])
    check_choice("combine_weights", combine_weights, COMBINE_WEIGHTS)
    by_expert = probs.transpose(1, 2)  # (G, E, T)
    scores = torch.where(_nonfinite(probs)[:, None, :], -torch.inf, by_expert)
    token_index = top_k(scores, capacity)[1]
    weights = torch.gather(by_expert, 2, token_index)
    if combine_weights == "token_normalized":
        weights = token_normalized_weights(token_index, weights, probs.shape[1])
    return ExpertsChoice(token_index.int(), weights)


def experts_choice_as_allocation(choice: ExpertsChoice, num_tokens: int) -> Allocation:
    """View an experts-choice result as an ``Allocation`` with k = E (see the JAX function):
    arrays of shape (groups, num_tokens, experts), priority_rank None."""
    groups, num_experts, capacity = choice.token_index.shape
    num_tokens = check_int("num_tokens", num_tokens)
    device = choice.token_index.device
    where = (torch.arange(groups, device=device)[:, None, None], choice.token_index.long(),
             torch.arange(num_experts, device=device)[None, :, None])
    b = torch.arange(capacity, dtype=torch.int32, device=device).expand(choice.token_index.shape)
    slot = torch.full((groups, num_tokens, num_experts), -1, dtype=torch.int32, device=device).index_put(where, b)
    gates = choice.weights.new_zeros((groups, num_tokens, num_experts)).index_put(where, choice.weights)
    expert_index = torch.arange(num_experts, dtype=torch.int32, device=device).expand(slot.shape)
    return Allocation(expert_index, gates, slot, None, num_experts, capacity)
