"""big_vision's image resizes, in numpy: bilinear without antialias, area, and the shorter side to a length.

big_vision's ImageNet input resizes twice: the training crop to the model's side with ``tf.image.resize(...,
method="bilinear", antialias=False)`` (``pp/ops_image.py`` ``get_resize``, called by
``get_decode_jpeg_and_inception_crop``), and the evaluation image's shorter side to 256 by area
(``get_resize_small(smaller_size, method="area", antialias=False)`` and ``_resize_factor``). Each result is clipped
to [0, 255] and cast back to uint8, which truncates. PIL's ``BILINEAR`` widens its kernel when it shrinks (an
antialiased resize) and has no area resize, so both are written here after TensorFlow's CPU kernels
(``tensorflow/core/kernels/image/resize_bilinear_op.cc`` with ``half_pixel_centers=True``, and
``resize_area_op.cc``), in float32 and in their order of operations, so that the truncation to uint8 sees the
same floats. tests/test_resize.py compares them with TensorFlow's outputs recorded by tools/make_resize_fixtures.py.
"""

from __future__ import annotations

import numpy as np

_F32 = np.float32


def _check(image: np.ndarray, height: int, width: int) -> None:
    if image.ndim != 3 or min(image.shape) < 1:
        raise ValueError(f"image of shape {image.shape} is not allowed; use (height, width, channels), each >= 1")
    if height < 1 or width < 1:
        raise ValueError(f"size ({height}, {width}) is not allowed; use a height and width >= 1")


def _to_uint8(image: np.ndarray) -> np.ndarray:
    """big_vision's ``tf.cast(tf.clip_by_value(image, 0, 255), tf.uint8)``: clip, then truncate toward zero."""
    return np.clip(image, 0, 255).astype(np.uint8)


def _bilinear_taps(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(lower, upper, lerp) per output pixel: ``compute_interpolation_weights`` with the ``HalfPixelScaler``,
    in = (out + 0.5) * scale - 0.5 with scale = in_size / out_size, all float32."""
    scale = _F32(in_size) / _F32(out_size)
    position = (np.arange(out_size, dtype=_F32) + _F32(0.5)) * scale - _F32(0.5)
    floor = np.floor(position)
    lower = np.maximum(floor.astype(np.int64), 0)
    upper = np.minimum(np.ceil(position).astype(np.int64), in_size - 1)
    return lower, upper, position - floor


def resize_bilinear(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """``image`` (h, w, c) uint8 resized to (height, width, c) uint8 as big_vision's ``resize`` does it:
    ``tf.image.resize(image, (height, width), "bilinear", antialias=False)`` -- half-pixel centres, each output
    pixel from its 2 x 2 nearest input pixels however far it shrinks (no antialias) -- then clipped and truncated
    to uint8. Raises ValueError for an image that is not (h, w, c) or a size below 1.

    Source: big_vision ``pp/ops_image.py`` ``get_resize(size, method="bilinear", antialias=False)``; TensorFlow
    ``resize_bilinear_op.cc`` ``compute_lerp``: top = tl + (tr - tl) x, bottom = bl + (br - bl) x, out = top +
    (bottom - top) y, in float32.
    """
    _check(image, height, width)
    if image.shape[:2] == (height, width):
        return image.astype(np.uint8)
    channels = image.shape[2]
    rows = image.reshape(image.shape[0], -1)  # (h, w c): gathers and arithmetic along long rows
    y_lower, y_upper, y_lerp = _bilinear_taps(image.shape[0], height)
    x_lower, x_upper, x_lerp = (_columns(v, channels) for v in _bilinear_taps(image.shape[1], width))

    def along_x(lines: np.ndarray) -> np.ndarray:
        left = lines[:, x_lower].astype(_F32)
        return left + (lines[:, x_upper].astype(_F32) - left) * x_lerp

    top, bottom = along_x(rows[y_lower]), along_x(rows[y_upper])
    out = top + (bottom - top) * y_lerp[:, None]
    return _to_uint8(out).reshape(height, width, channels)


def _columns(per_pixel: np.ndarray, channels: int) -> np.ndarray:
    """A per-pixel column index (or weight) of an (h, w, c) image as the columns of its (h, w c) view: each
    index i becomes i c, i c + 1, ..., each weight repeats c times."""
    if per_pixel.dtype.kind == "f":
        return np.repeat(per_pixel, channels)
    return (per_pixel[:, None] * channels + np.arange(channels)).ravel()


def _area_taps(in_size: int, out_size: int) -> tuple[np.ndarray, np.ndarray, _F32]:
    """(indices (out, taps), weights (out, taps), float32 scale) of ``resize_area_op.cc``: output pixel o covers
    [o s, (o + 1) s) of the input with s = in_size / out_size; each input pixel it touches weighs the length it
    covers (whole pixels 1). Unused taps weigh 0 (their index clipped to the image)."""
    scale = _F32(in_size) / _F32(out_size)
    start_at = np.arange(out_size, dtype=_F32) * scale
    end_at = np.arange(1, out_size + 1, dtype=_F32) * scale
    start = np.floor(start_at).astype(np.int64)
    end = np.ceil(end_at).astype(np.int64)
    taps = int((end - start).max())
    cells = start[:, None] + np.arange(taps)[None, :]
    lo, hi = start_at[:, None], end_at[:, None]
    covered = np.where(cells < lo, np.where(cells + 1 > hi, scale, (cells + 1).astype(_F32) - lo),
                       np.where(cells + 1 > hi, hi - cells.astype(_F32), _F32(1.0)))
    weights = np.where(cells < end[:, None], covered, _F32(0.0)).astype(_F32)
    return np.clip(cells, 0, in_size - 1), weights, scale


def resize_area(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """``image`` (h, w, c) uint8 resized to (height, width, c) uint8 by area, as big_vision's ``resize_small``
    does it: ``tf.image.resize(image, (height, width), "area")`` -- each output pixel the average of the input
    pixels under it, weighted by the share of each that it covers -- then clipped and truncated to uint8. Raises
    ValueError for an image that is not (h, w, c) or a size below 1.

    Source: big_vision ``pp/ops_image.py`` ``get_resize_small(..., method="area", antialias=False)`` and
    ``_resize_factor``; TensorFlow ``resize_area_op.cc`` ``ComputePatchSumOf3Channels``: per input row, the first
    covered pixel times its share, plus the whole ones, plus the last times its share; then the rows the same way,
    times 1 / (height scale x width scale), in float32 and in that order.
    """
    _check(image, height, width)
    channels = image.shape[2]
    lines = image.reshape(image.shape[0], -1)  # (h, w c): gathers and arithmetic along long rows
    y_index, y_weight, y_scale = _area_taps(image.shape[0], height)
    x_index, x_weight, x_scale = _area_taps(image.shape[1], width)
    taps = [(_columns(x_index[:, tap], channels), _columns(x_weight[:, tap], channels))
            for tap in range(x_index.shape[1])]
    rows = lines[:, taps[0][0]] * taps[0][1]
    for columns, weights in taps[1:]:  # in TensorFlow's order; an unused tap adds an exact 0
        rows = rows + lines[:, columns] * weights
    total = rows[y_index[:, 0]] * y_weight[:, 0, None]
    for tap in range(1, y_index.shape[1]):
        total = total + rows[y_index[:, tap]] * y_weight[:, tap, None]
    scale = _F32(1.0 / np.float64(y_scale * x_scale))  # C++: float scale = 1.0 / (float * float), in double
    return _to_uint8(total * scale).reshape(height, width, channels)


def resize_small_size(height: int, width: int, smaller: int) -> tuple[int, int]:
    """The (height, width) that big_vision's ``resize_small(smaller)`` resizes a ``height`` x ``width`` image to:
    factor = smaller / min(height, width) in float32, each side round(side x factor), halves to even
    (``tf.round``). Raises ValueError for a side or ``smaller`` below 1.

    Source: big_vision ``pp/ops_image.py`` ``get_resize_small`` and ``_resize_factor``.
    """
    if min(height, width, smaller) < 1:
        raise ValueError(f"height={height}, width={width}, smaller={smaller} are not allowed; use integers >= 1")
    factor = _F32(smaller) / _F32(min(height, width))
    return int(np.rint(_F32(height) * factor)), int(np.rint(_F32(width) * factor))
