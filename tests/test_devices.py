"""A run says which devices it uses, and a paper-size model on a CPU gets a warning."""

import warnings

import jax
import pytest

from moe_course.configs import get_preset
from moe_course.train import PaperScaleOnCPUWarning, report_devices


def test_small_model_reports_devices_without_warning(capsys):
    with warnings.catch_warnings():
        warnings.simplefilter("error", PaperScaleOnCPUWarning)
        line = report_devices(get_preset("vit", "digits-tiny"))
    assert line in capsys.readouterr().out
    platform = jax.devices()[0].platform
    assert f"digits-tiny: 0.14M parameters on {len(jax.devices())} {platform} device" in line


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="the warning is for CPU-only machines")
def test_paper_size_model_on_cpu_warns():
    with pytest.warns(PaperScaleOnCPUWarning, match="deit-ti/16 has 5.7M parameters and JAX sees only CPU"):
        report_devices(get_preset("vit", "deit-ti/16"))
