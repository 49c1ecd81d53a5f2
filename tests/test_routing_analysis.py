"""Per-image views of routing records."""

import numpy as np

from moe_course.layers.moe import RoutingRecord
from moe_course.routing_analysis import expert_class_weights, token_served


def _record():
    # 2 groups of 2 images with 3 tokens each: (groups=2, group tokens=6, k=2); 3 experts.
    expert_index = np.array([[[0, 1], [1, 2], [2, 0], [0, 2], [1, 0], [2, 1]]] * 2)
    gates = np.full((2, 6, 2), 0.5) * np.array([1.0, 0.5])
    served = np.zeros((2, 6, 2), bool)
    served[0, 0] = [True, False]  # image 0, token 0: first choice only
    served[0, 4, 1] = True  # image 1, token 1: second choice only
    served[1, 5] = True  # image 3, token 2: both
    fill = np.zeros((2, 3), int)
    return RoutingRecord(expert_index, gates, served, None, fill, 4)


def test_token_served_maps_groups_back_to_images():
    rec = _record()
    any_choice = token_served(rec, 4)
    expected = np.zeros((4, 3), bool)
    expected[0, 0] = expected[1, 1] = expected[3, 2] = True
    np.testing.assert_array_equal(any_choice, expected)
    first = token_served(rec, 4, choice=0)
    assert first[0, 0] and not first[1, 1] and first[3, 2]


def test_expert_class_weights_averages_gates_per_class():
    rec = _record()
    table = expert_class_weights(rec, np.array([0, 1, 0, 1]), num_classes=3)
    # image 0 tokens route (0,1), (1,2), (2,0) with gates (0.5, 0.25): expert 0 gets 0.5 + 0.25 over 3 tokens.
    np.testing.assert_allclose(table[0], [0.75 / 3, 0.75 / 3, 0.75 / 3])
    np.testing.assert_allclose(table[2], 0.0)
    np.testing.assert_allclose(table.sum(1)[:2], [0.75, 0.75])
