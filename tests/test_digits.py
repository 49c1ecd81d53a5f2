from pathlib import Path

import numpy as np
import pytest

from moe_course.data import ClutteredDigits, DigitsConfig, eval_batches, train_batches
from moe_course.data.base import class_balance


@pytest.fixture(scope="module")
def digits():
    return ClutteredDigits()


def test_batch_format(digits):
    batch = digits.get("train", np.arange(5))
    assert batch["image"].shape == (5, 32, 32, 1) and batch["image"].dtype == np.float32
    assert batch["label"].dtype == np.int32
    assert 0.0 <= batch["image"].min() and batch["image"].max() <= 1.0


def test_splits_use_disjoint_glyphs_and_balanced_classes(digits):
    ids = {s: set(digits.glyph_ids(s).tolist()) for s in ("train", "val", "test")}
    assert not ids["train"] & ids["val"] and not ids["train"] & ids["test"] and not ids["val"] & ids["test"]
    for split in ("train", "val", "test"):
        labels = digits.get(split, np.arange(digits.split_size(split)))["label"]
        counts = class_balance(labels, 10)
        assert counts.min() == counts.max() > 0


def test_deterministic_and_fresh_each_epoch(digits):
    a = digits.get("train", np.arange(8), epoch=3)["image"]
    b = ClutteredDigits().get("train", np.arange(8), epoch=3)["image"]
    c = digits.get("train", np.arange(8), epoch=4)["image"]
    np.testing.assert_array_equal(a, b)
    assert np.abs(a - c).mean() > 0.05
    t1 = digits.get("test", np.arange(8), epoch=0)["image"]
    t2 = digits.get("test", np.arange(8), epoch=7)["image"]
    np.testing.assert_array_equal(t1, t2)


def test_cached_splits_equal_fresh_drawing_and_stay_within_budget():
    cached, fresh = ClutteredDigits(), ClutteredDigits()
    fresh.cache_bytes = 0  # nothing fits: every call draws its examples directly
    rows = np.array([1039, 0, 17, 17])
    for split, epoch in (("train", 0), ("train", 5), ("val", 2), ("test", 0)):
        a, b = cached.get(split, rows, epoch=epoch), fresh.get(split, rows, epoch=epoch)
        assert a.keys() == b.keys()
        for name in a:
            np.testing.assert_array_equal(a[name], b[name])
    assert not fresh._cache
    epoch_bytes = cached.split_size("train") * (32 * 32 + 5) * 4
    cached.cache_bytes = 2 * epoch_bytes
    for epoch in range(6):
        cached.get("train", rows, epoch=epoch)
    assert list(cached._cache) == [("train", 4), ("train", 5)]


def test_digit_box_holds_the_bright_glyph(digits):
    batch = digits.get("test", np.arange(20))
    for image, (top, left, h, w) in zip(batch["image"][..., 0], batch["box"]):
        inside = image[top : top + h, left : left + w].mean()
        assert inside > image.mean()


def test_most_patches_are_background(digits):
    batch = digits.get("test", np.arange(50))
    frac = batch["box"][:, 2] * batch["box"][:, 3] / 32**2
    assert frac.mean() < 0.45


def test_logistic_regression_on_raw_pixels_stays_below_ceiling(digits):
    from sklearn.linear_model import LogisticRegression

    x_train, y_train = digits.arrays("train")
    x_test, y_test = digits.arrays("test")
    clf = LogisticRegression(max_iter=200).fit(x_train.reshape(len(x_train), -1), y_train)
    accuracy = clf.score(x_test.reshape(len(x_test), -1), y_test)
    assert accuracy <= 0.6, accuracy
    assert accuracy > 0.1 - 0.05  # it is a real classification problem, not noise


def test_train_batches_resume_mid_epoch(small_digits):
    full = [b["image"] for _, b in zip(range(7), train_batches(small_digits, 16, seed=1))]
    resumed = [b["image"] for _, b in zip(range(3), train_batches(small_digits, 16, seed=1, start_step=4))]
    for a, b in zip(full[4:], resumed):
        np.testing.assert_array_equal(a, b)


def test_eval_batches_cover_split_once(small_digits):
    labels = np.concatenate([b["label"] for b in eval_batches(small_digits, "test", 7)])
    assert len(labels) == small_digits.split_size("test")


@pytest.mark.parametrize(
    "overrides, field",
    [({"image_size": 8}, "image_size"), ({"digit_size": (10, 40)}, "digit_size"), ({"noise": -1.0}, "noise"),
     ({"glyphs_per_class": (100, 50, 50)}, "glyphs_per_class"), ({"eval_copies": 0}, "eval_copies"),
     ({"task": "writer"}, "task")],
)
def test_bad_config_names_field(overrides, field):
    with pytest.raises(ValueError, match=field):
        ClutteredDigits(DigitsConfig(**overrides))


def test_bad_split_and_indices(small_digits):
    with pytest.raises(ValueError, match="split='valid'"):
        small_digits.get("valid", np.arange(2))
    with pytest.raises(ValueError, match="indices"):
        small_digits.get("test", np.array([small_digits.split_size("test")]))


def test_eval_batches_in_a_fixed_shuffled_order(small_digits):
    n = small_digits.split_size("test")
    first = np.concatenate([b["label"] for b in eval_batches(small_digits, "test", 7, order_seed=0)])
    again = np.concatenate([b["label"] for b in eval_batches(small_digits, "test", 7, order_seed=0)])
    in_order = np.concatenate([b["label"] for b in eval_batches(small_digits, "test", 7)])
    np.testing.assert_array_equal(first, again)
    assert len(first) == n and not np.array_equal(first, in_order)
    np.testing.assert_array_equal(np.sort(first), np.sort(in_order))


def test_glyph_task_one_class_per_source_glyph_every_split_draws_the_same_glyphs_afresh():
    glyphs = ClutteredDigits(DigitsConfig(task="glyph", glyphs_per_class=(3, 1, 1), eval_copies=2))
    digits = ClutteredDigits(DigitsConfig(glyphs_per_class=(3, 1, 1)))
    assert glyphs.num_classes == 30 and glyphs.name == "digit-glyphs" and digits.num_classes == 10
    assert glyphs.class_names[:4] == ("zero #0", "zero #1", "zero #2", "one #0")
    for split in ("train", "val", "test"):  # the training glyphs of the digit task, in every split
        np.testing.assert_array_equal(glyphs.glyph_ids(split), digits.glyph_ids("train"))
    assert glyphs.split_size("train") == 30 and glyphs.split_size("test") == 60
    train, test = (glyphs.get(s, np.arange(glyphs.split_size(s))) for s in ("train", "test"))
    np.testing.assert_array_equal(train["label"], np.arange(30))
    np.testing.assert_array_equal(test["label"], np.tile(np.arange(30), 2))  # eval_copies canvases per glyph
    # the same glyph, a different canvas: test draws are not training draws
    assert np.abs(train["image"] - test["image"][:30]).mean() > 0.05
    # a canvas's class is its glyph: the digit task's label of that canvas is the glyph's digit
    np.testing.assert_array_equal(digits.get("train", np.arange(30))["label"], train["label"] // 3)


def test_canvases_are_the_ones_every_recorded_result_was_trained_on(digits):
    """Seed 0's canvases as recorded (tests/fixtures/digits_seed0_canvases.npz: 8 training canvases of epoch 3 and 4
    test canvases, uint8): the chapters' recorded runs and docs/results.md depend on them, so a faster drawing must
    draw the same ones. Placements, sizes and labels exactly; pixels to within one grey level on 99.9% of them,
    leaving room for the last bit of a float on another CPU (its sin/cos can move a stroke point to the
    neighbouring pixel, which changes two pixels by a stroke's brightness)."""
    recorded = np.load(Path(__file__).parent / "fixtures" / "digits_seed0_canvases.npz")
    for split, indices, epoch in [("train", np.arange(8), 3), ("test", np.array([0, 100, 200, 300]), 0)]:
        batch = digits.get_uint8(split, indices, epoch=epoch)
        np.testing.assert_array_equal(batch["label"], recorded[f"{split}_label"])
        np.testing.assert_array_equal(batch["box"], recorded[f"{split}_box"])
        close = np.abs(batch["image"].astype(int) - recorded[f"{split}_image"]) <= 1
        assert close.mean() >= 0.999, (split, close.mean())
