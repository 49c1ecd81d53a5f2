import pytest

from moe_course.configs import ViTConfig
from moe_course.data import ClutteredDigits, DigitsConfig


@pytest.fixture(scope="session")
def small_digits():
    """A small, fast variant of the embedded dataset: 16x16 canvases, 8/3/3 glyphs per class."""
    return ClutteredDigits(DigitsConfig(image_size=16, digit_size=(8, 12), glyphs_per_class=(8, 3, 3), eval_copies=1))


@pytest.fixture(scope="session")
def tiny_vit_config():
    return ViTConfig(name="test-tiny", image_size=16, patch_size=4, channels=1, width=16, depth=2, heads=2,
                     mlp_dim=32, num_classes=10, pool="gap")
