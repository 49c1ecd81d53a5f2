"""Image-caption loaders (COCO captions JSON, image<TAB>caption) on tiny files the tests write, and their errors."""

import json

import numpy as np
import pytest
from PIL import Image

from moe_course.data import DataError, load_dataset
from moe_course.data.caption_files import ImageCaptions

CAPTIONS = ["a red square", "a green square", "a blue square on white"]


def _images(folder, count):
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        Image.fromarray(np.full((12, 20, 3), 40 * i, np.uint8)).save(folder / f"img{i}.png")


def _tsv(path, rows):
    path.write_text("".join(f"{f}\t{c}\n" for f, c in rows), encoding="utf-8")


def _coco(path, files, pairs):
    path.write_text(json.dumps({"images": [{"id": 10 + i, "file_name": f} for i, f in enumerate(files)],
                                "annotations": [{"id": n, "image_id": 10 + i, "caption": c}
                                                for n, (i, c) in enumerate(pairs)]}), encoding="utf-8")


@pytest.fixture
def tsv_root(tmp_path):
    for split in ("train", "val"):
        _images(tmp_path / split, 3)
        _tsv(tmp_path / f"{split}.tsv", [(f"img{i}.png", c) for i, c in enumerate(CAPTIONS)])
    return tmp_path


def test_tsv_layout_in_the_image_text_batch_format(tsv_root):
    data = ImageCaptions(tsv_root, image_size=8, vocab_size=30, seq_len=6)
    assert (data.split_size("train"), data.split_size("val"), data.split_size("test")) == (3, 3, 0)
    batch = data.get("val", np.array([2, 0]))
    assert batch["image"].shape == (2, 8, 8, 3) and batch["image"].dtype == np.float32
    assert list(batch["caption"]) == [CAPTIONS[2], CAPTIONS[0]]
    assert batch["text"].shape == (2, 6) and batch["text_mask"].dtype == bool
    assert (batch["label"] == -1).all() and data.num_classes == 0
    np.testing.assert_allclose(batch["image"][1], 0.0)  # img0 is black, img2 is 80/255
    # shorter side by area, as big_vision's resize_small: a flat 80 keeps 80 or truncates to 79 (test_resize.py)
    assert set(np.unique(np.round(batch["image"][0] * 255))) == {79, 80}
    assert data.tokenizer.decode(batch["text"][1:]) == [CAPTIONS[0]]


def test_coco_json_gives_one_example_per_caption(tmp_path):
    for split in ("train", "val"):
        _images(tmp_path / split, 2)
        _coco(tmp_path / f"{split}.json", ["img0.png", "img1.png"], [(0, "a dark one"), (1, "a light one"),
                                                                     (1, "another light one")])
    data = ImageCaptions(tmp_path, image_size=4, vocab_size=30)
    assert data.split_size("train") == 3
    batch = data.get("train", np.arange(3))
    assert list(batch["caption"]) == ["a dark one", "a light one", "another light one"]
    np.testing.assert_array_equal(batch["image"][1], batch["image"][2])


def test_missing_caption_file_names_the_path(tsv_root):
    (tsv_root / "val.tsv").unlink()
    with pytest.raises(DataError, match="val.json: does not exist \\(nor val.tsv\\)"):
        ImageCaptions(tsv_root)


def test_caption_naming_a_missing_image_is_refused(tsv_root):
    _tsv(tsv_root / "train.tsv", [("img0.png", "a"), ("img7.png", "b")])
    with pytest.raises(DataError, match="img7.png: does not exist, but .*train.tsv names it; the caption file does "
                                        "not match the images"):
        ImageCaptions(tsv_root)


def test_malformed_files_name_the_path_and_line(tsv_root):
    (tsv_root / "train.tsv").write_text("img0.png\ta\nimg1.png a caption without a tab\n", encoding="utf-8")
    with pytest.raises(DataError, match="train.tsv:2: .* is not '<image file><TAB><caption>'"):
        ImageCaptions(tsv_root)
    (tsv_root / "train.tsv").unlink()
    (tsv_root / "train.json").write_text('{"images": []}', encoding="utf-8")
    with pytest.raises(DataError, match="train.json: cannot be read \\(KeyError.*expected COCO captions JSON"):
        ImageCaptions(tsv_root)
    _coco(tsv_root / "train.json", ["img0.png"], [(3, "no such image id")])
    with pytest.raises(DataError, match="names image_id 13, which is not in its \"images\" list"):
        ImageCaptions(tsv_root)


def test_two_caption_files_for_one_split_and_missing_folders(tsv_root, tmp_path):
    _coco(tsv_root / "val.json", ["img0.png"], [(0, "x")])
    with pytest.raises(DataError, match="both exist"):
        ImageCaptions(tsv_root)
    with pytest.raises(DataError, match="nowhere: does not exist"):
        ImageCaptions(tmp_path / "nowhere")


def test_registry_loads_the_caption_layout(tsv_root):
    data = load_dataset("captions", tsv_root, image_size=8)
    assert isinstance(data, ImageCaptions) and data.image_shape == (8, 8, 3)
