"""big_vision's crop and resizes (moe_course.data.resize, data.augment): equal to the outputs of big_vision's own
preprocessing ops recorded by tools/make_resize_fixtures.py (TensorFlow's kernels), and the Inception boxes drawn
from the distribution of the boxes big_vision's op cut."""

import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from scipy import stats

from moe_course.data.augment import CROP_AREA, CROP_ATTEMPTS, CROP_RATIO, example_rng, inception_crop_box
from moe_course.data.folders import read_image
from moe_course.data.resize import resize_area, resize_bilinear, resize_small_size

FIXTURE = Path(__file__).parent / "fixtures" / "resize" / "big_vision_resize.npz"


@pytest.fixture(scope="module")
def recorded():
    with np.load(FIXTURE) as data:
        return dict(data)


def _cases(recorded, op):
    for key, want in recorded.items():
        if match := re.fullmatch(rf"{op}_(\d+)_([\dx]+)", key):
            index, size = match.groups()
            yield key, recorded[f"image_{index}"], [int(v) for v in size.split("x")], want


def test_the_crop_numbers_are_big_visions():
    """big_vision pp/ops_image.py, get_decode_jpeg_and_inception_crop's defaults (line 199; vit_s16_i1k.py calls it
    as decode_jpeg_and_inception_crop(224)): area_min=5, area_max=100 (percent), ratio_min=0.75, ratio_max=1.33;
    tf.image.sample_distorted_bounding_box's max_attempts 100."""
    assert CROP_AREA == (5 / 100, 100 / 100) and CROP_RATIO == (0.75, 1.33) and CROP_ATTEMPTS == 100


def test_bilinear_resize_equals_big_visions_resize_to_the_level(recorded):
    """get_resize(size) (bilinear, antialias=False, then clip and a truncating cast to uint8): every pixel, every
    case -- shrinking by up to 2x, growing, and the same size."""
    cases = list(_cases(recorded, "resize"))
    assert len(cases) == 7
    for key, image, (height, width), want in cases:
        got = resize_bilinear(image, height, width)
        assert got.dtype == np.uint8 and got.shape == want.shape, key
        np.testing.assert_array_equal(got, want, err_msg=key)


def test_area_resize_of_the_shorter_side_equals_big_visions_resize_small(recorded):
    """get_resize_small(smaller) (area, then clip and truncate): the size and every pixel -- shrinking, growing,
    a flat image -- and the central crop of evaluation."""
    cases = list(_cases(recorded, "resize_small"))
    assert len(cases) == 7
    for key, image, (smaller,), want in cases:
        size = resize_small_size(*image.shape[:2], smaller)
        assert size == want.shape[:2] and min(size) == smaller, key
        np.testing.assert_array_equal(resize_area(image, *size), want, err_msg=key)
    # A flat level 80 comes out as 79 in places: float32 sums land just below 80 and the cast truncates.
    assert set(np.unique(recorded["resize_small_3_8"])) == {79, 80}
    small = recorded["resize_small_1_64"]
    top, left = (small.shape[0] - 56) // 2, (small.shape[1] - 56) // 2
    np.testing.assert_array_equal(small[top:top + 56, left:left + 56], recorded["central_crop_1_56"])


def test_pil_bilinear_is_not_big_visions_resize(recorded):
    """Why data.resize exists: PIL's BILINEAR shrinks with a widened (antialiasing) kernel, far from
    tf.image.resize(antialias=False) on a grainy image (measured: 7.4 levels on average, 48 at most)."""
    image, want = recorded["image_0"], recorded["resize_0_32x32"].astype(int)
    pil = np.asarray(Image.fromarray(image).resize((32, 32), Image.BILINEAR)).astype(int)
    assert np.abs(pil - want).mean() > 5


@pytest.mark.parametrize("width, height", [(500, 375), (64, 480)])
def test_inception_boxes_have_the_distribution_of_big_visions_boxes(recorded, width, height):
    """4000 boxes each, ours (numpy's generator) and those big_vision's decode_jpeg_and_inception_crop cut
    (TensorFlow's Philox): the same distributions of area, aspect ratio, width, height and corner (two-sample
    Kolmogorov-Smirnov, p > 0.001 each; torchvision's rule, even at 5%, gives p < 1e-40 for area on 500 x 375), the same
    share of whole-image fallbacks, all inside the image and the ranges."""
    theirs = recorded[f"boxes_{width}x{height}"].astype(float)
    rng = np.random.default_rng(0)
    ours = np.array([inception_crop_box(rng, width, height) for _ in range(len(theirs))], float)
    assert (ours[:, 0] + ours[:, 2] <= width).all() and (ours[:, 1] + ours[:, 3] <= height).all()

    def measures(boxes):
        left, top, w, h = boxes.T
        return {"area": w * h / (width * height), "aspect": w / h, "width": w, "height": h,
                "left": left / width, "top": top / height}

    mine, big_vision = measures(ours), measures(theirs)
    for name in mine:
        p = stats.ks_2samp(mine[name], big_vision[name]).pvalue
        assert p > 1e-3, (name, p)
    whole = lambda boxes: np.mean((boxes[:, 2] == width) & (boxes[:, 3] == height))  # noqa: E731
    assert abs(whole(ours) - whole(theirs)) < 0.02
    assert mine["area"].min() >= CROP_AREA[0] - 1e-6 and mine["area"].max() <= 1
    drawn = (ours[:, 2] < width) | (ours[:, 3] < height)  # not the whole-image fallback
    slack = 0.5 / ours[drawn, 3]  # width = round(height x ratio)
    aspect = mine["aspect"][drawn]
    assert (aspect >= CROP_RATIO[0] - slack).all() and (aspect <= CROP_RATIO[1] + slack).all()


def test_a_box_that_never_fits_is_the_whole_image():
    """A 3 x 200 strip: no box of 5-100% of its area has an aspect ratio in [0.75, 1.33] -- 100 attempts, then
    the whole image, as TensorFlow returns it."""
    assert inception_crop_box(np.random.default_rng(0), 3, 200) == (0, 0, 3, 200)
    draw = lambda seed: inception_crop_box(np.random.default_rng(seed), 400, 300)  # noqa: E731
    assert draw(3) == draw(3) and draw(3) != draw(4)


def test_read_image_is_big_visions_input_on_the_decoded_pixels(tmp_path, recorded):
    """read_image of a (lossless) PNG: training = resize_bilinear of the drawn box of the whole image, then the
    flip; evaluation = the shorter side by area, then the central crop -- the pixels of the ops above."""
    image = recorded["image_1"]
    path = tmp_path / "photo.png"
    Image.fromarray(image).save(path)
    rng = example_rng(1, 0, 0)
    left, top, w, h = inception_crop_box(rng, image.shape[1], image.shape[0])
    want = resize_bilinear(image[top:top + h, left:left + w], 32, 32)
    want = want[:, ::-1] if rng.integers(0, 2) else want
    np.testing.assert_array_equal(read_image(str(path), 32, rng=example_rng(1, 0, 0)), want)
    np.testing.assert_array_equal(read_image(str(path), 56, resize_small=64), recorded["central_crop_1_56"])


@pytest.mark.parametrize("call, match", [
    (lambda: resize_bilinear(np.zeros((4, 4), np.uint8), 2, 2), r"image of shape \(4, 4\) is not allowed"),
    (lambda: resize_area(np.zeros((4, 4, 3), np.uint8), 0, 2), r"size \(0, 2\) is not allowed"),
    (lambda: resize_small_size(4, 0, 2), "width=0, smaller=2 are not allowed"),
])
def test_bad_sizes_are_refused(call, match):
    with pytest.raises(ValueError, match=match):
        call()
