"""LIMoE evaluation and routing statistics (zero-shot, retrieval recall, per-modality success) and training
through the one loop."""

import math

import numpy as np
import pytest
from flax import nnx

from moe_course.analysis.modality import (
    busiest_shares,
    experts_used,
    measure_routing,
    measure_success_rates,
    priority_by_modality,
    success_rate,
    success_rates,
)
from moe_course.analysis.zero_shot import evaluate_contrastive, recall_at_k, zero_shot_predictions, zero_shot_weights
from moe_course.configs import LIMoEConfig
from moe_course.data import CaptionedDigits
from moe_course.layers.moe import RoutingRecord
from moe_course.models import LIMoE
from moe_course.train import TrainConfig, train


def test_recall_at_k_by_hand():
    images = np.eye(3)
    sim = np.array([[0.9, 0.1, 0.0], [0.2, 0.5, 0.8], [0.3, 0.7, 0.6]])  # own pair on the diagonal
    texts = sim.T  # images @ texts.T == sim
    # image->text: ranks of the own caption 1, 2, 2; text->image (columns): 1, 2, 2.
    assert recall_at_k(images, texts, 1) == {"image_to_text": 1 / 3, "text_to_image": 1 / 3}
    assert recall_at_k(images, texts, 2) == {"image_to_text": 1.0, "text_to_image": 1.0}
    tied = np.ones((2, 2))
    assert recall_at_k(tied, tied, 1) == {"image_to_text": 0.0, "text_to_image": 0.0}  # ties count against
    with pytest.raises(ValueError, match="k=4"):
        recall_at_k(images, texts, 4)


def test_zero_shot_averages_normalised_prompts_then_renormalises():
    prompts = np.array([[[1.0, 0.0], [0.0, 1.0]], [[-1.0, 0.0], [-1.0, 0.0]]])
    weights = zero_shot_weights(prompts)
    np.testing.assert_allclose(weights, [[1 / math.sqrt(2), 1 / math.sqrt(2)], [-1.0, 0.0]], rtol=1e-6)
    np.testing.assert_array_equal(zero_shot_predictions(np.array([[0.0, 1.0], [-1.0, 0.2]]), weights), [0, 1])


def _record(served, expert_index):
    served = np.asarray(served, bool)[..., None]
    return RoutingRecord(np.asarray(expert_index, np.int32)[..., None], np.ones(served.shape, np.float32), served,
                         None, np.zeros((served.shape[0], 4), np.int32), 2)


def test_success_rate_and_experts_used_by_hand():
    # One group of two examples with 3 tokens each: (image, image, text) and (image, text, padding).
    modality = np.array([[0, 0, 1], [0, 1, -1]])
    record = _record([[True, False, True, True, False, True]], [[0, 1, 2, 0, 2, 3]])
    assert float(success_rate(record, modality, 0)) == pytest.approx(2 / 3)
    assert float(success_rate(record, modality, 1)) == pytest.approx(1 / 2)  # padding's "served" never counts
    rates = success_rates([record], modality)
    assert set(rates) == {"success/image/layer0", "success/text/layer0"}
    # Image TOP-1 choices: experts 0, 1, 0 -> expert 0 holds 2/3 < 0.9, experts 0 and 1 hold all.
    assert experts_used(record, modality, 0) == 2
    assert experts_used(record, modality, 1) == 1  # both text tokens chose expert 2
    busiest = busiest_shares([record], modality)
    assert float(busiest["busiest/image/layer0"]) == pytest.approx(2 / 3)  # expert 0 took 2 of the 3 image tokens
    assert float(busiest["busiest/text/layer0"]) == 1.0  # one expert took all text: Fig. 3's collapse
    assert math.isnan(float(success_rate(record, np.full((2, 3), -1), 1)))


def test_priority_by_modality_by_hand():
    modality = np.array([[0, 0, 1], [0, 1, -1]])
    record = _record([[True] * 6], [[0] * 6])._replace(priority_rank=np.array([[0, 2, 1, 5, 3, 4]]))
    # Ranks normalised by N - 1 = 5: images 0, 2, 5 -> mean 7/15; texts 1, 3 -> mean 4/10 (padding's 4 ignored).
    ranks = priority_by_modality(record, modality)
    assert float(ranks["image"]) == pytest.approx(7 / 15) and float(ranks["text"]) == pytest.approx(0.4)
    with pytest.raises(ValueError, match="priority_rank is None"):
        priority_by_modality(record._replace(priority_rank=None), modality)


@pytest.fixture(scope="module")
def captioned(small_digits):
    return CaptionedDigits(small_digits, vocab_size=64, seq_len=8)


@pytest.fixture(scope="module")
def tiny():
    return LIMoEConfig(name="test-limoe", image_size=16, patch_size=8, channels=1, width=16, depth=2, heads=2,
                       mlp_dim=32, num_classes=10, num_experts=4, group_size=4, capacity_ratio=1.0, vocab_size=64,
                       seq_len=8, embed_dim=8, text_tau=math.log(2), image_tau=math.log(3))


def test_training_through_the_one_loop_learns_and_logs_per_modality_success(tiny, captioned):
    config = TrainConfig(steps=6, batch_size=16, learning_rate=3e-3, warmup_steps=1, log_every=3, eval_every=6,
                         checkpoint_every=0, eval_batch_size=16)
    result = train(tiny, captioned, config, progress=False)
    first, last = result.history
    assert last["task_loss"] < first["task_loss"]
    for key in ("accuracy", "temperature", "aux/text/local_entropy", "success/text/layer0", "success/image/layer0",
                "val_accuracy", "val_i2t_recall@1"):
        assert key in last, key
    assert 0.0 <= last["success/text/layer0"] <= 1.0
    assert 1 / tiny.num_experts <= last["busiest/text/layer0"] <= 1.0


def test_evaluation_of_a_one_tower_model(tiny, captioned):
    model = LIMoE(tiny, rngs=nnx.Rngs(0))
    metrics = evaluate_contrastive(model, captioned, "test", batch_size=16)
    assert metrics["examples"] == captioned.split_size("test") == 30
    for key in ("zero_shot_accuracy", "i2t_recall@1", "t2i_recall@1", "i2t_recall@5", "t2i_recall@5"):
        assert 0.0 <= metrics[key] <= 1.0
    assert metrics["i2t_recall@5"] >= metrics["i2t_recall@1"]
    rates = measure_success_rates(model, captioned, "test", batch_size=16)
    assert set(rates) == {"success/image/layer0", "success/text/layer0"}
    routing = measure_routing(model, captioned, "test", batch_size=16)
    assert {k: routing[k] for k in rates} == rates
    for name in ("image", "text"):  # every real token has one top-1 expert; the padded pairs count nowhere
        shares = routing[f"shares/{name}/layer0"]
        assert shares.shape == (tiny.num_experts,) and shares.sum() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="no MoE layer"):
        measure_success_rates(LIMoE(tiny.replace(placement="none"), rngs=nnx.Rngs(0)), captioned)


def test_loop_refuses_data_that_does_not_fit(tiny, captioned, small_digits):
    with pytest.raises(ValueError, match="seq_len=16 of the model does not match the 8-token captions"):
        train(tiny.replace(seq_len=16), captioned, TrainConfig(steps=1, batch_size=16, warmup_steps=0), progress=False)
    with pytest.raises(ValueError, match="has no captions"):
        train(tiny, small_digits, TrainConfig(steps=1, batch_size=16, warmup_steps=0), progress=False)
    with pytest.raises(ValueError, match="vocab_size=10 of the model is smaller"):
        train(tiny.replace(vocab_size=10), captioned, TrainConfig(steps=1, batch_size=16, warmup_steps=0), progress=False)
