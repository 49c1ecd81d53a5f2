"""Expert buffer capacity B_e = round(k N P C / E) (V-MoE Sec. 2.4): formula, rounding, warnings, errors."""

import warnings

import pytest

from moe_course.routing import (
    CapacityRoundingWarning,
    effective_capacity_ratio,
    expert_capacity,
    round_count,
)


def quiet_capacity(*args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CapacityRoundingWarning)
        return expert_capacity(*args, **kwargs)


def test_figure_1_example():
    # V-MoE Fig. 1: k = 1, 12 tokens per device (one expert per device, here 4), C = 4/3 -> 16 slots per expert.
    assert expert_capacity(1, 4 * 12, 4 / 3, 4) == 16


@pytest.mark.parametrize(
    "k, tokens, ratio, experts, rounding, expected",
    [
        (2, 196 * 4, 1.05, 32, "round", 51),  # 2*784*1.05/32 = 51.45
        (2, 196 * 4, 1.05, 32, "ceil", 52),
        (2, 196 * 4, 1.05, 32, "floor", 51),
        (1, 10, 1.0, 4, "round", 3),  # 2.5: halves round up
        (1, 10, 1.0, 4, "ceil", 3),
        (1, 10, 1.0, 4, "floor", 2),
        (1, 14, 1.0, 4, "round", 4),  # 3.5 -> 4
        (1, 100, 0.07, 1, "ceil", 7),  # 100 * 0.07 is 7.000000000000001 in floating point: still 7
        (1, 180, 0.7, 2, "floor", 63),  # 62.99999999999999 in floating point: still 63
        (1, 8, 0.05, 4, "round", 1),  # 0.1 rounds to 0 -> at least 1
        (1, 8, 0.05, 4, "floor", 1),
    ],
)
def test_formula_and_rounding(k, tokens, ratio, experts, rounding, expected):
    assert quiet_capacity(k, tokens, ratio, experts, rounding=rounding) == expected


def test_multiple_of_rounds_up():
    assert quiet_capacity(2, 784, 1.05, 32, multiple_of=4) == 52
    assert quiet_capacity(2, 784, 1.05, 32, multiple_of=3) == 51
    assert quiet_capacity(1, 8, 0.05, 4, multiple_of=8) == 8


def test_round_count_modes():
    assert [round_count(x) for x in (0.49, 0.5, 1.5, 2.5)] == [0, 1, 2, 3]  # half up, not to even
    assert round_count(2.0000001, "ceil") == 3 and round_count(2.9999999, "floor") == 2
    with pytest.raises(ValueError, match="rounding="):
        round_count(1.0, "nearest")


def test_warns_when_rounding_moves_the_ratio_by_more_than_one_percent():
    with pytest.warns(CapacityRoundingWarning, match="effective capacity_ratio of 1.2 instead of 1"):
        assert expert_capacity(1, 10, 1.0, 4) == 3  # 2.5 -> 3 slots: 3 * 4 / 10 = 1.2
    assert effective_capacity_ratio(3, 1, 10, 4) == pytest.approx(1.2)


def test_no_warning_when_exact_or_within_one_percent():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert expert_capacity(2, 64, 1.0, 8) == 16  # exact
        # 2 * 784 * 1.05 / 32 = 51.45 -> 51: effective 1.0408, 0.9 % below 1.05.
        assert expert_capacity(2, 784, 1.05, 32) == 51


def test_warns_for_minimum_capacity_and_multiple_of():
    with pytest.warns(CapacityRoundingWarning):
        expert_capacity(1, 8, 0.05, 4)  # wants 0.1 slot, gets 1: ratio 0.5
    with pytest.warns(CapacityRoundingWarning):
        expert_capacity(2, 64, 1.0, 8, multiple_of=5)  # 16 -> 20


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(k=0), "k="),
        (dict(k=-1), "k="),
        (dict(k=1.5), "k="),
        (dict(k=True), "k="),
        (dict(k=5), "k="),  # more than num_experts
        (dict(tokens_per_group=0), "tokens_per_group="),
        (dict(capacity_ratio=0.0), "capacity_ratio="),
        (dict(capacity_ratio=-1.0), "capacity_ratio="),
        (dict(capacity_ratio=float("inf")), "capacity_ratio="),
        (dict(capacity_ratio="1.0"), "capacity_ratio="),
        (dict(num_experts=0), "num_experts="),
        (dict(rounding="up"), "rounding="),
        (dict(multiple_of=0), "multiple_of="),
    ],
)
def test_invalid_values_raise_naming_the_field(kwargs, field):
    args = dict(k=1, tokens_per_group=16, capacity_ratio=1.0, num_experts=4) | kwargs
    rounding = args.pop("rounding", "round")
    multiple_of = args.pop("multiple_of", None)
    with pytest.raises(ValueError, match=field) as info:
        expert_capacity(**args, rounding=rounding, multiple_of=multiple_of)
    assert "allowed" in str(info.value)


def test_vmoe_round_reproduces_google_research_vmoe():
    """vmoe/moe.py compute_capacity(ceil_or_round="round"): int(round(k*N*C/E)) -- halves to even -- and a
    capacity below 1 raises; "round" here rounds halves up and returns at least 1 (module docstring)."""
    for k, tokens, ratio, experts in [(1, 5, 1.0, 2), (1, 3, 1.0, 2), (2, 5, 0.5, 2), (1, 10, 0.25, 1), (1, 7, 1.0, 2)]:
        exact = k * tokens * ratio / experts
        assert quiet_capacity(k, tokens, ratio, experts, rounding="vmoe_round") == round(exact)
    assert quiet_capacity(1, 5, 1.0, 2, rounding="vmoe_round") == 2  # 2.5 -> 2 (halves to even)
    assert quiet_capacity(1, 5, 1.0, 2) == 3  # 2.5 -> 3 (halves up)
    assert quiet_capacity(1, 4, 0.1, 4) == 1  # 0.1 -> at least 1
    with pytest.raises(ValueError, match=r"^capacity_ratio=0.1 gives an expert capacity of 0 .*rounding='vmoe_round'"):
        quiet_capacity(1, 4, 0.1, 4, rounding="vmoe_round")
    assert round_count(2.5, "vmoe_round") == 2 and round_count(3.5, "vmoe_round") == 4
