"""The Grain input pipeline: batches in step order whatever the workers, uint8 to the device, exact resume with
worker processes, the image folders' training augmentation, errors from workers, and what a run reports."""

import time
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from PIL import Image

from moe_course.data import DataError, ImageFolder, train_batches
from moe_course.data.augment import example_rng, flip_left_right, inception_crop_box
from moe_course.data.base import batch_indices, to_uint8
from moe_course.data.folders import read_image
from moe_course.data.pipeline import check_workers, close_pipeline, steps_per_element, train_pipeline
from moe_course.train import TrainConfig, train
from moe_course.train.loop import InputBoundWarning, _postfix
from moe_course.train.throughput import training_flops_per_image
from moe_course.train.steps import as_float_images

FAST = TrainConfig(steps=6, batch_size=16, learning_rate=3e-3, warmup_steps=2, log_every=2, eval_every=0,
                   checkpoint_every=3, eval_batch_size=16)


def _params(model):
    return jax.tree.leaves(nnx.state(model, nnx.Param))


def test_batches_follow_the_steps_whatever_the_number_of_workers(small_digits):
    expected = [b for _, b in zip(range(9), train_batches(small_digits, 16, seed=5))]
    for workers, start in ((0, 0), (2, 4)):
        pipeline = train_pipeline(small_digits, 16, seed=5, start_step=start, stop_step=9, workers=workers)
        got = list(pipeline)
        assert len(got) == 9 - start
        for want, batch in zip(expected[start:], got):
            assert batch["image"].dtype == np.uint8
            np.testing.assert_array_equal(batch["image"], to_uint8(want["image"]))
            np.testing.assert_array_equal(batch["label"], want["label"])
        del got, batch
        close_pipeline(pipeline)


@pytest.mark.slow
def test_kill_and_resume_with_two_workers_equals_the_uninterrupted_run(small_digits, tiny_vit_config, tmp_path):
    straight = train(tiny_vit_config, small_digits, FAST, progress=False, data_workers=0)
    first = train(tiny_vit_config, small_digits, FAST, workdir=tmp_path, progress=False, stop_after=4, data_workers=2)
    assert first.resumed_from is None
    resumed = train(tiny_vit_config, small_digits, FAST, workdir=tmp_path, progress=False, data_workers=2)
    assert resumed.resumed_from == 3
    for a, b in zip(_params(straight.model), _params(resumed.model)):
        np.testing.assert_array_equal(a, b)
    assert resumed.history[-1]["loss"] == straight.history[-1]["loss"]  # steps 5-6, after the resume in both


@pytest.mark.parametrize("workers", [-1, 1.5, True, "2"])
def test_bad_worker_counts_are_refused_before_training(workers, small_digits, tiny_vit_config):
    with pytest.raises(ValueError, match=rf"^data_workers={workers!r} is not allowed; use an integer >= 0"):
        check_workers(workers)
    started = time.perf_counter()
    with pytest.raises(ValueError, match="data_workers="):
        train(tiny_vit_config, small_digits, FAST, progress=False, data_workers=workers)
    assert time.perf_counter() - started < 5  # before any compilation


def test_the_step_scales_uint8_pixels_on_the_device():
    pixels = np.arange(256, dtype=np.uint8).reshape(1, 16, 16, 1)
    scaled = jax.jit(as_float_images)({"image": pixels, "label": np.zeros(1, np.int32)})
    assert scaled["image"].dtype == jnp.float32
    np.testing.assert_allclose(scaled["image"], pixels / 255.0, rtol=1e-6)
    floats = {"image": np.full((1, 2, 2, 1), 0.5, np.float32)}
    assert as_float_images(floats) is floats  # float batches (chapters, ``get``) pass unchanged


def _scene(path: Path, size=(480, 360)) -> Path:
    """A JPEG whose left half is dark and right half bright, with a gradient from top to bottom."""
    w, h = size
    image = np.zeros((h, w, 3), np.uint8)
    image[:, w // 2:] = 200
    image[..., 1] = np.linspace(0, 255, h, dtype=np.uint8)[:, None]
    Image.fromarray(image).save(path, quality=95)
    return path


def test_image_folder_training_crops_and_flips_per_example_seed(tmp_path):
    root = tmp_path / "tree"
    for split in ("train", "val"):
        for name in ("a", "b"):
            (root / split / name).mkdir(parents=True)
            for i in range(2):
                _scene(root / split / name / f"{i}.jpg")
    data = ImageFolder(root, image_size=32, seed=7)
    one = data.get_uint8("train", np.arange(4), epoch=0, augment=True)
    assert one["image"].shape == (4, 32, 32, 3) and one["image"].dtype == np.uint8
    np.testing.assert_array_equal(one["image"], data.get_uint8("train", np.arange(4), epoch=0, augment=True)["image"])
    alone = data.get_uint8("train", np.array([2]), epoch=0, augment=True)["image"][0]
    np.testing.assert_array_equal(one["image"][2], alone)  # an example's crop does not depend on its batch
    assert not np.array_equal(one["image"], data.get_uint8("train", np.arange(4), epoch=1, augment=True)["image"])
    assert not np.array_equal(one["image"], ImageFolder(root, image_size=32, seed=8).get_uint8(
        "train", np.arange(4), epoch=0, augment=True)["image"])
    # Flips: each crop is the unflipped crop mirrored exactly when its flip draw says so; about half are.
    path = data.files("train")[0]
    flips = []
    for epoch in range(200):
        rng = example_rng(7, epoch, 0)
        inception_crop_box(rng, 480, 360)  # the box comes first, then the flip
        flips.append(flip_left_right(rng))
        plain = read_image(path, 32, rng=example_rng(7, epoch, 0), flip=False)
        want = plain[:, ::-1] if flips[-1] else plain
        np.testing.assert_array_equal(read_image(path, 32, rng=example_rng(7, epoch, 0)), want)
    assert 0.4 < np.mean(flips) < 0.6
    # Evaluation is unchanged: shorter side resized, center crop, the same pixels as ``get``.
    np.testing.assert_array_equal(data.get_uint8("val", np.arange(2))["image"],
                                  to_uint8(data.get("val", np.arange(2))["image"]))


def test_a_corrupt_file_read_in_a_worker_raises_naming_it(tmp_path):
    root = tmp_path / "tree"
    for split in ("train", "val"):
        (root / split / "a").mkdir(parents=True)
        for i in range(4):
            _scene(root / split / "a" / f"{i}.jpg", size=(40, 30))
    bad = root / "train" / "a" / "2.jpg"
    bad.write_bytes(b"\xff\xd8 not a JPEG")
    pipeline = train_pipeline(ImageFolder(root, image_size=8), 4, seed=0, stop_step=3, workers=1)
    with pytest.raises(DataError, match=rf"^{bad}: not a readable image"):
        next(pipeline)
    close_pipeline(pipeline)


class FailingDigits:
    """The digits, failing to build any training batch holding example ``bad``."""

    def __init__(self, base, bad):
        self.base, self.bad = base, bad

    def __getattr__(self, name):
        if name.startswith("__") or name == "base":  # unpickling in a worker looks up hooks before base is set
            raise AttributeError(name)
        return getattr(self.base, name)

    def get_uint8(self, split, indices, *, epoch=0, augment=False):
        if split == "train" and self.bad in indices:
            raise DataError(f"example {self.bad}: broken")
        return self.base.get_uint8(split, indices, epoch=epoch, augment=augment)


def test_small_batches_travel_together_and_an_error_still_comes_at_its_step(small_digits, tmp_path):
    assert steps_per_element(small_digits, 16, workers=2) == 16  # 16 KiB a batch: 16 steps an element
    assert steps_per_element(small_digits, 16, workers=0) == 1
    _scene(tmp_path / "a.jpg", size=(40, 30))
    for split in ("train", "val"):
        (tmp_path / "tree" / split / "a").mkdir(parents=True)
        (tmp_path / "tree" / split / "a" / "0.jpg").write_bytes((tmp_path / "a.jpg").read_bytes())
    assert steps_per_element(ImageFolder(tmp_path / "tree", image_size=224), 16, workers=2) == 1  # 2.4 MB
    n = small_digits.split_size("train")
    steps = [batch_indices(n, 16, seed=3, step=s)[1] for s in range(12)]
    bad = int(np.setdiff1d(steps[9], np.concatenate(steps[2:9]))[0])
    expected = [b for _, b in zip(range(9), train_batches(small_digits, 16, seed=3))]
    pipeline = train_pipeline(FailingDigits(small_digits, bad), 16, seed=3, start_step=2, stop_step=12, workers=1)
    got = []
    with pytest.raises(DataError, match=f"example {bad}: broken"):
        for batch in pipeline:
            got.append(batch["label"])
    close_pipeline(pipeline)
    assert len(got) == 7  # steps 2-8, then step 9's error, though steps 2-12 crossed from the worker together
    for want, labels in zip(expected[2:], got):
        np.testing.assert_array_equal(labels, want["label"])


class SlowDigits:
    """The digits, 200 ms per training batch: a run that waits for its input."""

    def __init__(self, base):
        self.base = base

    def __getattr__(self, name):
        return getattr(self.base, name)

    def get(self, split, indices, *, epoch=0):
        if split == "train":
            time.sleep(0.2)
        return self.base.get(split, indices, epoch=epoch)


def test_records_give_images_per_second_and_data_wait_and_warn_once_when_input_bound(small_digits, tiny_vit_config):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = train(tiny_vit_config, SlowDigits(small_digits), FAST.replace(steps=8), progress=False)
    records = result.history
    assert [r["step"] for r in records] == [2, 4, 6, 8]
    assert all(r["images_per_second"] > 0 and 0 <= r["data_wait_fraction"] <= 1 for r in records)
    assert max(r["data_wait_fraction"] for r in records) > 0.5
    flops = training_flops_per_image(tiny_vit_config)  # the shared count x 3, at the measured rate; no CPU peak
    assert all(r["tflops_per_second"] == pytest.approx(r["images_per_second"] * flops / 1e12) for r in records)
    assert all(r["mfu"] is None for r in records)
    assert {"img/s", "wait", "TFLOP/s"} <= set(_postfix(records[-1]))
    bound = [w for w in caught if issubclass(w.category, InputBoundWarning)]
    assert len(bound) == 1 and "--data-workers" in str(bound[0].message)


def test_a_run_resumed_past_its_new_last_step_trains_nothing(small_digits, tiny_vit_config, tmp_path):
    train(tiny_vit_config, small_digits, FAST.replace(steps=3), workdir=tmp_path, progress=False)
    again = train(tiny_vit_config, small_digits, FAST.replace(steps=2), workdir=tmp_path, progress=False)
    assert again.resumed_from == 3 and [h["step"] for h in again.history] == [2, 3]
