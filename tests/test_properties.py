"""Property-based tests (hypothesis, derandomized: the same examples on every run).

1. Every field of every model config family (``moe_course.configs.CONFIG_TYPES``, so a family added later is
   covered without touching this file) and of TrainConfig, set to an invalid value, raises a ValueError naming
   that field -- from ``validate`` and from ``train`` before any model is built or compiled.
2. The routing allocations on random shapes, capacities and tie-heavy router outputs equal the paper's
   literal loops (``test_routing_allocation``), and the capacity equals its formula.
"""

import dataclasses
import math
import re
import typing
import warnings
from unittest import mock

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_routing_allocation import literal_bpr, literal_skip_patch, literal_vanilla, per_group

from moe_course.configs import CONFIG_TYPES
from moe_course.routing import CapacityRoundingWarning, allocate, expert_capacity, kept_tokens, top_k_routing
from moe_course.train import TrainConfig, train

FUZZ = settings(derandomize=True, max_examples=12, deadline=None)

CONFIGS = {**CONFIG_TYPES, "train": TrainConfig}
FIELDS = [(family, field) for family, cls in CONFIGS.items() for field in (f.name for f in dataclasses.fields(cls))]


# Numeric fields that take any finite number: LIMoE's entropy thresholds (tau <= 0 switches the global loss off).
ANY_FINITE = {"image_tau", "text_tau"}
# Free-text fields where "" means "none" (a run trained without a named recipe).
EMPTY_ALLOWED = {"recipe"}


def _invalid(cls, field: str) -> st.SearchStrategy:
    """Values no field of that annotated type accepts (every numeric field of these configs is >= 0, except
    those in ANY_FINITE, which refuse only non-finite numbers and non-numbers)."""
    hint = typing.get_type_hints(cls)[field]
    optional = type(None) in typing.get_args(hint)
    base = next((t for t in typing.get_args(hint) if t is not type(None)), hint)
    none = st.nothing() if optional else st.none()
    junk = st.one_of(st.text(max_size=4), st.lists(st.integers(), max_size=2), none)
    if base is bool:
        return st.one_of(st.integers(), st.floats(), st.text(max_size=4), st.none())
    if base is int:
        return st.one_of(st.integers(max_value=-1), st.booleans(), st.floats(), junk)
    if base is float:
        negative = st.nothing() if field in ANY_FINITE else st.floats(max_value=-1e-6)
        return st.one_of(negative, st.sampled_from([math.nan, math.inf, -math.inf]), st.booleans(), junk)
    if typing.get_origin(base) is tuple:  # RandAugment's (N, M): N in [1, 15], M in (0, 20]
        return st.one_of(st.tuples(st.integers(max_value=0), st.floats(0.5, 10)),
                         st.tuples(st.integers(1, 15), st.floats(max_value=0)), st.tuples(st.integers(1, 15)),
                         st.text(max_size=4), st.integers())
    assert base is str, f"{cls.__name__}.{field}: no invalid-value strategy for {hint}"
    allowed = getattr(cls, "CHOICES", {}).get(field)
    if allowed is None:  # free text (a config's name)
        empty = st.nothing() if field in EMPTY_ALLOWED else st.just("")
        return st.one_of(empty, st.integers(), st.none())
    return st.one_of(st.text(max_size=8).filter(lambda v: v not in allowed), st.integers(), st.none())


@pytest.mark.parametrize("family, field", FIELDS, ids=[f"{fam}.{fld}" for fam, fld in FIELDS])
def test_every_config_field_refuses_invalid_values_naming_it(family, field):
    cls = CONFIGS[family]

    @FUZZ
    @given(value=_invalid(cls, field))
    def check(value):
        bad = dataclasses.replace(cls(), **{field: value})
        named = re.compile(rf"(^|\W){field}=")
        with pytest.raises(ValueError) as caught:
            bad.validate()
        assert named.search(str(caught.value)), str(caught.value)
        model, run = (CONFIG_TYPES["vit"](), bad) if family == "train" else (bad, TrainConfig())
        with mock.patch("moe_course.train.loop.build_model", side_effect=AssertionError("built a model")):
            with pytest.raises(ValueError) as caught:
                train(model, None, run, progress=False)  # no dataset needed: validation comes first
        assert named.search(str(caught.value)), str(caught.value)

    check()


LITERAL = {"vanilla": literal_vanilla, "bpr": literal_bpr}


@st.composite
def routings(draw):
    groups, tokens, experts = draw(st.integers(1, 2)), draw(st.integers(1, 8)), draw(st.integers(1, 4))
    k = draw(st.integers(1, experts))
    capacity = draw(st.integers(1, tokens * k))
    grid = draw(st.lists(st.integers(0, 3), min_size=groups * tokens * experts, max_size=groups * tokens * experts))
    logits = np.asarray(grid, np.float32).reshape(groups, tokens, experts) / 2  # coarse grid: many exact ties
    method = draw(st.sampled_from(["vanilla", "bpr", "skip_patch"]))
    keep = draw(st.sampled_from([0.25, 0.5, 0.75, 1.0])) if method == "skip_patch" else None
    return logits, k, capacity, experts, method, keep


@pytest.mark.slow
@settings(derandomize=True, max_examples=30, deadline=None)
@given(case=routings())
def test_allocations_equal_the_literal_loops_on_random_shapes_ties_and_capacities(case):
    logits, k, capacity, experts, method, keep = case
    out = top_k_routing(jnp.asarray(logits), k)
    allocation = allocate(out.expert_index, out.gates, capacity, experts, method=method, keep_fraction=keep)
    if method == "skip_patch":
        expected = per_group(literal_skip_patch, out.expert_index, out.gates, capacity, experts,
                             kept_tokens(logits.shape[1], keep))
    else:
        expected = per_group(LITERAL[method], out.expert_index, out.gates, capacity, experts)
    np.testing.assert_array_equal(allocation.slot, expected)
    fill = np.asarray(allocation.expert_fill)
    assert (fill <= capacity).all() and fill.sum() == np.asarray(allocation.served).sum()


@FUZZ
@given(k=st.integers(1, 8), tokens=st.integers(1, 4096), ratio=st.floats(0.01, 4.0), experts=st.integers(8, 64))
def test_capacity_equals_its_formula(k, tokens, ratio, experts):
    exact = k * tokens * ratio / experts
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CapacityRoundingWarning)
        assert expert_capacity(k, tokens, ratio, experts, rounding="ceil") == max(1, math.ceil(exact - 1e-9 * max(1, exact)))
        assert expert_capacity(k, tokens, ratio, experts) == max(1, math.floor(exact + 0.5 + 1e-9 * max(1, exact)))
        if round(exact) >= 1:
            assert expert_capacity(k, tokens, ratio, experts, rounding="vmoe_round") == round(exact)
        else:
            with pytest.raises(ValueError, match="capacity_ratio"):
                expert_capacity(k, tokens, ratio, experts, rounding="vmoe_round")
