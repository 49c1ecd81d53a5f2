"""Expert pruning for single-modality inference (LIMoE App. E.4): ranking, coverage and the two router modes."""

import jax.numpy as jnp
import numpy as np
import pytest

from moe_course.routing.pruning import coverage_after_pruning, pruned_top_k_routing, pruning_order


def test_order_and_coverage_by_hand():
    shares = [0.5, 0.0, 0.3, 0.2]
    np.testing.assert_array_equal(pruning_order(shares), [1, 3, 2, 0])
    np.testing.assert_allclose(coverage_after_pruning(shares), [1.0, 1.0, 0.8, 0.5, 0.0])


def test_router_drop_and_router_pred_pick_the_same_experts_with_different_gates():
    logits = jnp.log(jnp.asarray([[[0.5, 0.3, 0.15, 0.05]]]))
    keep = [False, True, True, True]
    drop = pruned_top_k_routing(logits, 1, keep, mode="router_drop")
    pred = pruned_top_k_routing(logits, 1, keep, mode="router_pred")
    assert int(drop.expert_index[0, 0, 0]) == int(pred.expert_index[0, 0, 0]) == 1
    np.testing.assert_allclose(pred.gates[0, 0, 0], 0.3, rtol=1e-5)  # the probability the model was trained with
    np.testing.assert_allclose(drop.gates[0, 0, 0], 0.3 / 0.5, rtol=1e-5)  # renormalised over kept experts
    np.testing.assert_allclose(drop.probs[0, 0], [0.0, 0.6, 0.3, 0.1], atol=1e-6)
    two = pruned_top_k_routing(logits, 2, keep, mode="router_pred")
    np.testing.assert_array_equal(two.expert_index[0, 0], [1, 2])


def test_pruning_errors_name_the_argument():
    logits = jnp.zeros((1, 2, 3))
    with pytest.raises(ValueError, match="mode='drop'"):
        pruned_top_k_routing(logits, 1, [True] * 3, mode="drop")
    with pytest.raises(ValueError, match="k=2"):
        pruned_top_k_routing(logits, 2, [True, False, False], mode="router_pred")
    with pytest.raises(ValueError, match="keep has shape"):
        pruned_top_k_routing(logits, 1, [True] * 4, mode="router_pred")
