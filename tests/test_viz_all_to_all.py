"""moe_course.viz.show_all_to_all: the devices x experts picture of chapter 7's all-to-all."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from moe_course.viz import show_all_to_all  # noqa: E402
from moe_course.viz.all_to_all import ABSENT, EMPTY  # noqa: E402


def _stages():
    """2 devices, 4 experts (2 per device), B = 2: device 0's tokens fill expert 0 and half of expert 2."""
    before = np.full((2, 4, 2), EMPTY)
    before[0, 0] = 0
    before[0, 2, 0] = 0
    before[1, 1] = 1
    after = np.full((2, 4, 4), ABSENT)  # device j holds experts 2j, 2j + 1, two sources x B slots each
    after[0, :2] = np.concatenate([before[0, :2], before[1, :2]], axis=-1)
    after[1, 2:] = np.concatenate([before[0, 2:], before[1, 2:]], axis=-1)
    home = np.array([[1, 1, 0, 0], [0, 0, 1, 1]], bool)
    return {"before": before, "after": after, "after the experts": after}, home


def test_draws_one_panel_per_stage_with_counts_outlines_and_hatching():
    stages, home = _stages()
    fig = show_all_to_all(stages, home=home, outputs=["after the experts"], device_names=["d0", "d1"])
    axes = fig.axes
    assert [ax.get_title(loc="left") for ax in axes] == list(stages)
    texts = [t.get_text() for t in axes[0].texts]
    assert texts.count("2/2") == 2 and "1/2" in texts and texts.count("0/2") == 5  # every cell holds B slots
    assert sorted(t.get_text() for t in axes[1].texts) == ["0/4", "1/4", "2/4", "2/4"]  # home cells only
    outlined = [p for p in axes[1].patches if p.get_linewidth() == 1.4]
    assert len(outlined) == int(home.sum())
    assert sum(bool(p.get_hatch()) for p in axes[2].patches) == 3 and not any(p.get_hatch() for p in axes[1].patches)
    image = axes[1].images[0].get_array()  # colours: white for empty, grey where the device holds no slot
    assert image.shape == (2, 16, 4) and np.allclose(image[1, 0], matplotlib.colors.to_rgba("0.88"))
    assert [t.get_text() for t in axes[0].get_yticklabels()] == ["d0", "d1"]
    plt.close(fig)


@pytest.mark.parametrize("change, message", [
    (lambda s: s.update(before=np.zeros((2, 4))), "expected \\(2, 4, slots\\)"),
    (lambda s: s.update(before=np.full((2, 4, 2), 2)), "outside -2..1"),
    (lambda s: s.update(after=np.full((3, 4, 2), EMPTY)), "stages\\['after'\\] has shape"),
])
def test_bad_stages_are_refused_naming_the_panel(change, message):
    stages, _ = _stages()
    change(stages)
    with pytest.raises(ValueError, match=message):
        show_all_to_all(stages)


def test_bad_options_are_refused():
    stages, home = _stages()
    with pytest.raises(ValueError, match="home has shape"):
        show_all_to_all(stages, home=home[:, :2])
    with pytest.raises(ValueError, match="device_names has 1"):
        show_all_to_all(stages, device_names=["d0"])
    with pytest.raises(ValueError, match="outputs names \\['later'\\]"):
        show_all_to_all(stages, outputs=["later"])
    with pytest.raises(ValueError, match="stages is empty"):
        show_all_to_all({})
