"""Per-image views of routing records."""

import numpy as np

from moe_course.layers.moe import RoutingRecord
from moe_course.analysis.routing import expert_class_weights, token_served


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


def test_collect_routing_matches_the_eager_model_across_padded_batches():
    import pytest
    from flax import nnx

    from moe_course.configs import get_preset
    from moe_course.models import build_model, with_routing
    from moe_course.analysis.routing import collect_routing

    config = get_preset("vmoe", "digits-tiny-moe").replace(width=16, mlp_dim=16, heads=2, group_size=2)
    model = with_routing(build_model(config, rngs=nnx.Rngs(0)), allocation="bpr", capacity_ratio=0.25)
    images = np.random.default_rng(0).uniform(size=(10, 32, 32, 1)).astype(np.float32)
    logits, records = collect_routing(model, images, batch_size=4)  # batches of 4, 4, 2 (+ one blank group)
    eager = model(images, deterministic=True)
    np.testing.assert_allclose(logits, eager.logits, atol=1e-5)
    assert len(records) == len(eager.routing) == 2
    for got, want in zip(records, eager.routing):
        assert got.capacity == want.capacity and got.served.shape == (5, 32, 2)
        for field in ("expert_index", "served", "priority_rank", "expert_fill"):
            np.testing.assert_array_equal(getattr(got, field), getattr(want, field))
        np.testing.assert_allclose(got.gates, want.gates, atol=1e-6)
    with pytest.raises(ValueError, match="number of images=9 .* group_size=2"):
        collect_routing(model, images[:9])
    with pytest.raises(ValueError, match="batch_size=3"):
        collect_routing(model, images, batch_size=3)
