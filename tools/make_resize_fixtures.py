"""Record big_vision's own image resizes as the fixture of tests/test_resize.py.

Runs the preprocessing ops of a google-research/big_vision checkout (``big_vision.pp.ops_image``: ``resize``,
bilinear without antialias, as ``decode_jpeg_and_inception_crop`` calls it; ``resize_small``, by area;
``central_crop``) on a few uint8 images made here from a fixed seed (smooth colours with grain, flat blocks, a flat
image), and writes them with the outputs to ``--out`` (default
tests/fixtures/resize/big_vision_resize.npz): ``image_<i>`` (h, w, 3) uint8, and per case ``<op>_<i>_<h>x<w>``
(uint8, what big_vision's op returned; ``resize``: to (h, w); ``resize_small``: the shorter side to h) for the
sizes in ``CASES``, and ``central_crop_1_56``, ``central_crop(56)`` of ``resize_small_1_64``. Also
``boxes_<w>x<h>`` (n, 4) int16: (left, top, width, height) of the boxes that big_vision's
``decode_jpeg_and_inception_crop()`` cut from a ``w`` x ``h`` JPEG in ``BOX_DRAWS`` calls (TensorFlow's
``sample_distorted_bounding_box``, recorded as the op calls it, with the op's default arguments).

    python tools/make_resize_fixtures.py --big-vision PATH [--out FILE]

Needs TensorFlow (any 2.x; the recorded fixture was made with tensorflow-cpu 2.21.0) and numpy; PATH is a
checkout of google-research/big_vision, whose ``pp`` package imports nothing beyond TensorFlow.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
# image index: its (height, width); and the sizes each op resizes it to
IMAGES = {0: (61, 83), 1: (90, 120), 2: (48, 40), 3: (12, 20)}
CASES = {
    "resize": {0: [(32, 32), (17, 45), (70, 90)], 1: [(112, 112), (37, 61)], 2: [(32, 32), (48, 40)]},
    "resize_small": {0: [32, 60], 1: [64, 100], 2: [17, 96], 3: [8]},
}
BOX_IMAGES, BOX_DRAWS = [(500, 375), (64, 480)], 4000  # (width, height): an ImageNet-like photo, a thin strip


def make_image(index: int, height: int, width: int) -> np.ndarray:
    """(height, width, 3) uint8 from seed ``index``: smooth colours with grain; image 2 is flat 4 x 4 blocks, image
    3 flat level 80 (where area resizing leaves some pixels at 79)."""
    rng = np.random.default_rng(index)
    if index == 3:
        return np.full((height, width, 3), 80, np.uint8)
    if index == 2:
        blocks = rng.integers(0, 256, (height // 4, width // 4, 3), dtype=np.uint8)
        return np.repeat(np.repeat(blocks, 4, axis=0), 4, axis=1)
    ys, xs = np.mgrid[0:height, 0:width] / max(height, width)
    phase = rng.uniform(0, 2 * np.pi, 3)
    smooth = 127.5 + 100 * np.sin(6 * xs[..., None] + 4 * ys[..., None] + phase)
    return np.clip(smooth + rng.normal(0, 20, smooth.shape), 0, 255).astype(np.uint8)


def record_boxes(tf, ops_image, width: int, height: int) -> np.ndarray:
    """(BOX_DRAWS, 4) int16 boxes of big_vision's ``decode_jpeg_and_inception_crop()`` on a ``width`` x ``height``
    JPEG: its ``tf.image.sample_distorted_bounding_box`` call is wrapped to keep what it returned."""
    boxes = []
    sample = tf.image.sample_distorted_bounding_box

    def recording(*args, **kwargs):
        begin, size, bbox = sample(*args, **kwargs)
        boxes.append([int(begin[1]), int(begin[0]), int(size[1]), int(size[0])])
        return begin, size, bbox

    jpeg = tf.io.encode_jpeg(tf.constant(make_image(0, height, width)))
    crop = ops_image.get_decode_jpeg_and_inception_crop()
    tf.random.set_seed(0)
    tf.image.sample_distorted_bounding_box = recording
    try:
        for _ in range(BOX_DRAWS):
            crop({"image": jpeg})
    finally:
        tf.image.sample_distorted_bounding_box = sample
    return np.asarray(boxes, np.int16)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--big-vision", type=Path, required=True, help="checkout of google-research/big_vision")
    parser.add_argument("--out", type=Path, default=ROOT / "tests/fixtures/resize/big_vision_resize.npz")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(args.big_vision))
    import tensorflow as tf
    from big_vision.pp import ops_image

    arrays = {}
    for index, (height, width) in IMAGES.items():
        image = make_image(index, height, width)
        arrays[f"image_{index}"] = image
        for op, sizes in CASES.items():
            for size in sizes.get(index, []):
                out = getattr(ops_image, f"get_{op}")(size)({"image": tf.constant(image)})["image"].numpy()
                arrays[f"{op}_{index}_{'x'.join(map(str, np.atleast_1d(size)))}"] = out
    crop = ops_image.get_central_crop(56)({"image": tf.constant(arrays["resize_small_1_64"])})["image"]
    arrays["central_crop_1_56"] = crop.numpy()
    for width, height in BOX_IMAGES:
        arrays[f"boxes_{width}x{height}"] = record_boxes(tf, ops_image, width, height)
    arrays["tensorflow_version"] = np.array(tf.__version__)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, **arrays)
    print(f"wrote {len(arrays)} arrays to {args.out}")


if __name__ == "__main__":
    main()
