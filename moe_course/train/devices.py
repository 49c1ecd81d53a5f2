"""Which accelerators a run will use, said before it starts, with a warning when a paper-size model meets a CPU."""

from __future__ import annotations

import warnings

import jax
from flax import nnx

# Above this many parameters a model is "paper size": days to weeks per run on a laptop CPU. The CPU presets
# of the course hold 0.1-0.3M; the smallest paper architecture (DeiT-Ti/16) holds 5.7M.
CPU_PARAM_LIMIT = 2_000_000


class PaperScaleOnCPUWarning(UserWarning):
    """A paper-size model is about to train or run on CPU devices only."""


def describe_devices() -> str:
    """One line: how many devices of which platform JAX will use, e.g. ``1 cpu device (TFRT_CPU_0)``."""
    devices = jax.devices()
    platform = devices[0].platform
    kinds = sorted({getattr(d, "device_kind", platform) for d in devices})
    s = "" if len(devices) == 1 else "s"
    return f"{len(devices)} {platform} device{s} ({', '.join(kinds)}), {jax.process_count()} process(es)"


def report_devices(model_config) -> str:
    """Print the devices a run of ``model_config`` will use and its parameter count; warn on a CPU at paper size.

    Returns the printed line. Warns with ``PaperScaleOnCPUWarning`` when JAX's default backend is the CPU and
    the model has more than ``CPU_PARAM_LIMIT`` parameters (counted from shapes, nothing allocated). On a GPU
    node where this says cpu, JAX was installed without its CUDA plugin: see README, "Install".
    """
    from moe_course.models import build_model, count_params

    params = count_params(lambda: build_model(model_config, rngs=nnx.Rngs(0)))
    line = f"{model_config.name}: {params / 1e6:.2f}M parameters on {describe_devices()}"
    print(line)
    if jax.default_backend() == "cpu" and params > CPU_PARAM_LIMIT:
        warnings.warn(
            f"{model_config.name} has {params / 1e6:.1f}M parameters and JAX sees only CPU devices: a paper-size "
            f"run takes days to weeks here. Run it on a GPU or TPU machine (README, 'Install': jax[cuda12] or "
            f"jax[tpu]); on a GPU node where JAX shows only the CPU, its CUDA plugin is missing.",
            PaperScaleOnCPUWarning, stacklevel=2)
    return line
