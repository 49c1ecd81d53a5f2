"""Expert buffer capacity: how many tokens each expert processes per group (V-MoE Sec. 2.4).

Every expert gets a fixed-size buffer, ``B_e = round(k * N * P * C / E)``: the k * N * P choices a batch of
N images with P tokens each makes, shared evenly over E experts, times the capacity ratio C. C > 1 leaves
slack for uneven routing; C < 1 forces choices to be dropped (Batch Prioritized Routing decides which,
Sec. 4). Routing here happens within groups, so ``tokens_per_group`` plays the role of N * P.

Rounding differs from google-research/vmoe (``vmoe/moe.py``, ``compute_capacity``) in two ways, both
deliberate: "round" here rounds halves up (2.5 -> 3; vmoe calls Python's ``round``, which rounds halves to
even, 2.5 -> 2), and a capacity that rounds to 0 becomes 1 here (vmoe raises). Rounding halves up never
gives a smaller buffer than the ratio asks for at a tie, and a capacity of 1 keeps a tiny-ratio inference
sweep (Sec. 4, C down to 0.1) running on small groups. ``rounding="vmoe_round"`` reproduces vmoe exactly:
halves to even, no float slack, and ValueError where the capacity would be 0. (vmoe's own default is
``ceil`` with ``multiple_of=4``; "ceil" and ``multiple_of`` here give the same sizes except where float
error lands just above an integer, which the slack below absorbs.)
"""

from __future__ import annotations

import math
import warnings

from moe_course.routing.checks import check_choice, check_int, check_positive

ROUNDINGS = ("round", "ceil", "floor", "vmoe_round")
# Relative change of the capacity ratio, caused by rounding, above which ``expert_capacity`` warns.
RATIO_WARNING_TOLERANCE = 0.01
# Relative slack that absorbs floating-point error before rounding (e.g. 40 * 0.1 / 4 = 1.0000000000000002).
_FLOAT_SLACK = 1e-9


class CapacityRoundingWarning(UserWarning):
    """The integer buffer capacity gives a capacity ratio noticeably different from the one asked for."""


def round_count(value: float, rounding: str = "round") -> int:
    """An integer count from a real number: "round" (halves round up), "ceil", "floor" or "vmoe_round".

    A relative slack of 1e-9 is applied first, so that products such as 40 * 0.1 / 4, which evaluate to
    1.0000000000000002 in floating point, count as the 1 they stand for. "vmoe_round" is Python's
    ``round`` (halves to even, no slack), as google-research/vmoe rounds. Raises ValueError for an unknown
    ``rounding``.
    """
    check_choice("rounding", rounding, ROUNDINGS)
    if rounding == "vmoe_round":
        return int(round(value))
    slack = _FLOAT_SLACK * max(1.0, abs(value))
    if rounding == "ceil":
        return math.ceil(value - slack)
    if rounding == "floor":
        return math.floor(value + slack)
    return math.floor(value + 0.5 + slack)


def effective_capacity_ratio(capacity: int, k: int, tokens_per_group: int, num_experts: int) -> float:
    """The capacity ratio an integer buffer size really gives: ``B * E / (k * tokens_per_group)``."""
    return capacity * num_experts / (k * tokens_per_group)


def expert_capacity(
    k: int,
    tokens_per_group: int,
    capacity_ratio: float,
    num_experts: int,
    *,
    rounding: str = "round",
    multiple_of: int | None = None,
    warn: bool = True,
) -> int:
    """Buffer capacity of each expert, per group: ``round(k * tokens_per_group * capacity_ratio / num_experts)``.

    V-MoE Sec. 2.4, ``B_e = round(k N P C / E)``, with tokens_per_group = N * P.
    k: experts per token, 1 <= k <= num_experts. tokens_per_group: tokens routed together (>= 1).
    capacity_ratio: C > 0 (V-MoE trains with 1.05; Sec. 4 goes down to 0.1 at inference with BPR).
    num_experts: E >= 1. rounding: "round" (default; halves round up), "ceil", "floor", or "vmoe_round"
    (google-research/vmoe's ``compute_capacity(ceil_or_round="round")``: halves to even, and a capacity
    that rounds to 0 raises ValueError; see the module docstring for why "round" differs).
    multiple_of: if given, the capacity is then raised to the next multiple of it (hardware-friendly sizes).
    Returns an int >= 1 (a buffer of 0 would drop every token; the minimum is 1, except with "vmoe_round").

    Warns with ``CapacityRoundingWarning`` when the returned capacity changes the effective ratio
    ``B * E / (k * tokens_per_group)`` by more than ``RATIO_WARNING_TOLERANCE`` (1 %) relative to
    ``capacity_ratio`` -- e.g. small groups, where one slot is a large share of the buffer; ``warn=False``
    skips the warning (the PyTorch twins while ``torch.compile`` traces them, which cannot trace a warning).
    Raises ValueError naming the argument, its value and what is allowed when k < 1, k > num_experts,
    tokens_per_group < 1, capacity_ratio <= 0 (or not finite), num_experts < 1, an unknown rounding,
    multiple_of < 1, or a capacity of 0 under "vmoe_round".
    """
    num_experts = check_int("num_experts", num_experts)
    k = check_int("k", k, minimum=1, maximum=num_experts)
    tokens_per_group = check_int("tokens_per_group", tokens_per_group)
    capacity_ratio = check_positive("capacity_ratio", capacity_ratio)
    check_choice("rounding", rounding, ROUNDINGS)
    if multiple_of is not None:
        multiple_of = check_int("multiple_of", multiple_of)
    capacity = round_count(k * tokens_per_group * capacity_ratio / num_experts, rounding)
    if capacity < 1 and rounding == "vmoe_round":
        raise ValueError(
            f"capacity_ratio={capacity_ratio} gives an expert capacity of {capacity} with k={k}, "
            f"tokens_per_group={tokens_per_group}, num_experts={num_experts} and rounding='vmoe_round' "
            "(google-research/vmoe raises here too); use a larger capacity_ratio or group, or rounding='round'"
        )
    capacity = max(1, capacity)
    if multiple_of is not None:
        capacity += -capacity % multiple_of
    effective = effective_capacity_ratio(capacity, k, tokens_per_group, num_experts)
    if warn and abs(effective - capacity_ratio) > RATIO_WARNING_TOLERANCE * capacity_ratio:
        warnings.warn(
            f"expert capacity {capacity} gives an effective capacity_ratio of {effective:.4g} instead of "
            f"{capacity_ratio:.4g} (k={k}, tokens_per_group={tokens_per_group}, num_experts={num_experts}, "
            f"rounding={rounding!r}, multiple_of={multiple_of})",
            CapacityRoundingWarning,
            stacklevel=2,
        )
    return capacity
