"""RandAugment (N, M) on image-folder training batches (moe_course.data.randaugment, kornia): the option's checks
(without kornia too), the clear error without PyTorch or kornia, the magnitudes on TensorFlow's scale, per-example
determinism that leaves torch's global generator alone, the same batches from a Grain worker, the command line."""

import math
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from moe_course.cli import main
from moe_course.data import ImageFolder, load_dataset
from moe_course.data.augment import example_rng
from moe_course.data.base import DataError
from moe_course.data.folders import read_image
from moe_course.data.randaugment import (LIMITS, NUM_OPERATIONS, RandAugmentUnavailable, check_randaugment,
                                         operation_magnitudes, randaugment_module)

NO_KORNIA = "RandAugment runs on kornia and PyTorch: pip install -e '.[augment]' after a PyTorch wheel"


def _kornia():
    """torch, after skipping (by name) where torch or kornia is missing."""
    torch = pytest.importorskip("torch", reason=NO_KORNIA)
    pytest.importorskip("kornia", reason=NO_KORNIA)
    return torch


def _tree(root: Path, per_class: int = 4) -> Path:
    """A tiny image folder: 2 classes x ``per_class`` 48x40 JPEGs in train/ and val/, each a different picture."""
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for name in ("a", "b"):
            (root / split / name).mkdir(parents=True)
            for i in range(per_class):
                low = rng.integers(0, 256, (5, 6, 3), dtype=np.uint8)  # smooth colours, then an edge
                image = np.asarray(Image.fromarray(low).resize((48, 40), Image.BICUBIC)).copy()
                image[:, 20 + i:24 + i] = 255
                Image.fromarray(image).save(root / split / name / f"{i}.jpg", quality=95)
    return root


@pytest.mark.parametrize("value", [(0, 10), (16, 10), (2.5, 10), (True, 10), (2, 0), (2, -1), (2, 20.5),
                                   (2, math.nan), (2, math.inf), (2, "10"), (2, True), (2,), (2, 10, 1), 5])
def test_bad_values_are_refused_naming_randaugment_before_anything_is_built(value, tmp_path):
    with pytest.raises(ValueError, match=r"^randaugment=.* is not allowed; use \(N, M\) with N an integer in "
                                         rf"\[1, {NUM_OPERATIONS}\] .* M a number in \(0, 20\]"):
        check_randaugment(value)
    with pytest.raises(ValueError, match=r"^randaugment=") as caught:  # before the (missing) files are looked at
        ImageFolder(tmp_path / "nothing-here", image_size=32, randaugment=value)
    assert not isinstance(caught.value, DataError)


def test_good_values_and_the_dataset_kinds_that_take_them():
    assert check_randaugment((2, 10)) == (2, 10.0) and check_randaugment([1, 0.5]) == (1, 0.5)
    assert check_randaugment((np.int64(NUM_OPERATIONS), 20)) == (NUM_OPERATIONS, 20.0)
    with pytest.raises(ValueError, match=r"^randaugment=\(2, 10\) applies to image folders"):
        load_dataset("digits", None, randaugment=(2, 10))
    with pytest.raises(ValueError, match=r"^randaugment=\(2, 10\) applies to image folders"):
        load_dataset("cifar10", "/nonexistent", randaugment=(2, 10))


@pytest.mark.parametrize("missing", ["kornia", "torch"])
def test_without_kornia_or_torch_the_dataset_says_what_to_install(missing, monkeypatch, tmp_path):
    root = _tree(tmp_path / "tree", per_class=1)
    for name in [m for m in sys.modules if m == missing or m.startswith(missing + ".")] or [missing]:
        monkeypatch.setitem(sys.modules, name, None)  # a later import of it raises ImportError
    randaugment_module.cache_clear()
    try:
        with pytest.raises(RandAugmentUnavailable) as caught:
            ImageFolder(root, image_size=32, randaugment=(2, 10))
    finally:
        randaugment_module.cache_clear()
    message = str(caught.value)
    assert isinstance(caught.value, ValueError)  # so `moe-course train` reports it in one line
    assert message.startswith("randaugment=(2, 10) needs PyTorch and kornia (")
    assert '--index-url https://download.pytorch.org/whl/cpu' in message and 'pip install -e ".[augment]"' in message


def test_magnitude_10_is_the_end_of_each_of_kornias_default_ranges():
    """Every operation selected once (N = 15): kornia's drawn parameter at M = 10 is its default range's end
    (posterize: the low end, kornia's direction; rotate and translate: either sign); shear is TensorFlow's
    16.7 degrees rather than kornia's 0.3 * 180 = 54 (docs/data.md)."""
    torch = _kornia()
    from kornia.augmentation.auto.rand_augment.rand_augment import default_policy

    assert len(default_policy) == NUM_OPERATIONS
    ends = {name: (low if name == "posterize" else high) for [(name, low, high)] in default_policy}
    side = 32
    keys = {"rotate": ("degrees", ends["rotate"]), "posterize": ("bits_factor", ends["posterize"]),
            "solarize": ("thresholds", ends["solarize"]), "solarize_add": ("additions", ends["solarize_add"]),
            "color": ("saturation_factor", ends["color"]), "contrast": ("contrast_factor", ends["contrast"]),
            "brightness": ("brightness_factor", ends["brightness"]), "sharpness": ("sharpness", ends["sharpness"]),
            "shear_x": ("shear_x", math.degrees(math.atan(0.3))), "shear_y": ("shear_y", math.degrees(math.atan(0.3))),
            "translate_x": ("translate_x", ends["translate_x"] * side),
            "translate_y": ("translate_y", ends["translate_y"] * side)}
    module = randaugment_module(NUM_OPERATIONS, 10)
    names = {f"PolicySequential_{i}": name for i, [(name, _, _)] in enumerate(default_policy)}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        params = module.forward_parameters(torch.Size([1, 3, side, side]))
    seen = set()
    for item in params:
        name = names[item.name]
        seen.add(name)
        if name in keys:
            key, expected = keys[name]
            got = float(item.data[0].data[key].abs())
            assert got == pytest.approx(expected, rel=1e-6), (name, got, expected)
    assert seen == set(names.values())
    assert operation_magnitudes(10)["posterize"] == 4


def test_past_10_magnitudes_extrapolate_and_stop_at_kornias_limits():
    torch = _kornia()
    from kornia.augmentation.auto import RandAugment

    at15, at20 = operation_magnitudes(15), operation_magnitudes(20)
    assert at15["rotate"] == pytest.approx(45) and at20["translate_x"] == pytest.approx(0.2)
    assert at15["color"] == pytest.approx(2.8) and at15["posterize"] == 2
    assert at15["solarize_add"] == 0.5 and at20["brightness"] == 2.0 and at20["solarize"] == 1.0
    assert at20["posterize"] == 1  # kornia's 0 bits (a black image) is held at 1
    for name, (low, high) in LIMITS.items():  # kornia itself refuses a range past the limits the module keeps
        if name != "posterize":
            with pytest.raises(ValueError, match="out of bounds"):
                RandAugment(1, 15, policy=[[(name, high + 0.01, high + 0.01)]])
    image = np.random.default_rng(0).integers(0, 256, (24, 24, 3), dtype=np.uint8)
    for magnitude in (0.5, 15, 20):  # every operation runs at these magnitudes
        module = randaugment_module(NUM_OPERATIONS, magnitude)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(1)
            assert module(torch.tensor(image).permute(2, 0, 1)[None].float() / 255).shape == (1, 3, 24, 24)


def test_an_examples_pixels_follow_its_seed_epoch_and_index_and_leave_torchs_generator_alone(tmp_path):
    torch = _kornia()
    root = _tree(tmp_path / "tree")
    plain = ImageFolder(root, image_size=32, seed=3)
    data = ImageFolder(root, image_size=32, seed=3, randaugment=(2, 10))
    torch.manual_seed(123)
    state = torch.random.get_rng_state()
    one = data.get_uint8("train", np.arange(8), epoch=0, augment=True)["image"]
    assert torch.equal(torch.random.get_rng_state(), state)  # the global generator is where it was
    assert one.shape == (8, 32, 32, 3) and one.dtype == np.uint8
    np.testing.assert_array_equal(one, data.get_uint8("train", np.arange(8), epoch=0, augment=True)["image"])
    np.testing.assert_array_equal(one[5], data.get_uint8("train", np.array([5]), epoch=0, augment=True)["image"][0])
    assert not np.array_equal(one, data.get_uint8("train", np.arange(8), epoch=1, augment=True)["image"])
    crops = plain.get_uint8("train", np.arange(8), epoch=0, augment=True)["image"]
    assert sum(not np.array_equal(a, b) for a, b in zip(one, crops)) >= 6  # RandAugment changed (nearly) all
    # The crop and flip are drawn as without RandAugment, which then works on the crop.
    path = data.files("train")[5]
    crop = read_image(path, 32, rng=example_rng(3, 0, 5))
    np.testing.assert_array_equal(crop, crops[5])
    from moe_course.data.randaugment import apply_randaugment

    np.testing.assert_array_equal(one[5], apply_randaugment(crop, (2, 10.0), seed=3, epoch=0, index=5))
    others = {apply_randaugment(crop, (2, 10.0), seed=3, epoch=0, index=i).tobytes() for i in range(8)}
    assert len(others) >= 6  # other indices draw other operations or signs
    # Evaluation batches are untouched.
    np.testing.assert_array_equal(data.get_uint8("val", np.arange(4))["image"],
                                  plain.get_uint8("val", np.arange(4))["image"])


def test_a_grain_worker_gives_the_batches_of_the_training_process(tmp_path):
    _kornia()
    from moe_course.data.pipeline import close_pipeline, train_pipeline

    data = load_dataset("imagefolder", _tree(tmp_path / "tree"), image_size=32, seed=1, randaugment=(2, 10))
    batches = {}
    for workers in (0, 1):
        pipeline = train_pipeline(data, 4, seed=1, stop_step=3, workers=workers)
        batches[workers] = [batch["image"] for batch in pipeline]
        close_pipeline(pipeline)
    assert len(batches[0]) == len(batches[1]) == 3
    for a, b in zip(batches[0], batches[1]):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("values, expected", [
    (["0", "10"], "randaugment=(0, 10) is not allowed; use (N, M) with N an integer in [1, 15]"),
    (["2", "25"], "randaugment=(2, 25) is not allowed"),
    (["2.5", "10"], "randaugment=(2.5, 10) is not allowed"),
    (["2", "10"], "randaugment=(2, 10) applies to image folders (dataset 'imagefolder'); dataset 'digits'"),
])
def test_the_command_line_refuses_bad_values_in_one_line_before_training(values, expected, capsys):
    assert main(["train", "vit", "--preset", "digits-tiny", "--randaugment", *values]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err
    assert err.startswith("moe-course train: error: ") and expected in err, err


def test_the_command_line_wants_two_numbers(capsys):
    for values in (["2", "x"], ["2"]):
        with pytest.raises(SystemExit) as exit_info:
            main(["train", "vit", "--preset", "digits-tiny", "--randaugment", *values])
        assert exit_info.value.code == 2
        assert "--randaugment" in capsys.readouterr().err


def test_a_run_records_its_randaugment_and_refuses_to_resume_with_another(tiny_vit_config, tmp_path):
    _kornia()
    import json

    from moe_course.train import TrainConfig, train

    root = _tree(tmp_path / "tree")
    config = tiny_vit_config.replace(channels=3, num_classes=2)
    recipe = TrainConfig(steps=1, batch_size=4, learning_rate=1e-3, warmup_steps=1, log_every=1, eval_every=0,
                         checkpoint_every=1, eval_batch_size=4)
    data = ImageFolder(root, image_size=16, randaugment=(2, 10))
    train(config, data, recipe, workdir=tmp_path / "run", progress=False, stop_after=0)  # records, trains nothing
    assert json.loads((tmp_path / "run" / "run.json").read_text())["data"]["randaugment"] == [2, 10.0]
    for other, shown in ((None, "None"), ((2, 15), r"\[2, 15.0\]")):
        with pytest.raises(ValueError, match=rf"data.randaugment: saved \[2, 10.0\], now {shown}"):
            train(config, ImageFolder(root, image_size=16, randaugment=other), recipe.replace(steps=2),
                  workdir=tmp_path / "run", progress=False)


@pytest.mark.parametrize("where", ["device", "workers"])
def test_the_command_line_runs_randaugment_where_asked_and_records_it(where, tmp_path, capsys):
    """--randaugment-on device (the default): in the training step, recorded as train.randaugment, no kornia
    needed; workers: kornia in the input workers, recorded as data.randaugment."""
    import json

    if where == "workers":
        _kornia()
    root = _tree(tmp_path / "tree")
    argv = ["train", "vit", "--preset", "digits-tiny", "--dataset", "imagefolder", "--data-dir", str(root),
            "--image-size", "32", "--steps", "2", "--batch-size", "4", "--warmup-steps", "1", "--no-progress",
            "--data-workers", "0", "--workdir", str(tmp_path / "run"), "--randaugment", "2", "10"]
    assert main(argv + (["--randaugment-on", "workers"] if where == "workers" else [])) == 0, capsys.readouterr()
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    placed = {"device": record["train"]["randaugment"], "workers": record["data"]["randaugment"]}
    assert placed == {where: [2, 10.0], ("workers" if where == "device" else "device"): None}, placed
