"""RandAugment (N, M) for the image folders' training batches, from kornia, drawn from each example's seed.

RandAugment (Cubuk et al. 2020, "RandAugment: Practical automated data augmentation with a reduced search space",
Sec. 3) applies N operations drawn at random from a fixed list, all at one magnitude M. V-MoE trains on it after
the Inception crop and flip (Riquelme et al. 2021, "Scaling Vision with Sparse Mixture of Experts", appendix on
ImageNet-21k pre-training; google-research/vmoe ``configs/vmoe_paper``: ``randaug(2, 10)`` for ILSVRC2012
"light1", ``randaug(2, 20)`` for the released ImageNet-21k run), on the scale of TensorFlow's ``autoaugment.py``
(big_vision ``pp/autoaugment.py``): M = 10 is ``_MAX_LEVEL``, the end of every operation's range (rotate 30
degrees, ...), and larger M extrapolates.

The operations are kornia's (``kornia.augmentation.auto.RandAugment`` and its ``default_policy``, kornia >= 0.9):
kornia draws N distinct operations and sets each one's magnitude from its range ``(low, high)`` and kornia's own
``m`` in (0, 30): ``low + (high - low) * m / 30`` (symmetric operations: a range ``(-high, high)``, magnitude
``high * m / 30`` with a random sign). kornia's scale cannot reach M = 10 (m = 30 is refused) and its ranges may
not be widened past per-operation bounds (solarize <= 1, ...), so the module is built for one M: kornia's
``policy`` argument gets, for each default operation, the range whose value at kornia's ``m = 15`` is the
operation's magnitude at M (``operation_magnitudes``): ``low + (high - low) * M / 10`` over kornia's default range
(posterize ``high - (high - low) * M / 10`` bits, kornia's direction), i.e. kornia's own formula with m = 3 M,
exact at every M. Two exceptions: shear uses TensorFlow's magnitude (a shear factor of 0.03 M, 16.7 degrees at
M = 10) because kornia's default range means 0.3 * 180 = 54 degrees at M = 10 and passes 90 degrees from M = 16.7
on; and magnitudes held at kornia's limits beyond M = 10 (``LIMITS``). How kornia's operations differ from
TensorFlow's: docs/data.md, "RandAugment".
"""

from __future__ import annotations

import functools
import math
import numbers

import numpy as np

NUM_OPERATIONS = 15  # kornia's default_policy (TensorFlow's 16 without Cutout); tests/test_randaugment.py checks
MAX_MAGNITUDE = 20.0  # M in (0, MAX_MAGNITUDE]: AugReg's and vmoe's "strong" recipes use 20
KORNIA_M = 15  # kornia's m: every range below is chosen so that its value at m = 15 is the magnitude at M
LIMITS = {"solarize": (0.0, 1.0), "solarize_add": (-0.5, 0.5), "brightness": (0.0, 2.0), "posterize": (1.0, 8.0)}
# kornia refuses ranges outside the first three (RandomSolarize, RandomBrightness); posterize is held at 1 bit
# at least (kornia's 0 bits, from M = 17.5 on, would turn the image black).
TF_SHEAR_PER_LEVEL = 0.03  # TensorFlow's shear factor per level (0.3 at _MAX_LEVEL = 10)
INSTALL = ('install PyTorch as the README\'s Install table says for your machine (CPU-only Linux: pip install '
           '"torch>=2.3,<2.16" --index-url https://download.pytorch.org/whl/cpu), then pip install -e ".[augment]"')
# kornia's default_policy (kornia.augmentation.auto.rand_augment.rand_augment, kornia 0.9-0.10), in its order: the
# operations and their (low, high) ranges; tests/test_randaugment.py checks it against kornia where kornia is.
# Kept here so that the magnitudes, and RandAugment on the accelerator (train.randaugment), need no kornia.
DEFAULT_POLICY = (("auto_contrast", 0, 1), ("equalize", 0, 1), ("invert", 0, 1), ("rotate", -30.0, 30.0),
                  ("posterize", 4.0, 8.0), ("solarize", 0.0, 1.0), ("solarize_add", 0.0, 0.43),
                  ("color", 0.1, 1.9), ("contrast", 0.1, 1.9), ("brightness", 0.1, 1.9), ("sharpness", 0.1, 1.9),
                  ("shear_x", -0.3, 0.3), ("shear_y", -0.3, 0.3), ("translate_x", -0.1, 0.1),
                  ("translate_y", -0.1, 0.1))
WITHOUT_MAGNITUDE = ("auto_contrast", "equalize", "invert")
_SEED_TAG = 0x2A6  # the fourth word of the example's seed, apart from the crop's (augment.example_rng: 0xA06)


class RandAugmentUnavailable(ImportError, ValueError):
    """PyTorch or kornia is missing: RandAugment cannot run. A ValueError too, so that ``moe-course train``
    reports it in one line before anything is built."""


def check_randaugment(value) -> tuple[int, float]:
    """``value`` = (N, M) as (int N, float M); ValueError naming randaugment, the value and what is allowed unless
    N is an integer in [1, ``NUM_OPERATIONS``] and M a number in (0, ``MAX_MAGNITUDE``]. Needs neither torch nor
    kornia."""
    allowed = (f"use (N, M) with N an integer in [1, {NUM_OPERATIONS}] (operations per image) and M a number in "
               f"(0, {MAX_MAGNITUDE:g}] (magnitude, TensorFlow's scale: 10 = each operation's full range)")
    try:
        n, m = value
    except (TypeError, ValueError):
        raise ValueError(f"randaugment={value!r} is not allowed; {allowed}") from None
    n_ok = isinstance(n, numbers.Integral) and not isinstance(n, bool) and 1 <= n <= NUM_OPERATIONS
    m_ok = (isinstance(m, numbers.Real) and not isinstance(m, bool) and math.isfinite(m)
            and 0 < m <= MAX_MAGNITUDE)
    if not (n_ok and m_ok):
        raise ValueError(f"randaugment={format_randaugment(value)} is not allowed; {allowed}")
    return int(n), float(m)


def format_randaugment(value) -> str:
    """``value`` as error messages show it: "(2, 10)" for a pair (floats as %g), its repr otherwise."""
    try:
        return "(" + ", ".join(f"{x:g}" if isinstance(x, float) else repr(x) for x in value) + ")"
    except TypeError:
        return repr(value)


def operation_magnitudes(magnitude: float) -> dict[str, float]:
    """{kornia operation name: its magnitude at M = ``magnitude``} for the 12 operations of kornia's
    ``default_policy`` that have one (auto_contrast, equalize and invert have none).

    Units are kornia's: rotate in degrees, shear in kornia's unit (x 180 = degrees), translate as a fraction of the
    image side, posterize in bits kept, solarize / solarize_add on [0, 1] pixels, the enhance factors (color,
    contrast, brightness, sharpness) 1 = unchanged. Symmetric operations (rotate, shear, translate) get a random
    sign per image. Needs neither torch nor kornia (kornia's ranges are ``DEFAULT_POLICY``).
    """
    magnitudes = {}
    for name, low, high in DEFAULT_POLICY:
        if name in WITHOUT_MAGNITUDE:
            continue
        if name in ("shear_x", "shear_y"):  # TensorFlow's shear factor, as kornia's angle / 180
            value = math.degrees(math.atan(TF_SHEAR_PER_LEVEL * magnitude)) / 180
        elif name == "posterize":  # kornia's direction: fewer bits as M grows
            value = math.floor(high - (high - low) * magnitude / 10 + 1e-9)
        elif low == -high:
            value = high * magnitude / 10
        else:
            value = low + (high - low) * magnitude / 10
        lo, hi = LIMITS.get(name, (-math.inf, math.inf))
        magnitudes[name] = float(min(max(value, lo), hi))
    return magnitudes


def randaugment_policy(magnitude: float) -> list:
    """kornia's ``default_policy`` re-expressed for M = ``magnitude`` at kornia's m = ``KORNIA_M``: each operation
    with a magnitude gets the range ``(v, v)`` (kornia's value at any m is v) or, where kornia asks for a symmetric
    range, ``(-2 v, 2 v)`` (value 2 v * 15 / 30 = v), v = ``operation_magnitudes(magnitude)[name]``."""
    magnitudes = operation_magnitudes(magnitude)
    policy = []
    for name, low, high in DEFAULT_POLICY:
        if name not in magnitudes:
            policy.append([(name, low, high)])
        elif low == -high:
            policy.append([(name, -magnitudes[name] * 30 / KORNIA_M, magnitudes[name] * 30 / KORNIA_M)])
        else:
            policy.append([(name, magnitudes[name], magnitudes[name])])
    return policy


def _kornia():
    """kornia's RandAugment class; RandAugmentUnavailable when torch or kornia is missing."""
    try:
        import torch  # noqa: F401
        from kornia.augmentation.auto import RandAugment
    except ImportError as err:
        raise RandAugmentUnavailable(f"RandAugment needs PyTorch and kornia ({err}); {INSTALL}") from err
    return RandAugment


@functools.lru_cache(maxsize=None)
def randaugment_module(n: int, magnitude: float):
    """The kornia ``RandAugment`` module of (N, M) = (``n``, ``magnitude``), built once per process (cached); in a
    worker process (one started by ``multiprocessing``, as Grain's are) torch is set to one thread. Raises
    ValueError for a bad (N, M) and RandAugmentUnavailable (naming randaugment and the install lines) when torch
    or kornia is missing."""
    n, magnitude = check_randaugment((n, magnitude))
    try:
        RandAugment = _kornia()
    except RandAugmentUnavailable as err:
        raise RandAugmentUnavailable(f"randaugment={format_randaugment((n, magnitude))} needs PyTorch and kornia "
                                     f"({err.__cause__}); {INSTALL}") from err.__cause__
    import multiprocessing

    import torch

    if multiprocessing.parent_process() is not None:  # a worker process (Grain's): one thread, as PyTorch's
        torch.set_num_threads(1)  # DataLoader sets in its workers; the processes are the parallelism
    return RandAugment(n, KORNIA_M, policy=randaugment_policy(magnitude))


def torch_seed(seed: int, epoch: int, index: int) -> int:
    """The torch seed of one training example's RandAugment draws: a function of (seed, epoch, index) only, from a
    generator apart from the crop's (``augment.example_rng``)."""
    return int(np.random.default_rng([seed, epoch, index, _SEED_TAG]).integers(0, 2**63))


def apply_randaugment(image: np.ndarray, randaugment: tuple[int, float], *, seed: int, epoch: int, index: int
                      ) -> np.ndarray:
    """RandAugment (N, M) = ``randaugment`` of one image: (S, S, 3) uint8 in, (S, S, 3) uint8 out.

    Deterministic: the draws (which N operations, their signs) come from ``torch_seed(seed, epoch, index)``, set
    inside ``torch.random.fork_rng`` so the process's global torch generator is left as it was (for the calling
    thread: kornia draws from that global generator, so another thread drawing from it at the same moment would
    see these draws). The image goes to kornia as (1, 3, S, S) float32 in [0, 1] and comes back rounded and
    clipped to uint8. In a worker process torch runs on one thread (``randaugment_module``). Raises as
    ``randaugment_module``.
    """
    module = randaugment_module(*randaugment)
    import torch

    with torch.random.fork_rng(devices=[]), torch.inference_mode():
        torch.manual_seed(torch_seed(seed, epoch, index))
        pixels = torch.tensor(image, dtype=torch.float32).permute(2, 0, 1)[None].div_(255.0)
        out = module(pixels)[0].permute(1, 2, 0).mul_(255.0).round_().clamp_(0, 255)
    return out.to(torch.uint8).numpy()
