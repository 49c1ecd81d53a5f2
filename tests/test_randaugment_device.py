"""RandAugment on the accelerator (moe_course.train.randaugment): every operation equals the input workers' kornia
operation on the same images and parameters, the whole of RandAugment has the workers' statistics, the draws are
N distinct operations per image with fair signs, and it runs inside the compiled training step. The comparisons
with kornia skip (by name) without it; the rest runs everywhere."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

from moe_course.data.randaugment import DEFAULT_POLICY, KORNIA_M, randaugment_policy
from moe_course.train.randaugment import (OPERATIONS, SYMMETRIC, apply_operation, draw_operations, equalize,
                                          magnitude_table, randaugment)

NO_KORNIA = "the workers' RandAugment runs on kornia and PyTorch: pip install -e '.[augment]' after a PyTorch wheel"


def _images(count: int, height: int = 32, width: int = 40, seed: int = 0) -> np.ndarray:
    """(count, height, width, 3) float32 photos in [0, 1]: smooth colours with grain (every level of a channel
    apart, so equalize and auto_contrast have work to do)."""
    rng = np.random.default_rng(seed)
    images = []
    for _ in range(count):
        low = rng.uniform(0, 255, (4, 5, 3)).astype(np.uint8)
        image = np.asarray(Image.fromarray(low).resize((width, height), Image.BICUBIC), np.float32) / 255
        images.append(np.clip(image + rng.normal(0, 0.05, image.shape), 0, 1))
    return np.stack(images).astype(np.float32)


def _kornia_one_operation(index: int, magnitude: float, images: np.ndarray, seed: int):
    """kornia's RandAugment restricted to operation ``index`` at M = ``magnitude``, as the workers build it
    (``randaugment_policy``): (outputs (n, H, W, 3), solarize_add's drawn thresholds or 0.5)."""
    torch = pytest.importorskip("torch", reason=NO_KORNIA)
    pytest.importorskip("kornia", reason=NO_KORNIA)
    from kornia.augmentation.auto import RandAugment

    torch.manual_seed(seed)
    module = RandAugment(1, KORNIA_M, policy=[randaugment_policy(magnitude)[index]])
    out = module(torch.tensor(images).permute(0, 3, 1, 2)).permute(0, 2, 3, 1).numpy()
    drawn = module._params[0].data[0].data
    thresholds = drawn["thresholds"].numpy() if OPERATIONS[index] == "solarize_add" else np.full(len(images), 0.5)
    return out, thresholds.astype(np.float32)


def test_the_policy_table_is_kornias_default_policy():
    pytest.importorskip("torch", reason=NO_KORNIA)
    pytest.importorskip("kornia", reason=NO_KORNIA)
    from kornia.augmentation.auto.rand_augment.rand_augment import default_policy

    assert [tuple(entry) for [entry] in default_policy] == [tuple(entry) for entry in DEFAULT_POLICY]


GEOMETRIC = ("rotate", "shear_x", "shear_y", "translate_x", "translate_y")
# One compiled function for every operation, magnitude and sign (all are traced): compiled once per image shape.
_APPLY = jax.jit(jax.vmap(apply_operation, in_axes=(0, None, None, 0)))


def _operation_errors(name: str, magnitude: float, images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(per image max |ours - kornia's|, kornia's output) for operation ``name`` at M = ``magnitude``, with the sign
    kornia drew (the symmetric operations: the nearer of +-, asserted far from the other) and, for solarize_add,
    the threshold kornia drew."""
    index = OPERATIONS.index(name)
    expected, thresholds = _kornia_one_operation(index, magnitude, images, seed=index)
    value = magnitude_table(magnitude)[index]
    errors = [np.abs(np.asarray(_APPLY(jnp.asarray(images), index, sign * value, jnp.asarray(thresholds)))
                     - expected).reshape(len(images), -1).max(axis=1) for sign in (1.0, -1.0)]
    if SYMMETRIC[index]:
        assert np.maximum(*errors).min() > 0.05  # each image: the wrong sign is another picture
        return np.minimum(*errors), expected
    return errors[0], expected


@pytest.mark.parametrize("magnitude", [3, 10, 20])  # not 5: the enhance factors are 1 there
@pytest.mark.parametrize("name", OPERATIONS)
def test_each_operation_equals_the_workers_kornia_operation(name, magnitude):
    """Same 32 x 40 images, same magnitude: kornia's output and ours agree to float rounding for every image --
    2e-6 for the photometric operations, 2e-5 for the geometric ones (measured: up to 4.8e-7, sharpness at M = 20,
    and 7.6e-6, shear), whose bilinear sample coordinates carry the float32 rounding of pixel positions."""
    images = _images(6)
    errors, expected = _operation_errors(name, magnitude, images)
    assert errors.max() < (2e-5 if name in GEOMETRIC else 2e-6), (name, errors)
    assert np.abs(expected - images).mean() > 1e-3  # the operation did something to compare


@pytest.mark.parametrize("name", GEOMETRIC)
def test_the_geometric_operations_equal_kornias_at_224_px(name):
    """At the training side, 224 px, the float32 rounding of sample coordinates up to 223 px grows with the side:
    the geometric operations agree with kornia's to 1e-4 (measured on 16 images at M = 3, 10 and 20: up to 4.6e-5,
    rotate; shear 4.5e-5; translate 1.6e-5); the photometric ones stay within 2e-6 (measured 6e-7)."""
    errors, _ = _operation_errors(name, 20, _images(2, 224, 224, seed=5))
    assert errors.max() < 1e-4, (name, errors)


def _equalize_levels(levels: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """equalize of (n, H, W, 3) uint8 ``levels`` as images k / 255, by the device (ours), kornia and PIL
    (``ImageOps.equalize``), each as 8-bit levels (n, H, W, 3) int, plus ours as floats."""
    torch = pytest.importorskip("torch", reason=NO_KORNIA)
    kornia = pytest.importorskip("kornia", reason=NO_KORNIA)
    from PIL import ImageOps

    images = levels.astype(np.float32) / 255
    ours = np.asarray(jax.jit(jax.vmap(equalize))(jnp.asarray(images)))
    theirs = kornia.enhance.equalize(torch.tensor(images).permute(0, 3, 1, 2)).permute(0, 2, 3, 1).numpy()
    pil = np.stack([np.asarray(ImageOps.equalize(Image.fromarray(image))) for image in levels])
    return ours, theirs, pil.astype(int)


def _exact_multiples_plane(step: int, pixels: int, rng: np.random.Generator) -> np.ndarray:
    """(pixels,) uint8 levels whose equalize look-up table has step ``step`` and lands on an exact multiple of it
    at every level present below the top: level 0 holds ceil(step / 2) pixels, then 200 levels step or 2 step
    pixels each (255 steps in all), the rest of the pixels at level 255; shuffled."""
    counts = np.zeros(256, int)
    counts[0] = step - step // 2
    middle = np.sort(rng.choice(np.arange(1, 255), 200, replace=False))
    counts[middle] = step * np.where(np.arange(200) < 55, 2, 1)
    counts[255] = pixels - counts.sum()
    assert counts[255] > 0 and (counts.sum() - counts[255]) // 255 == step  # PIL's step
    return rng.permutation(np.repeat(np.arange(256), counts)).astype(np.uint8)


def test_equalize_of_uint8_level_images_equals_kornias_and_pils_to_the_level():
    """Images whose values are k / 255 (what the device gets from uint8 batches): the same 8-bit level as PIL's
    integer algorithm and kornia's for every pixel. One image is built so that the look-up table's quotient
    (pixels below the level + step // 2) / step is a whole number at every level (steps 41, 47 and 61, where a
    float32 quotient taken as a product with the reciprocal falls below it: 243 x 47 / 47 -> 242.99998); two are
    photos."""
    rng = np.random.default_rng(0)
    built = np.stack([_exact_multiples_plane(step, 128 * 128, rng) for step in (41, 47, 61)], axis=-1)
    photos = np.round(_images(2, 128, 128, seed=3) * 255).astype(np.uint8)
    levels = np.concatenate([built.reshape(1, 128, 128, 3), photos])
    ours, theirs, pil = _equalize_levels(levels)
    np.testing.assert_array_equal(np.round(ours * 255).astype(int), pil)
    np.testing.assert_array_equal(np.round(theirs * 255).astype(int), pil)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-7)  # the same level / 255, to one float32 ulp
    assert len(np.unique(pil[0, ..., 0])) > 150 and (pil != levels).mean() > 0.5  # equalize moved the levels


def _statistics(before: np.ndarray, after: np.ndarray) -> dict[str, float]:
    change = np.abs(after - before).reshape(len(before), -1).mean(axis=1)
    return {"mean |change| per image": change.mean(), "share of images changed by > 0.1": (change > 0.1).mean(),
            "mean pixel": after.mean(), "pixel std": after.std(), "share of black pixels": (after < 1 / 255).mean()}


def test_randaugment_2_10_has_the_statistics_of_the_workers_randaugment():
    """RandAugment (2, 10) of 384 images, by the workers (kornia, each image its own seed, rounded to uint8) and
    on the device (one key): the same distribution of changes, means within 0.03 (about 3 standard errors)."""
    pytest.importorskip("torch", reason=NO_KORNIA)
    pytest.importorskip("kornia", reason=NO_KORNIA)
    from moe_course.data.randaugment import apply_randaugment

    images = np.round(_images(384, 24, 24, seed=1) * 255) / 255
    uint8 = (images * 255).astype(np.uint8)
    workers = np.stack([apply_randaugment(image, (2, 10), seed=0, epoch=0, index=i) for i, image in enumerate(uint8)])
    device = np.asarray(jax.jit(lambda k, x: randaugment(k, x, n=2, magnitude=10))(jax.random.key(0), images))
    ours, theirs = _statistics(images, np.round(device * 255) / 255), _statistics(images, workers / 255)
    for statistic, value in theirs.items():
        assert abs(ours[statistic] - value) < 0.03, (statistic, ours, theirs)


def test_each_image_draws_n_distinct_operations_fairly():
    order, signs, thresholds = (np.asarray(a) for a in draw_operations(jax.random.key(3), 6000, 2))
    assert order.shape == signs.shape == thresholds.shape == (6000, 2) and order.dtype == np.int32
    assert (order[:, 0] != order[:, 1]).all()
    counts = np.bincount(order.ravel(), minlength=len(OPERATIONS))  # 800 each expected; sd about 27
    assert counts.min() > 700 and counts.max() < 900, counts
    assert set(np.unique(signs)) == {-1.0, 1.0} and abs(signs.mean()) < 0.05
    assert 0 <= thresholds.min() and thresholds.max() < 1 and abs(thresholds.mean() - 0.5) < 0.02
    all15 = np.asarray(draw_operations(jax.random.key(4), 5, 15)[0])
    assert (np.sort(all15, axis=1) == np.arange(15)).all()


def test_the_batch_is_augmented_per_image_and_deterministically():
    images = jnp.asarray(_images(8, 24, 24))
    run = jax.jit(lambda k, x: randaugment(k, x, n=2, magnitude=10))
    one = np.asarray(run(jax.random.key(0), images))
    assert one.shape == (8, 24, 24, 3) and one.dtype == np.float32 and 0 <= one.min() and one.max() <= 1
    np.testing.assert_array_equal(one, np.asarray(run(jax.random.key(0), images)))
    assert not np.array_equal(one, np.asarray(run(jax.random.key(1), images)))
    changed = np.abs(one - np.asarray(images)).reshape(8, -1).max(axis=1) > 1e-3
    assert changed.sum() >= 7  # (nearly) every image changed; solarize at 1.0 may leave one as it was


@pytest.mark.parametrize("shape", [(24, 24, 3), (2, 24, 24, 1), (2, 2, 24, 3)])
def test_bad_images_and_settings_are_refused(shape):
    with pytest.raises(ValueError, match=r"images of shape .* are not allowed; use \(batch, H, W, 3\)"):
        randaugment(jax.random.key(0), jnp.zeros(shape), n=2, magnitude=10)
    with pytest.raises(ValueError, match=r"^randaugment=\(0, 10\) is not allowed"):
        randaugment(jax.random.key(0), jnp.zeros((2, 24, 24, 3)), n=0, magnitude=10)


def test_the_train_step_augments_before_it_computes_the_loss(tiny_vit_config):
    """The compiled step with RandAugment sees other pixels than without (another gradient, so other updated
    parameters, from the same model and batch; the loss alone is ln 4 whatever the pixels, the head starting at
    zero), and the same ones for the same key."""
    import optax
    from flax import nnx

    from moe_course.models import build_model
    from moe_course.train.steps import make_train_step

    config = tiny_vit_config.replace(channels=3, num_classes=4)
    graphdef, params, rest = nnx.split(build_model(config, rngs=nnx.Rngs(0)), nnx.Param, ...)
    tx = optax.sgd(1.0)
    batch = {"image": jnp.asarray((_images(4, config.image_size, config.image_size) * 255).astype(np.uint8)),
             "label": jnp.arange(4, dtype=jnp.int32)}
    updated = {}
    for name, setting in (("plain", None), ("augmented", (2, 10))):
        step = make_train_step(graphdef, tx, randaugment=setting, num_classes=4)
        updated[name] = [np.concatenate([np.ravel(leaf) for leaf in jax.tree.leaves(
            step(params, rest, tx.init(params), batch, jax.random.key(k))[0])]) for k in (0, 0, 1)]
    plain, augmented = updated["plain"], updated["augmented"]
    np.testing.assert_array_equal(plain[0], plain[2])  # a ViT without dropout: the key is not used
    np.testing.assert_array_equal(augmented[0], augmented[1])
    assert not np.array_equal(augmented[0], augmented[2]) and not np.array_equal(augmented[0], plain[0])
