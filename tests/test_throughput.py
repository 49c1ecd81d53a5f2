"""moe_course.train.throughput: images/s -> TFLOP/s (3 x the analytic forward FLOPs) -> MFU."""

from __future__ import annotations

import pytest

from moe_course.analysis import flops_per_image
from moe_course.configs import get_preset
from moe_course.train.throughput import (
    device_family, format_throughput, peak_tflops, throughput_fields, training_flops_per_image)


@pytest.mark.parametrize("kind,family", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM"), ("NVIDIA H100 PCIe", "H100 PCIe"), ("NVIDIA H200", "H200"),
    ("NVIDIA A100-SXM4-80GB", "A100"), ("NVIDIA A100 80GB PCIe", "A100"), ("NVIDIA L4", "L4"), ("Tesla T4", "T4"),
    ("NVIDIA L40S", None), ("TPU v4", "TPU v4"), ("TPU v5 lite", "TPU v5e"), ("TPU v5p", "TPU v5p"),
    ("TPU v6 lite", "TPU v6e"), ("cpu", None),
])
def test_device_kinds_map_to_their_published_peaks(kind, family):
    assert device_family(kind) == family


def test_issue_table_row_and_mfu():
    # The issue's H200 measurement: deit-s/16 at 2,930 images/s in float32 is 81 TFLOP/s (shared count x 3).
    config = get_preset("vit", "deit-s/16")
    assert training_flops_per_image(config) == 3 * flops_per_image(config)
    fields = throughput_fields(config, 2930, "float32", "NVIDIA H200")
    assert fields["tflops_per_second"] == pytest.approx(81, abs=1)
    assert fields["mfu"] == pytest.approx(fields["tflops_per_second"] / 494.7)
    bf16 = throughput_fields(config, 7716, "bfloat16", "NVIDIA H100 80GB HBM3", num_devices=1)
    assert bf16["mfu"] == pytest.approx(bf16["tflops_per_second"] / 989.4)
    two = throughput_fields(config, 7716, "bfloat16", "NVIDIA H100 80GB HBM3", num_devices=2)
    assert two["mfu"] == pytest.approx(bf16["mfu"] / 2)
    assert format_throughput(2930, fields) == "2,930 img/s, 80.8 TFLOP/s, MFU 16.3%"  # of the TF32 peak


def test_unknown_device_or_unpublished_peak_gives_no_mfu():
    config = get_preset("vit", "digits-tiny")
    assert throughput_fields(config, 100.0, "float32", "cpu")["mfu"] is None
    assert peak_tflops("Tesla T4", "bfloat16") is None and peak_tflops("TPU v4", "float32") is None
    assert "MFU" not in format_throughput(100.0, throughput_fields(config, 100.0, "bfloat16", "TPU v4").copy()
                                          | {"mfu": None})


def test_bad_arguments_raise_naming_the_field():
    config = get_preset("vit", "digits-tiny")
    with pytest.raises(ValueError, match="dtype='float16' is not allowed"):
        throughput_fields(config, 1.0, "float16", "cpu")
    with pytest.raises(ValueError, match="images_per_second=-1"):
        throughput_fields(config, -1, "float32", "cpu")
    with pytest.raises(ValueError, match="num_devices=0"):
        throughput_fields(config, 1.0, "float32", "cpu", num_devices=0)


def test_auto_dtype_resolves_when_the_run_starts(tmp_path):
    import json

    from moe_course.train.precision import describe_precision, resolve_dtype

    tiny, paper = get_preset("vit", "digits-tiny"), get_preset("vit", "deit-ti/16")
    assert resolve_dtype("bfloat16", tiny) == ("bfloat16", "--dtype")
    assert resolve_dtype("auto", paper, backend="cpu")[0] == "float32"
    assert resolve_dtype("auto", tiny, backend="gpu")[0] == "float32"
    assert resolve_dtype("auto", paper, backend="gpu") == ("bfloat16", "auto: a paper-size model on gpu")
    assert resolve_dtype("auto", paper, backend="tpu")[0] == "bfloat16"
    # A resumed run keeps its dtype, so the checkpoint's config check still matches; older runs were float32.
    (tmp_path / "run.json").write_text(json.dumps({"model": {"family": "vit", "width": 192}}))
    assert resolve_dtype("auto", paper, workdir=tmp_path, backend="gpu")[0] == "float32"
    (tmp_path / "run.json").write_text(json.dumps({"model": {"family": "vit", "dtype": "bfloat16"}}))
    assert resolve_dtype("auto", tiny, workdir=tmp_path, backend="cpu")[0] == "bfloat16"
    with pytest.raises(ValueError, match="dtype='half' is not allowed"):
        resolve_dtype("half", tiny)
    line = describe_precision(paper.replace(dtype="bfloat16"), "auto: a paper-size model on gpu")
    assert line == ("precision: bfloat16 computation, float32 parameters and optimizer state "
                    "(auto: a paper-size model on gpu)")



def test_train_throughput_benchmark_help():
    # A full --quick run takes minutes (it compiles 8 JAX steps and 4 torch.compile graphs): recorded in
    # benchmarks/README.md, not run here.
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).parents[1] / "benchmarks" / "train_throughput.py"
    result = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=120,
                            cwd=script.parent)
    assert result.returncode == 0 and "--frameworks" in result.stdout, result.stderr[-2000:]
