"""Capacity allocation equals V-MoE App. C Algorithms 1-3, written here as the paper's literal loops."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from moe_course.routing import (
    CapacityRoundingWarning,
    allocate,
    batch_prioritized_allocation,
    expert_capacity,
    experts_choice_allocation,
    experts_choice_as_allocation,
    kept_tokens,
    priority_scores,
    skip_patch_allocation,
    top_k_routing,
    vanilla_allocation,
)

GROUPS, TOKENS, EXPERTS = 3, 12, 4
RATIOS = [0.05, 0.1, 0.5, 1.0, 1.05, 2.0]


# ---- the paper's algorithms, literally (one group at a time) ----------------------------------------------


def literal_fill(expert_index, order, capacity, num_experts):
    """Algorithms 1-3's shared body: for i = 1..k, for each token p in ``order``: if expert e is not full, put p
    into its buffer, else skip the i-th assignment. Returns slot (tokens, k), -1 where skipped, and the buffers."""
    tokens, k = expert_index.shape
    buffers = [[] for _ in range(num_experts)]
    slot = -np.ones((tokens, k), np.int64)
    for i in range(k):
        for p in order:
            e = int(expert_index[p, i])
            if len(buffers[e]) < capacity:
                slot[p, i] = len(buffers[e])
                buffers[e].append(p)
    return slot, buffers


def literal_score(gates_row, score):
    if score == "max":
        return max(float(g) for g in gates_row)
    total = np.float32(0)
    for g in gates_row:
        total = np.float32(total + np.float32(g))
    return float(total)


def literal_sorted_patches(gates, score):
    """SortPatches(scores, decreasing=True); Python's sort is stable, so equal scores keep token order."""
    scores = [literal_score(gates[p], score) for p in range(gates.shape[0])]
    return sorted(range(gates.shape[0]), key=lambda p: -scores[p])


def literal_vanilla(expert_index, gates, capacity, num_experts):  # Algorithm 1
    return literal_fill(expert_index, range(expert_index.shape[0]), capacity, num_experts)[0]


def literal_bpr(expert_index, gates, capacity, num_experts, score="max"):  # Algorithm 2
    return literal_fill(expert_index, literal_sorted_patches(gates, score), capacity, num_experts)[0]


def literal_skip_patch(expert_index, gates, capacity, num_experts, keep, score="max"):  # Algorithm 3
    kept = literal_sorted_patches(gates, score)[:keep]
    return literal_fill(expert_index, kept, capacity, num_experts)[0]


# ---- random router outputs with many ties ---------------------------------------------------------------


def routed(seed, k, tokens=TOKENS, experts=EXPERTS):
    """Router outputs from logits on a coarse grid (many exactly equal gates and equal priority scores)."""
    logits = jax.random.randint(jax.random.key(seed), (GROUPS, tokens, experts), 0, 4).astype(jnp.float32) / 2
    out = top_k_routing(logits, k)
    return out.expert_index, out.gates


def arbitrary_choices(seed, k, tokens=TOKENS, experts=EXPERTS):
    """Distinct experts per token in random order, gates on a grid of multiples of 1/8 (exact sums, ties)."""
    rng = np.random.default_rng(seed)
    index = np.stack([np.stack([rng.permutation(experts)[:k] for _ in range(tokens)]) for _ in range(GROUPS)])
    gates = rng.integers(0, 9, size=(GROUPS, tokens, k)) / 8.0
    return jnp.asarray(index, jnp.int32), jnp.asarray(gates, jnp.float32)


def capacity_for(k, ratio, tokens=TOKENS):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CapacityRoundingWarning)
        return expert_capacity(k, tokens, ratio, EXPERTS)


def per_group(literal, expert_index, gates, *args, **kwargs):
    index, g = np.asarray(expert_index), np.asarray(gates)
    return np.stack([literal(index[i], g[i], *args, **kwargs) for i in range(index.shape[0])])


# ---- equality with the literal loops ------------------------------------------------------------------


@pytest.mark.parametrize("ratio", RATIOS)
@pytest.mark.parametrize("k", [1, 2, 3])
def test_vanilla_equals_algorithm_1(k, ratio):
    capacity = capacity_for(k, ratio)
    for make, seed in ((routed, 10 * k), (arbitrary_choices, 10 * k + 1)):
        index, gates = make(seed, k)
        allocation = vanilla_allocation(index, gates, capacity, EXPERTS)
        np.testing.assert_array_equal(allocation.slot, per_group(literal_vanilla, index, gates, capacity, EXPERTS))
        np.testing.assert_array_equal(allocation.priority_rank, np.broadcast_to(np.arange(TOKENS), (GROUPS, TOKENS)))


@pytest.mark.parametrize("ratio", RATIOS)
@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("score", ["max", "sum"])
def test_bpr_equals_algorithm_2(k, ratio, score):
    capacity = capacity_for(k, ratio)
    for make, seed in ((routed, 20 * k), (arbitrary_choices, 20 * k + 1)):
        index, gates = make(seed, k)
        allocation = batch_prioritized_allocation(index, gates, capacity, EXPERTS, score=score)
        expected = per_group(literal_bpr, index, gates, capacity, EXPERTS, score=score)
        np.testing.assert_array_equal(allocation.slot, expected)
        for g in range(GROUPS):  # priority_rank: place of each token in the sorted order
            order = literal_sorted_patches(np.asarray(gates)[g], score)
            np.testing.assert_array_equal(np.asarray(allocation.priority_rank)[g][order], np.arange(TOKENS))


@pytest.mark.parametrize("keep_fraction", [0.25, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("ratio", [0.1, 0.5, 1.05, 2.0])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_skip_patch_equals_algorithm_3(k, ratio, keep_fraction):
    capacity = capacity_for(k, ratio)
    keep = kept_tokens(TOKENS, keep_fraction)
    index, gates = arbitrary_choices(30 * k, k)
    allocation = skip_patch_allocation(index, gates, capacity, EXPERTS, keep_fraction=keep_fraction)
    expected = per_group(literal_skip_patch, index, gates, capacity, EXPERTS, keep)
    np.testing.assert_array_equal(allocation.slot, expected)
    # Tokens ranked at or after M have every choice dropped.
    skipped = np.asarray(allocation.priority_rank) >= keep
    assert not np.asarray(allocation.served)[skipped].any()


def test_kept_tokens():
    assert [kept_tokens(12, s) for s in (0.25, 0.5, 0.9, 1.0, 0.01)] == [3, 6, 11, 12, 1]
    assert kept_tokens(3, 0.5) == 2  # 1.5 rounds up
    for bad in (0, -0.5, 1.5, "0.5", True):
        with pytest.raises(ValueError, match="keep_fraction="):
            kept_tokens(12, bad)


def test_larger_group_with_many_experts_matches_the_loops():
    index, gates = arbitrary_choices(99, 2, tokens=40, experts=8)
    capacity = expert_capacity(2, 40, 0.5, 8)  # 2 * 40 * 0.5 / 8 = 5 slots per expert
    assert capacity == 5
    got = batch_prioritized_allocation(index, gates, capacity, 8, score="sum").slot
    np.testing.assert_array_equal(got, per_group(literal_bpr, index, gates, capacity, 8, score="sum"))
    got = vanilla_allocation(index, gates, capacity, 8).slot
    np.testing.assert_array_equal(got, per_group(literal_vanilla, index, gates, capacity, 8))


# ---- the properties the paper states, on hand-made examples --------------------------------------------


def test_every_top1_choice_is_served_before_any_top2_choice():
    # Two tokens, two experts, one slot each. Token 0 picks (0, 1), token 1 picks (1, 0).
    index = jnp.array([[[0, 1], [1, 0]]], jnp.int32)
    gates = jnp.array([[[0.6, 0.4], [0.7, 0.3]]], jnp.float32)
    for allocation in (vanilla_allocation(index, gates, 1, 2), batch_prioritized_allocation(index, gates, 1, 2)):
        # Both TOP-1 choices win; token 0's TOP-2 (expert 1) would have come first in token-major order.
        np.testing.assert_array_equal(allocation.slot, [[[0, -1], [0, -1]]])


def test_bpr_lets_the_confident_token_win_across_images():
    # The paper's two-patch example (App. C.1): p1 weights (0.7, 0.2), p2 (0.5, 0.4); p2 comes first in
    # the group. Both choose experts (0, 1); each expert has one slot.
    index = jnp.array([[[0, 1], [0, 1]]], jnp.int32)
    gates = jnp.array([[[0.5, 0.4], [0.7, 0.2]]], jnp.float32)
    np.testing.assert_array_equal(vanilla_allocation(index, gates, 1, 2).slot, [[[0, 0], [-1, -1]]])
    bpr = batch_prioritized_allocation(index, gates, 1, 2)
    np.testing.assert_array_equal(bpr.slot, [[[-1, -1], [0, 0]]])
    np.testing.assert_array_equal(bpr.priority_rank, [[1, 0]])
    # Sum of TOP-k weights: 0.9 each -> a tie, broken by token order.
    np.testing.assert_array_equal(batch_prioritized_allocation(index, gates, 1, 2, score="sum").slot, [[[0, 0], [-1, -1]]])
    # Skip-patch with S = 0.5 processes only p1.
    np.testing.assert_array_equal(skip_patch_allocation(index, gates, 2, 2, keep_fraction=0.5).slot, [[[-1, -1], [0, 0]]])


def test_priority_scores():
    gates = jnp.array([[[0.5, 0.25], [0.125, 0.75]]])
    np.testing.assert_array_equal(priority_scores(gates), [[0.5, 0.75]])
    np.testing.assert_array_equal(priority_scores(gates, score="sum"), [[0.75, 0.875]])
    with pytest.raises(ValueError, match="score="):
        priority_scores(gates, score="mean")


def test_full_experts_fill_and_combine_weights():
    index, gates = arbitrary_choices(5, 2)
    allocation = batch_prioritized_allocation(index, gates, 2, EXPERTS)
    fill = np.asarray(allocation.expert_fill)
    assert fill.shape == (GROUPS, EXPERTS) and fill.max() <= 2
    # 12 tokens x 2 choices over 4 experts with 2 slots: every buffer is full.
    np.testing.assert_array_equal(fill, 2)
    served = np.asarray(allocation.served)
    np.testing.assert_array_equal(allocation.combine_weights, np.where(served, gates, 0))
    # Within one expert of one group the slots are 0..fill-1, each used once.
    slot, idx = np.asarray(allocation.slot), np.asarray(index)
    for g in range(GROUPS):
        for e in range(EXPERTS):
            used = sorted(slot[g][(idx[g] == e) & served[g]])
            assert used == list(range(fill[g, e]))


def test_allocate_dispatches_by_name_and_is_jittable():
    index, gates = arbitrary_choices(7, 2)
    for method, direct in (
        ("vanilla", vanilla_allocation(index, gates, 3, EXPERTS)),
        ("bpr", batch_prioritized_allocation(index, gates, 3, EXPERTS)),
    ):
        np.testing.assert_array_equal(allocate(index, gates, 3, EXPERTS, method=method).slot, direct.slot)
    skip = allocate(index, gates, 3, EXPERTS, method="skip_patch", keep_fraction=0.5)
    np.testing.assert_array_equal(skip.slot, skip_patch_allocation(index, gates, 3, EXPERTS, keep_fraction=0.5).slot)
    jitted = jax.jit(allocate, static_argnames=("capacity", "num_experts", "method", "score", "keep_fraction"))
    out = jitted(index, gates, capacity=3, num_experts=EXPERTS, method="bpr")
    np.testing.assert_array_equal(out.slot, batch_prioritized_allocation(index, gates, 3, EXPERTS).slot)
    assert out.capacity == 3 and out.num_experts == EXPERTS


# ---- experts choice ------------------------------------------------------------------------------------


def literal_experts_choice(probs, capacity):
    """Each expert, independently: sort the tokens by its probability (stable, highest first), take ``capacity``."""
    tokens, experts = probs.shape
    chosen = np.zeros((experts, capacity), np.int64)
    for e in range(experts):
        chosen[e] = sorted(range(tokens), key=lambda t: -probs[t, e])[:capacity]
    return chosen


@pytest.mark.parametrize("capacity", [1, 3, 12])
def test_experts_choice_equals_literal_selection(capacity):
    logits = jax.random.randint(jax.random.key(capacity), (GROUPS, TOKENS, EXPERTS), 0, 3).astype(jnp.float32)
    probs = jax.nn.softmax(logits)  # coarse logits: many tied probabilities
    choice = experts_choice_allocation(probs, capacity)
    assert choice.token_index.shape == (GROUPS, EXPERTS, capacity) and choice.token_index.dtype == jnp.int32
    probs, token_index = np.asarray(probs), np.asarray(choice.token_index)
    for g in range(GROUPS):
        expected = literal_experts_choice(probs[g], capacity)
        np.testing.assert_array_equal(token_index[g], expected)
        np.testing.assert_array_equal(choice.weights[g], probs[g].T[np.arange(EXPERTS)[:, None], expected])
    # Viewed as an allocation with k = E: slot b of expert e holds token_index[e, b].
    allocation = experts_choice_as_allocation(choice, TOKENS)
    slot, gates = np.asarray(allocation.slot), np.asarray(allocation.gates)
    for g in range(GROUPS):
        for e in range(EXPERTS):
            for t in range(TOKENS):
                hits = np.flatnonzero(token_index[g, e] == t)
                assert slot[g, t, e] == (hits[0] if hits.size else -1)
                assert gates[g, t, e] == (probs[g, t, e] if hits.size else 0.0)
    np.testing.assert_array_equal(allocation.expert_fill, capacity)


@pytest.mark.parametrize("capacity", [1, 3, 12])
def test_token_normalized_experts_choice_equals_a_literal_loop(capacity):
    """combine_weights="token_normalized": a loop over tokens, then over the experts that took the token, divides
    each of its router probabilities by their sum (sparse upcycling, Sec. 2.2); untaken tokens have no weight."""
    probs = jax.nn.softmax(jax.random.normal(jax.random.key(capacity), (GROUPS, TOKENS, EXPERTS)))
    raw = experts_choice_allocation(probs, capacity)
    choice = experts_choice_allocation(probs, capacity, combine_weights="token_normalized")
    np.testing.assert_array_equal(choice.token_index, raw.token_index)
    probs, token_index, weights = np.asarray(probs), np.asarray(choice.token_index), np.asarray(choice.weights)
    for g in range(GROUPS):
        for t in range(TOKENS):
            takers = [(e, b) for e in range(EXPERTS) for b in range(capacity) if token_index[g, e, b] == t]
            total = sum(float(probs[g, t, e]) for e, _ in takers)
            for e, b in takers:
                assert abs(weights[g, e, b] - probs[g, t, e] / total) < 1e-6
            if takers:
                assert abs(sum(float(weights[g, e, b]) for e, b in takers) - 1) < 1e-6
    if capacity == 1:
        assert not np.allclose(weights, raw.weights)  # the option changes something the test can see
    with pytest.raises(ValueError, match="combine_weights='sum'.*probabilities.*token_normalized"):
        experts_choice_allocation(jnp.asarray(probs), capacity, combine_weights="sum")


# ---- invalid inputs ------------------------------------------------------------------------------------


def test_invalid_allocation_inputs_name_the_field():
    index, gates = arbitrary_choices(0, 2)
    with pytest.raises(ValueError, match="capacity="):
        vanilla_allocation(index, gates, 0, EXPERTS)
    with pytest.raises(ValueError, match="num_experts="):
        vanilla_allocation(index, gates, 2, 0)
    with pytest.raises(ValueError, match=r"k \(expert_index.shape\[-1\]\)=2"):
        vanilla_allocation(index, gates, 2, 1)
    with pytest.raises(ValueError, match="expert_index"):
        vanilla_allocation(index[0], gates[0], 2, EXPERTS)
    with pytest.raises(ValueError, match="expert_index"):
        vanilla_allocation(index.astype(jnp.float32), gates, 2, EXPERTS)
    with pytest.raises(ValueError, match="gates"):
        batch_prioritized_allocation(index, gates[..., :1], 2, EXPERTS)
    with pytest.raises(ValueError, match="method="):
        allocate(index, gates, 2, EXPERTS, method="priority")
    with pytest.raises(ValueError, match="keep_fraction="):
        allocate(index, gates, 2, EXPERTS, method="skip_patch")
    with pytest.raises(ValueError, match="keep_fraction="):
        allocate(index, gates, 2, EXPERTS, method="bpr", keep_fraction=0.5)
    with pytest.raises(ValueError, match="score="):
        allocate(index, gates, 2, EXPERTS, score="min")
    with pytest.raises(ValueError, match="capacity="):
        experts_choice_allocation(jnp.ones((1, 4, 2)), 5)
    with pytest.raises(ValueError, match="probs"):
        experts_choice_allocation(jnp.ones((4, 2)), 1)
