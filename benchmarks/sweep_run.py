"""What the training sweeps share (glyphs_sweep.py, limoe_sweep.py): train one configuration with the one
training loop, timed, and record the run as one JSON line."""

from __future__ import annotations

import json
import time
import warnings


def train_timed(config, schedule, data, **options):
    """(TrainResult, training seconds) of ``moe_course.train.train`` without a progress bar (``options``: its
    keywords, e.g. ``init_model``, ``workdir``); prints the device first (the line the benchmark tests expect)
    and silences the capacity-rounding warnings of small groups."""
    import jax

    from moe_course.train import train

    warnings.filterwarnings("ignore", message=".*capacity.*")
    print(f"device: {jax.devices()[0].device_kind}")
    start = time.time()
    result = train(config, data, schedule, progress=False, **options)
    return result, time.time() - start


def parameter_count(model) -> int:
    """The number of trainable parameters (nnx.Param leaves) of ``model``."""
    import jax
    from flax import nnx

    return int(sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param))))


def record(row: dict, out: str | None) -> dict:
    """Print ``row`` as one JSON line and, with ``out``, append it to that file; returns ``row``."""
    print(json.dumps(row))
    if out:
        with open(out, "a") as f:
            f.write(json.dumps(row) + "\n")
    return row
