"""Training throughput as the field reports it: images/s -> achieved TFLOP/s -> model FLOPs utilisation (MFU).

Achieved FLOP/s = images/s x training FLOPs per image, the training FLOPs being 3 x the shared analytic forward
count (``moe_course.analysis.flops_per_image``: the forward pass, then two products per weight in the backward
pass; Kaplan et al. 2020, Sec. 2.1; PaLM, Chowdhery et al. 2022, App. B, defines MFU this way). MFU = achieved
FLOP/s / the devices' published dense peak for the computation dtype (MaxText prints TFLOP/s per device in
every step log the same way). Routed models count the FLOPs their experts really run (capacity buffers, full
or empty), so a V-MoE's MFU is comparable with its dense backbone's.

The peaks are dense (no 2:4 structured sparsity) tensor-core / MXU numbers per device, from the vendors' data
sheets:
- NVIDIA H100 Tensor Core GPU data sheet (H100 SXM: BF16 989 TFLOPS, TF32 495; H100 PCIe: 756 and 378);
- NVIDIA H200 Tensor Core GPU data sheet (H200 SXM: BF16 989, TF32 495 -- the H100 SXM's compute);
- NVIDIA A100 Tensor Core GPU data sheet (BF16 312, TF32 156);
- NVIDIA L4 Tensor Core GPU data sheet (BF16 121, TF32 60);
- NVIDIA T4 Tensor Core GPU data sheet (FP32 8.1; no bfloat16 tensor cores: no bfloat16 peak);
- Google Cloud TPU system architecture pages (bf16 per chip: v3 123, v4 275, v5e 197, v5p 459, v6e (Trillium)
  918; per device, a v3 device being one of its chip's two TensorCores; no float32 peak is published: XLA runs
  float32 matmuls as bfloat16 passes there). The TPU rows come from ``parallel.chips.TPU_CHIPS``.
The float32 entry of an NVIDIA GPU with tensor cores is its TF32 peak: XLA's default matmul precision runs
float32 products on TF32 tensor cores (PyTorch does with ``torch.set_float32_matmul_precision("high")``; at its
default "highest" a float32 MFU against this peak reads low).
"""

from __future__ import annotations

import re

from moe_course.analysis.flops import flops_per_image
from moe_course.parallel.chips import TPU_CHIPS

TRAINING_FLOPS_PER_FORWARD = 3
DTYPES = ("bfloat16", "float32")

# device family -> {dtype: dense peak TFLOP/s per device, or None where none is published}
PEAK_TFLOPS: dict[str, dict[str, float | None]] = {
    "H100 SXM": {"bfloat16": 989.4, "float32": 494.7},
    "H100 PCIe": {"bfloat16": 756.0, "float32": 378.0},
    "H200": {"bfloat16": 989.4, "float32": 494.7},
    "A100": {"bfloat16": 312.0, "float32": 156.0},
    "L4": {"bfloat16": 121.0, "float32": 60.0},
    "T4": {"bfloat16": None, "float32": 8.1},
    **{chip.family: {"bfloat16": chip.device_peak_flops / 1e12, "float32": None} for chip in TPU_CHIPS.values()},
}

# (pattern on the lower-cased device kind, family), first match wins. The kinds as JAX's ``Device.device_kind``
# and ``torch.cuda.get_device_name`` spell them, e.g. "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB",
# "Tesla T4", "TPU v5 lite" (v5e), "TPU v6 lite" (v6e).
_KINDS = (
    (r"h200", "H200"),
    (r"h100.*pcie", "H100 PCIe"),
    (r"h100", "H100 SXM"),
    (r"a100", "A100"),
    (r"\bl4\b", "L4"),
    (r"\bt4\b", "T4"),
    (r"tpu v3", "TPU v3"),
    (r"tpu v4", "TPU v4"),
    (r"tpu v5 ?(lite|e)\b", "TPU v5e"),
    (r"tpu v5", "TPU v5p"),
    (r"tpu v6", "TPU v6e"),
)


def device_kind(device) -> str:
    """The kind of ``device``: a string as given, else its ``device_kind`` (a JAX device), else ``str(device)``."""
    return device if isinstance(device, str) else str(getattr(device, "device_kind", device))


def device_family(device) -> str | None:
    """The ``PEAK_TFLOPS`` family of a device (JAX device or kind string), or None for one not in the table."""
    kind = device_kind(device).lower()
    return next((family for pattern, family in _KINDS if re.search(pattern, kind)), None)


def check_dtype(dtype) -> str:
    """The computation dtype's name, "bfloat16" or "float32" (from a name or a JAX / NumPy / torch dtype).
    Raises ValueError naming dtype and the allowed values otherwise."""
    name = str(dtype).removeprefix("torch.")
    if name not in DTYPES:
        raise ValueError(f"dtype={dtype!r} is not allowed; use one of {', '.join(map(repr, DTYPES))}")
    return name


def peak_tflops(device, dtype) -> float | None:
    """Published dense peak TFLOP/s of one ``device`` (JAX device or kind string) computing in ``dtype``, or None
    when the device is not in ``PEAK_TFLOPS`` (a CPU, say) or no peak is published for that dtype.
    Raises ValueError for a dtype other than bfloat16 / float32."""
    dtype = check_dtype(dtype)
    family = device_family(device)
    return None if family is None else PEAK_TFLOPS[family][dtype]


def training_flops_per_image(model_config) -> int:
    """FLOPs of one training step per image (per image-text pair for LIMoE): 3 x the analytic forward count."""
    return TRAINING_FLOPS_PER_FORWARD * flops_per_image(model_config)


def throughput_fields(model_config, images_per_second: float, dtype, device, *, num_devices: int = 1) -> dict:
    """What a training log record reports about speed, from the measured rate.

    model_config: the model's config (any family). images_per_second: training images (LIMoE: image-text
    pairs) per second over all ``num_devices`` devices together. dtype: the computation dtype ("bfloat16" or
    "float32", a name or a dtype). device: one of the (identical) devices, a JAX device or a kind string such as
    "NVIDIA H100 80GB HBM3".
    Returns {"tflops_per_second": achieved TFLOP/s over all devices (float), "mfu": achieved / (num_devices x
    the device's dense peak), a fraction in [0, 1], or None where the peak is unknown (CPU, unlisted device)}.
    Raises ValueError for a negative or non-finite rate, a bad dtype or num_devices < 1.
    """
    rate = float(images_per_second)
    if not rate >= 0 or rate == float("inf"):
        raise ValueError(f"images_per_second={images_per_second!r} is not allowed; use a finite number >= 0")
    if isinstance(num_devices, bool) or not isinstance(num_devices, int) or num_devices < 1:
        raise ValueError(f"num_devices={num_devices!r} is not allowed; use a positive integer")
    achieved = rate * training_flops_per_image(model_config) / 1e12
    peak = peak_tflops(device, dtype)
    return {"tflops_per_second": achieved, "mfu": None if peak is None else achieved / (num_devices * peak)}


def format_throughput(images_per_second: float, fields: dict) -> str:
    """One short line for a progress bar: "2,930 img/s, 81.2 TFLOP/s, MFU 8.2%" (no MFU where it is None)."""
    text = f"{images_per_second:,.0f} img/s, {fields['tflops_per_second']:.3g} TFLOP/s"
    return text if fields.get("mfu") is None else f"{text}, MFU {100 * fields['mfu']:.1f}%"
