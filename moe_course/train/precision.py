"""Which computation dtype a run uses: the ``--dtype`` of ``moe-course train``, "auto" resolved when the run starts.

"auto" follows the reference code's practice (MaxText, big_vision: bfloat16 computation with float32 parameters
on accelerators) where it pays, and keeps every CPU number of the course unchanged:
- a run that resumes from a workdir keeps the dtype it was made with (its ``run.json``; a run recorded before
  the field existed was float32), so a checkpoint never meets a changed config;
- else bfloat16 for a paper-size model (more than ``devices.CPU_PARAM_LIMIT`` parameters) on a GPU or TPU;
- else the config's own dtype (float32 for every preset).
"""

from __future__ import annotations

import json
from pathlib import Path

DTYPE_CHOICES = ("auto", "float32", "bfloat16")
ACCELERATORS = ("gpu", "cuda", "rocm", "tpu")


def resolve_dtype(requested: str, model_config, *, workdir: str | Path | None = None,
                  backend: str | None = None) -> tuple[str, str]:
    """(dtype, why) for a run of ``model_config``: ``requested`` itself unless it is "auto" (see the module).

    workdir: the run directory (its ``run.json`` decides for a resumed run). backend: JAX's platform name
    ("cpu", "gpu", "tpu"); None asks ``jax.default_backend()``. ``why`` is a few words for the run's first line.
    Raises ValueError naming dtype and the allowed values for anything else than ``DTYPE_CHOICES``.
    """
    if requested not in DTYPE_CHOICES:
        raise ValueError(f"dtype={requested!r} is not allowed; use one of {', '.join(map(repr, DTYPE_CHOICES))}")
    if requested != "auto":
        return requested, "--dtype"
    record = Path(workdir) / "run.json" if workdir is not None else None
    if record is not None and record.exists():
        saved = json.loads(record.read_text()).get("model", {}).get("dtype", "float32")
        return saved, f"auto: the run in {workdir} was made with it"
    if backend is None:
        import jax

        backend = jax.default_backend()
    from flax import nnx

    from moe_course.models import build_model, count_params
    from moe_course.train.devices import CPU_PARAM_LIMIT

    params = count_params(lambda: build_model(model_config, rngs=nnx.Rngs(0)))
    if backend in ACCELERATORS and params > CPU_PARAM_LIMIT:
        return "bfloat16", f"auto: a paper-size model on {backend}"
    return model_config.dtype, f"auto: {'a CPU-size model' if params <= CPU_PARAM_LIMIT else 'paper size'} on {backend}"


def describe_precision(model_config, why: str) -> str:
    """The run's first line about precision, e.g. "precision: bfloat16 computation, float32 parameters and
    optimizer state (auto: a paper-size model on gpu)"."""
    return (f"precision: {model_config.dtype} computation, {model_config.param_dtype} parameters and optimizer "
            f"state ({why})")
