"""The full-scale loaders (CIFAR archives, class-folder trees) and the registry, on tiny fake data written here."""

from __future__ import annotations

import io
import os
import pickle
import re
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from moe_course.data import (
    DATASETS,
    Cifar,
    ClutteredDigits,
    DataError,
    ImageFolder,
    eval_batches,
    load_dataset,
    train_batches,
)
from moe_course.data.registry import GLYPHS_PER_DIGIT
from moe_course.data.resize import resize_area

# ----------------------------------------------------------------------------------------------- fake CIFAR

FOLDER = {"cifar10": "cifar-10-batches-py", "cifar100": "cifar-100-python"}
ARCHIVE = {"cifar10": "cifar-10-python.tar.gz", "cifar100": "cifar-100-python.tar.gz"}
NUM_CLASSES = {"cifar10": 10, "cifar100": 100}


def _batch(images: np.ndarray, labels: np.ndarray, variant: str) -> dict:
    """A pickled-batch dict as in the real files: rows are 3 colour planes of 32x32 (CHW)."""
    data = images.transpose(0, 3, 1, 2).reshape(len(images), 3072)
    if variant == "cifar10":
        return {b"batch_label": b"fake", b"labels": [int(x) for x in labels], b"data": data}
    return {b"fine_labels": [int(x) for x in labels], b"coarse_labels": [int(x) // 5 for x in labels], b"data": data}


def fake_cifar(tmp_path: Path, variant: str, *, form: str = "folder", per_batch: int = 6, n_batches: int = 2,
               n_test: int = 4, seed: int = 0, drop: tuple[str, ...] = (), replace: dict | None = None):
    """Writes a tiny CIFAR (``form``: "archive" or "folder") and returns (path, truth).

    truth: {"train"/"test": (images (N, 32, 32, 3) uint8, labels (N,) int32), "names": class names}.
    ``drop`` leaves members out; ``replace`` maps a member name to raw bytes written instead of its pickle.
    """
    rng = np.random.default_rng(seed)
    n_classes = NUM_CLASSES[variant]
    names = [f"class_{i}" for i in range(n_classes)]
    members: dict[str, bytes] = {}
    train_images, train_labels = [], []
    for b in range(n_batches):
        images = rng.integers(0, 256, (per_batch, 32, 32, 3), dtype=np.uint8)
        labels = rng.integers(0, n_classes, per_batch).astype(np.int32)
        train_images.append(images)
        train_labels.append(labels)
        if variant == "cifar10":
            members[f"data_batch_{b + 1}"] = pickle.dumps(_batch(images, labels, variant), protocol=2)
    if variant == "cifar100":  # one train file holding every batch
        train = _batch(np.concatenate(train_images), np.concatenate(train_labels), variant)
        members["train"] = pickle.dumps(train, protocol=2)
    test_images = rng.integers(0, 256, (n_test, 32, 32, 3), dtype=np.uint8)
    test_labels = rng.integers(0, n_classes, n_test).astype(np.int32)
    members["test_batch" if variant == "cifar10" else "test"] = pickle.dumps(
        _batch(test_images, test_labels, variant), protocol=2
    )
    meta_key, names_key = ("batches.meta", b"label_names") if variant == "cifar10" else ("meta", b"fine_label_names")
    members[meta_key] = pickle.dumps({names_key: [n.encode() for n in names], b"num_vis": 3072}, protocol=2)
    members.update(replace or {})
    for name in drop:
        members.pop(name)

    if form == "folder":
        path = tmp_path / FOLDER[variant]
        path.mkdir()
        for name, blob in members.items():
            (path / name).write_bytes(blob)
    else:
        path = tmp_path / ARCHIVE[variant]
        with tarfile.open(path, "w:gz") as tar:
            for name, blob in members.items():
                info = tarfile.TarInfo(f"{FOLDER[variant]}/{name}")
                info.size = len(blob)
                tar.addfile(info, io.BytesIO(blob))
    truth = {
        "train": (np.concatenate(train_images), np.concatenate(train_labels)),
        "test": (test_images, test_labels),
        "names": tuple(names),
    }
    return path, truth


def _as_uint8(images: np.ndarray) -> np.ndarray:
    return np.round(images * 255.0).astype(np.uint8)


@pytest.mark.parametrize("variant", ["cifar10", "cifar100"])
@pytest.mark.parametrize("form", ["archive", "folder"])
def test_cifar_reads_both_forms_exactly(tmp_path, variant, form):
    path, truth = fake_cifar(tmp_path, variant, form=form)
    data = Cifar(path, variant=variant, val_size=3)
    assert data.name == variant and data.num_classes == NUM_CLASSES[variant]
    assert data.class_names == truth["names"]
    assert data.image_shape == (32, 32, 3)
    assert [data.split_size(s) for s in ("train", "val", "test")] == [9, 3, 4]

    batch = data.get("test", np.arange(4))
    assert set(batch) == {"image", "label"}
    assert batch["image"].shape == (4, 32, 32, 3) and batch["image"].dtype == np.float32
    assert batch["label"].shape == (4,) and batch["label"].dtype == np.int32
    assert 0.0 <= batch["image"].min() and batch["image"].max() <= 1.0
    np.testing.assert_array_equal(_as_uint8(batch["image"]), truth["test"][0])
    np.testing.assert_array_equal(batch["label"], truth["test"][1])


def test_cifar_pixels_decode_channel_row_column(tmp_path):
    """Row k of b"data" holds pixel (y, x) of channel c at column c * 1024 + y * 32 + x."""
    path, _ = fake_cifar(tmp_path, "cifar10", n_batches=1, per_batch=2)
    data = np.zeros((2, 3072), np.uint8)
    data[0, :1024] = 255  # image 0: pure red
    data[1, 1024 + 3 * 32 + 7] = 200  # image 1: one green pixel at row 3, column 7
    data[1, 2048 + 31] = 100  # and one blue pixel at row 0, column 31
    (path / "data_batch_1").write_bytes(pickle.dumps({b"data": data, b"labels": [4, 2]}, protocol=2))
    batch = Cifar(path, val_size=0).get("train", np.array([0, 1]))
    images = _as_uint8(batch["image"])
    assert (images[0, ..., 0] == 255).all() and (images[0, ..., 1:] == 0).all()
    assert images[1, 3, 7, 1] == 200 and images[1, 0, 31, 2] == 100
    assert images[1].sum() == 300
    assert batch["label"].tolist() == [4, 2]


def test_cifar_accepts_a_folder_holding_the_archive_or_the_extracted_folder(tmp_path):
    for form in ("archive", "folder"):
        root = tmp_path / form
        root.mkdir()
        fake_cifar(root, "cifar10", form=form)
        assert Cifar(root, val_size=0).split_size("train") == 12


def test_cifar_val_is_the_last_training_examples_in_batch_order(tmp_path):
    path, truth = fake_cifar(tmp_path, "cifar10", form="archive", n_batches=3, per_batch=4)
    data = Cifar(path, val_size=5)
    images, labels = truth["train"]
    assert data.split_size("train") == 7 and data.split_size("val") == 5
    train = data.get("train", np.arange(7))
    val = data.get("val", np.arange(5))
    np.testing.assert_array_equal(_as_uint8(train["image"]), images[:7])
    np.testing.assert_array_equal(_as_uint8(val["image"]), images[7:])
    np.testing.assert_array_equal(val["label"], labels[7:])
    # Deterministic: a second load gives the same split.
    np.testing.assert_array_equal(Cifar(path, val_size=5).get("val", np.arange(5))["image"], val["image"])


def test_cifar_without_val(tmp_path):
    path, _ = fake_cifar(tmp_path, "cifar10")
    data = Cifar(path, val_size=0)
    assert data.split_size("train") == 12 and data.split_size("val") == 0
    with pytest.raises(ValueError, match="empty"):
        data.get("val", np.arange(1))


def test_cifar_bad_arguments(tmp_path):
    path, _ = fake_cifar(tmp_path, "cifar10")
    with pytest.raises(ValueError, match="val_size=12"):
        Cifar(path, val_size=12)
    with pytest.raises(ValueError, match="variant='cifar1000'"):
        Cifar(path, variant="cifar1000")
    with pytest.raises(ValueError, match=r"indices must lie in \[0, 4\)"):
        Cifar(path, val_size=0).get("test", np.array([4]))


def test_cifar_resize(tmp_path):
    path, truth = fake_cifar(tmp_path, "cifar100", n_batches=1)
    data = Cifar(path, variant="cifar100", image_size=16, val_size=0)
    assert data.image_shape == (16, 16, 3)
    batch = data.get("test", np.array([2, 0]))
    assert batch["image"].shape == (2, 16, 16, 3) and batch["image"].dtype == np.float32
    assert 0.0 <= batch["image"].min() and batch["image"].max() <= 1.0
    expected = np.asarray(Image.fromarray(truth["test"][0][2]).resize((16, 16), Image.BILINEAR))
    np.testing.assert_array_equal(_as_uint8(batch["image"][0]), expected)
    assert data.get("test", np.zeros(0, np.int64))["image"].shape == (0, 16, 16, 3)


def test_cifar_works_with_the_batch_iterators(tmp_path):
    path, truth = fake_cifar(tmp_path, "cifar10")
    data = Cifar(path, val_size=2)
    labels = np.concatenate([b["label"] for b in eval_batches(data, "test", 3)])
    np.testing.assert_array_equal(labels, truth["test"][1])
    batch = next(train_batches(data, 4, seed=0))
    assert batch["image"].shape == (4, 32, 32, 3) and batch["label"].dtype == np.int32


# ------------------------------------------------------------------------------------------- CIFAR errors


def _raises_naming(path, what: str):
    return pytest.raises(DataError, match=re.escape(str(path)) + ".*" + what)


def test_cifar_missing_path(tmp_path):
    with _raises_naming(tmp_path / "nope", "does not exist; expected the CIFAR archive cifar-10-python.tar.gz"):
        Cifar(tmp_path / "nope")


@pytest.mark.parametrize("form", ["archive", "folder"])
def test_cifar_missing_members(tmp_path, form):
    path, _ = fake_cifar(tmp_path, "cifar10", form=form, drop=("test_batch",))
    with _raises_naming(path, "missing test_batch; expected cifar-10-batches-py/"):
        Cifar(path)


def test_cifar_missing_first_batch_and_empty_folder(tmp_path):
    path, _ = fake_cifar(tmp_path, "cifar10", n_batches=3, drop=("data_batch_1",))
    with _raises_naming(path, "missing data_batch_1;"):
        Cifar(path)
    empty = tmp_path / "empty"
    empty.mkdir()
    with _raises_naming(empty, "missing train, test, meta; expected cifar-100-python/"):
        Cifar(empty, variant="cifar100")


@pytest.mark.parametrize("form", ["archive", "folder"])
def test_cifar_corrupt_pickle(tmp_path, form):
    whole = pickle.dumps({b"data": np.zeros((6, 3072), np.uint8), b"labels": [0] * 6}, protocol=2)
    for name, blob in [("garbage", b"\x00not a pickle at all" * 10), ("truncated", whole[: len(whole) // 2])]:
        root = tmp_path / f"{form}-{name}"
        root.mkdir()
        path, _ = fake_cifar(root, "cifar10", form=form, replace={"data_batch_2": blob})
        with _raises_naming(path, "data_batch_2.*not a readable CIFAR pickle"):
            Cifar(path)


def test_cifar_pickle_without_data_or_with_wrong_shape(tmp_path):
    path, _ = fake_cifar(tmp_path, "cifar10", replace={"data_batch_1": pickle.dumps({b"labels": [1, 2]})})
    with _raises_naming(path / "data_batch_1", "no b'data'"):
        Cifar(path)
    bad = pickle.dumps({b"data": np.zeros((2, 100), np.uint8), b"labels": [1, 2]})
    (path / "data_batch_1").write_bytes(bad)
    with _raises_naming(path / "data_batch_1", r"expected uint8 \(N, 3072\)"):
        Cifar(path)


def test_cifar_pickle_may_not_run_code(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.getcwd, ())

    path, _ = fake_cifar(tmp_path, "cifar10", replace={"test_batch": pickle.dumps({b"data": Evil()})})
    with _raises_naming(path / "test_batch", "is not allowed in a CIFAR pickle"):
        Cifar(path)


def test_cifar_corrupt_archive(tmp_path):
    garbage = tmp_path / "cifar-10-python.tar.gz"
    garbage.write_bytes(b"definitely not gzip" * 50)
    with _raises_naming(garbage, "not a readable CIFAR archive.*expected the python version cifar-10-python.tar.gz"):
        Cifar(garbage)
    (tmp_path / "sub").mkdir()
    good, _ = fake_cifar(tmp_path / "sub", "cifar10", form="archive")
    truncated = tmp_path / "truncated.tar.gz"
    blob = good.read_bytes()
    truncated.write_bytes(blob[: len(blob) // 2])
    with _raises_naming(truncated, "not a readable CIFAR archive"):
        Cifar(truncated)


# ------------------------------------------------------------------------------------------ class folders

COLORS = {"cat": (200, 30, 10), "dog": (0, 128, 255), "emu": (90, 90, 90)}


def _write_image(path: Path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array).save(path)


def _solid(color, height=20, width=30) -> np.ndarray:
    return np.broadcast_to(np.array(color, np.uint8), (height, width, 3)).copy()


def fake_tree(root: Path, *, test: bool = False) -> Path:
    """train: 2 PNG + 1 JPEG per class of 3; val: 1 PNG per class, emu missing; test (optional): dog only."""
    for name, color in COLORS.items():
        _write_image(root / "train" / name / "b.png", _solid(color))
        _write_image(root / "train" / name / "a.PNG", _solid(color))
        _write_image(root / "train" / name / "c.jpg", _solid(color))
        if name != "emu":
            _write_image(root / "val" / name / "x.png", _solid(color))
    (root / "train" / "cat" / "notes.txt").write_text("not an image")
    (root / "train" / "cat" / ".hidden.png").write_bytes(b"ignored")
    if test:
        _write_image(root / "test" / "dog" / "t.jpeg", _solid(COLORS["dog"]))
    return root


def test_image_folder_layout_labels_and_pixels(tmp_path):
    data = ImageFolder(fake_tree(tmp_path), image_size=16)
    assert data.name == "imagefolder" and data.class_names == ("cat", "dog", "emu") and data.num_classes == 3
    assert data.image_shape == (16, 16, 3)
    assert [data.split_size(s) for s in ("train", "val", "test")] == [9, 2, 0]
    assert [Path(f).name for f in data.files("train")[:3]] == ["a.PNG", "b.png", "c.jpg"]  # sorted, txt ignored

    batch = data.get("train", np.arange(9))
    assert batch["image"].shape == (9, 16, 16, 3) and batch["image"].dtype == np.float32
    assert batch["label"].dtype == np.int32 and batch["label"].tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert 0.0 <= batch["image"].min() and batch["image"].max() <= 1.0
    png = np.array([0, 1, 3, 4, 6, 7])  # solid PNGs stay exactly solid through the resize
    expected = np.array([COLORS[data.class_names[label]] for label in batch["label"][png]], np.uint8)
    solid = np.broadcast_to(expected[:, None, None], (6, 16, 16, 3))
    np.testing.assert_array_equal(_as_uint8(batch["image"][png]), solid)
    jpeg = batch["image"][[2, 5, 8]] * 255.0  # lossy: close to the colour
    assert np.abs(jpeg - np.array([COLORS[c] for c in COLORS])[:, None, None]).max() < 8

    val = data.get("val", np.arange(2))
    assert val["label"].tolist() == [0, 1]
    with pytest.raises(ValueError, match="'test' of dataset 'imagefolder' is empty"):
        data.get("test", np.arange(1))


def test_image_folder_resize_is_shorter_side_then_center_crop(tmp_path):
    root = fake_tree(tmp_path)
    pattern = np.random.default_rng(0).integers(0, 256, (20, 30, 3), dtype=np.uint8)  # height 20, width 30
    _write_image(root / "val" / "cat" / "x.png", pattern)
    batch = ImageFolder(root, image_size=20).get("val", np.array([0]))
    np.testing.assert_array_equal(_as_uint8(batch["image"][0]), pattern[:, 5:25])  # no resize, crop 5 each side
    small = ImageFolder(root, image_size=10).get("val", np.array([0]))["image"][0]  # resized to 15x10, crop 2..12
    expected = resize_area(pattern, 10, 15)[:, 2:12]  # by area, as big_vision's resize_small
    np.testing.assert_array_equal(_as_uint8(small), expected)


def test_image_folder_converts_grey_and_rgba_to_rgb(tmp_path):
    root = fake_tree(tmp_path)
    Image.fromarray(np.full((20, 30), 77, np.uint8), "L").save(root / "val" / "cat" / "x.png")
    Image.fromarray(np.full((30, 20, 4), 150, np.uint8), "RGBA").save(root / "val" / "dog" / "x.png")
    images = _as_uint8(ImageFolder(root, image_size=8).get("val", np.arange(2))["image"])
    assert images.shape == (2, 8, 8, 3)
    assert (images[0] == 77).all() and (images[1] == 150).all()


def test_image_folder_test_split_uses_train_classes(tmp_path):
    data = ImageFolder(fake_tree(tmp_path, test=True), image_size=8, name="tiny")
    assert data.name == "tiny" and data.split_size("test") == 1
    assert data.get("test", np.array([0]))["label"].tolist() == [1]  # dog is class 1 of train


def test_image_folder_missing_paths(tmp_path):
    with _raises_naming(tmp_path / "nope", "does not exist; expected .*/train/<class>/<image files>"):
        ImageFolder(tmp_path / "nope")
    (tmp_path / "file").write_text("x")
    with _raises_naming(tmp_path / "file", "is not a folder"):
        ImageFolder(tmp_path / "file")
    root = fake_tree(tmp_path / "a")
    for split in ("val", "train"):
        for f in sorted((root / split).rglob("*"), reverse=True):
            f.unlink() if f.is_file() else f.rmdir()
        (root / split).rmdir()
        with _raises_naming(root / split, "does not exist"):
            ImageFolder(root)


def test_image_folder_wrong_layouts(tmp_path):
    root = fake_tree(tmp_path / "loose")
    for folder in ("cat", "dog"):  # val/ flattened, as in ImageNet's original download
        for f in (root / "val" / folder).iterdir():
            f.rename(root / "val" / f"{folder}_{f.name}")
        (root / "val" / folder).rmdir()
    with _raises_naming(root / "val", "has no class folders .found 2 loose images"):
        ImageFolder(root)

    root = fake_tree(tmp_path / "empty_class")
    (root / "train" / "fox").mkdir()
    (root / "train" / "fox" / "readme.txt").write_text("no images here")
    with _raises_naming(root / "train" / "fox", "has no image files"):
        ImageFolder(root)

    root = fake_tree(tmp_path / "extra_class")
    _write_image(root / "val" / "yak" / "y.png", _solid((1, 2, 3)))
    with _raises_naming(root / "val" / "yak", "class 'yak' is not in train/"):
        ImageFolder(root)

    root = tmp_path / "no_classes"
    (root / "train").mkdir(parents=True)
    (root / "val").mkdir()
    with _raises_naming(root / "train", r"has no class folders; expected .*/train/<class>/<image files>"):
        ImageFolder(root)


def test_image_folder_corrupt_image_fails_when_read(tmp_path):
    root = fake_tree(tmp_path)
    bad = root / "val" / "dog" / "x.png"
    bad.write_bytes(b"\x89PNG garbage, not an image")
    jpeg = root / "train" / "dog" / "c.jpg"
    jpeg.write_bytes(jpeg.read_bytes()[:60])  # truncated
    data = ImageFolder(root, image_size=8)  # the layout is fine: no error yet
    data.get("val", np.array([0]))
    with _raises_naming(bad, "not a readable image"):
        data.get("val", np.array([1]))
    with _raises_naming(jpeg, "not a readable image"):
        data.get("train", np.array([5]))


# ---------------------------------------------------------------------------------------------- registry


def test_registry(tmp_path):
    assert DATASETS == ("digits", "cifar10", "cifar100", "imagefolder", "digits-captions", "captions",
                        "digit-glyphs")
    digits = load_dataset("digits", image_size=40, seed=3)
    assert isinstance(digits, ClutteredDigits) and digits.image_shape == (40, 40, 1) and digits.config.seed == 3
    glyphs = load_dataset("digit-glyphs", seed=3)
    assert glyphs.config.task == "glyph" and glyphs.num_classes == 10 * GLYPHS_PER_DIGIT == glyphs.split_size("train")

    path, _ = fake_cifar(tmp_path, "cifar10", n_batches=1, per_batch=5003)  # the default val holds 5000
    cifar = load_dataset("cifar10", str(path))
    assert isinstance(cifar, Cifar) and cifar.split_size("train") == 3 and cifar.split_size("val") == 5000
    assert load_dataset("cifar10", path, image_size=8).get("test", np.arange(2))["image"].shape == (2, 8, 8, 3)

    folder = load_dataset("imagefolder", fake_tree(tmp_path / "tree"), image_size=12)
    assert isinstance(folder, ImageFolder) and folder.image_shape == (12, 12, 3)
    assert ImageFolder(tmp_path / "tree").image_shape == (224, 224, 3)


def test_registry_errors(tmp_path):
    with pytest.raises(ValueError, match="'mnist' is not known; use one of digits, cifar10, cifar100, imagefolder"):
        load_dataset("mnist")
    for name in ("cifar10", "cifar100", "imagefolder", "captions"):
        with pytest.raises(DataError, match=f"'{name}' needs its files: pass --data-dir"):
            load_dataset(name)
    with pytest.raises(DataError, match="takes no path"):
        load_dataset("digits", str(tmp_path))
    with _raises_naming(tmp_path / "missing", "does not exist"):
        load_dataset("cifar100", tmp_path / "missing")


# ------------------------------------------------------------------------------- data of the wrong kind


def test_data_of_another_kind_fails_with_one_line_naming_both_kinds(tmp_path):
    """A full-scale chapter cell given the wrong MOE_COURSE_DATA (README's table: chapters 1, 3, 5 read CIFAR,
    4 image-caption data, 6 and 7 an image folder) stops with one line naming what it needs."""
    folder = fake_tree(tmp_path / "folder")
    cifar, _ = fake_cifar(tmp_path, "cifar10", form="archive")
    captions = tmp_path / "captions"
    captions.mkdir()
    (captions / "train.tsv").write_text("a.png\ta red square\n")
    cases = [("cifar10", folder, "an image folder", "CIFAR-10 python data"),
             ("captions", folder, "an image folder", "image-caption data"),
             ("imagefolder", cifar, "CIFAR python data", "an image folder"),
             ("captions", cifar, "CIFAR python data", "image-caption data"),
             ("cifar100", captions, "image-caption data", "CIFAR-100 python data"),
             ("imagefolder", captions, "image-caption data", "an image folder")]
    for name, path, found, needed in cases:
        with pytest.raises(DataError) as error:
            load_dataset(name, path)
        message = str(error.value)
        assert "\n" not in message and f"looks like {found}, but dataset {name!r} reads {needed}" in message, message
