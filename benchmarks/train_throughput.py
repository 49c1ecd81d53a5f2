"""Training throughput of the presets, side by side: preset x dtype x framework (JAX jit; PyTorch eager and
torch.compile), on random in-memory batches already on the device, so that the step alone is timed.

One row per combination: milliseconds per step (mean over --steps after a warm-up step that compiles; with
--rounds R, the median of R such means, the rows of a preset timed in turns, so that load shared with other
jobs falls on all of them alike),
images/s, achieved TFLOP/s (3 x the shared analytic forward FLOP count, ``moe_course.train.throughput``),
MFU against the device's published dense peak (blank where none is known: a CPU), and peak device memory
(GPU only: JAX's ``peak_bytes_in_use``, torch's ``max_memory_allocated``).
The JAX step is the library's own (``train.steps.make_train_step``: AdamW, aux losses, float32 parameters and
optimizer state, ``dtype`` from the row); the PyTorch step is the twin (``moe_course.torch.models``) with
``torch.optim.AdamW``, cross-entropy + aux loss, under ``torch.autocast`` for bfloat16 rows. LIMoE is left out
(its objective is contrastive and it has no PyTorch twin).
dtype "bfloat16-stream" (JAX rows only) is bfloat16 with the residual stream in bfloat16 too
(``layers.block.RESIDUAL_DTYPE`` set to bfloat16 while the model is built: the patch embedding and every block's
x + f(x) in bfloat16), beside the library's bfloat16 rows, whose stream is float32 as in vmoe: the step-time cost of
the float32 stream.
Usage: python benchmarks/train_throughput.py [--presets vit:deit-s/16 ...] [--dtypes float32 bfloat16
       bfloat16-stream] [--frameworks jax torch torch-compile] [--rounds R] [--quick]
"""

from __future__ import annotations

import time
import warnings
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from moe_course.configs import get_preset
from moe_course.models import build_model
from moe_course.routing import CapacityRoundingWarning
from moe_course.train import TrainConfig
from moe_course.train.optim import make_optimizer
from moe_course.train.steps import make_train_step
from moe_course.train.throughput import throughput_fields
from sizes import SizedParser

PAPER = ["vit:vit-s/32", "vmoe:vmoe-s/32-every-2", "vit:deit-s/16", "soft-moe:soft-moe-s/16", "mod:mod-deit-s/16-c0.5"]
# Sizes of the default run (one GPU: the presets and batches) and of --quick (2 CPU cores, ~2 minutes).
DTYPES = ["float32", "bfloat16", "bfloat16-stream"]
DEFAULTS = dict(presets=PAPER, batch=[512, 512, 256, 256, 256], steps=10, dtypes=DTYPES,
                frameworks=["jax", "torch", "torch-compile"], torch_threads=None)
QUICK = dict(presets=["vit:digits-tiny", "vmoe:digits-tiny-moe"], batch=[32], steps=3,
             dtypes=DTYPES, frameworks=["jax", "torch", "torch-compile"], torch_threads=1)
BFLOAT16_STREAM = "bfloat16-stream"
MIB = 2**20


def _config(spec: str, dtype: str):
    family, name = spec.split(":", 1)
    return get_preset(family, name).replace(dtype="bfloat16" if dtype == BFLOAT16_STREAM else dtype)


def _batch(config, batch: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (batch, config.image_size, config.image_size, config.channels), dtype=np.uint8)
    return images, rng.integers(0, config.num_classes, batch).astype(np.int32)


def jax_step(config, batch: int, model=None, *, bfloat16_stream: bool = False):
    """() -> runs one training step of the library's loop on a fixed device batch; () -> peak bytes or None.
    ``model``: train this one (of ``config``) instead of a fresh ``build_model(config)``. bfloat16_stream: build
    the fresh model with its residual stream in bfloat16 (module docstring)."""
    import moe_course.models.vit as vit

    if model is None:
        with mock.patch.object(vit, "RESIDUAL_DTYPE", jnp.bfloat16 if bfloat16_stream else vit.RESIDUAL_DTYPE):
            model = build_model(config, rngs=nnx.Rngs(0))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx = make_optimizer(TrainConfig(steps=100, warmup_steps=1))
    state = {"params": params, "opt_state": tx.init(params)}
    step = make_train_step(graphdef, tx)
    images, labels = _batch(config, batch)
    data = {"image": jax.device_put(images), "label": jax.device_put(labels)}
    key = jax.random.key(0)

    def run():
        state["params"], state["opt_state"], metrics = step(state["params"], rest, state["opt_state"], data, key)
        jax.block_until_ready(metrics["loss"])

    def peak():
        stats = jax.devices()[0].memory_stats() or {}
        return stats.get("peak_bytes_in_use")

    return run, peak, jax.devices()[0].device_kind


def torch_step(config, batch: int, compiled: bool):
    """As ``jax_step`` for the PyTorch twin (eager or ``torch.compile``), on CUDA when there is one."""
    import torch
    import torch.nn.functional as F

    from moe_course.torch.models import build_model as build_twin
    from moe_course.torch.precision import autocast_for

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    twin = build_twin(config).to(device).train()
    forward = torch.compile(twin) if compiled else twin
    optimizer = torch.optim.AdamW(twin.parameters(), lr=1e-3, weight_decay=1e-4)
    images, labels = _batch(config, batch)
    x = (torch.from_numpy(images).to(device).permute(0, 3, 1, 2).float() / 255.0).contiguous()
    y = torch.from_numpy(labels).long().to(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def run():
        with autocast_for(config, device.type):
            out = forward(x)
            loss = F.cross_entropy(out.logits.float(), y) + out.aux_loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        sync()

    def peak():
        return torch.cuda.max_memory_allocated() if device.type == "cuda" else None

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    kind = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return run, peak, kind


def measure(run, steps: int) -> float:
    """Mean milliseconds per step over ``steps`` steps (the caller has run one untimed step: compilation)."""
    start = time.perf_counter()
    for _ in range(steps):
        run()
    return (time.perf_counter() - start) / steps * 1e3


def main() -> None:
    parser = SizedParser(__doc__.splitlines()[0], DEFAULTS, QUICK)
    parser.add_argument("--presets", nargs="+", default=None, help=f"family:preset {parser.size('presets')}")
    parser.add_argument("--batch", type=int, nargs="+", default=None,
                        help=f"images per step, one per preset or one for all {parser.size('batch')}")
    parser.add_argument("--steps", type=int, default=None, help=f"timed steps per row {parser.size('steps')}")
    parser.add_argument("--dtypes", nargs="+", default=None, choices=DTYPES,
                        help=f"computation dtypes; {BFLOAT16_STREAM}: JAX rows only {parser.size('dtypes')}")
    parser.add_argument("--frameworks", nargs="+", default=None, choices=["jax", "torch", "torch-compile"],
                        help=f"{parser.size('frameworks')}")
    parser.add_argument("--rounds", type=int, default=1,
                        help="time each row this many times, a preset's rows in turns after the first, and report "
                             "the median (default 1); over 1, a GPU row's peak memory is the process's so far")
    parser.add_argument("--torch-threads", type=int, default=None,
                        help="torch CPU threads; on a CPU shared with other jobs 1 avoids oversubscription, which "
                             f"slowed the eager twin 9x here {parser.size('torch_threads')}")
    args = parser.parse_args()
    if args.torch_threads and "torch" in " ".join(args.frameworks):
        import torch

        torch.set_num_threads(args.torch_threads)
    batches = args.batch * len(args.presets) if len(args.batch) == 1 else args.batch
    if len(batches) != len(args.presets):
        parser.error(f"--batch has {len(args.batch)} sizes for {len(args.presets)} presets: give one or one each")
    warnings.simplefilter("ignore", CapacityRoundingWarning)
    print(f"JAX {jax.__version__} on {jax.devices()[0].device_kind}; {args.steps} timed steps per row after a "
          "compiling one; MFU against the dense peak of the row's dtype (TF32 for float32 on NVIDIA)")
    print("| preset | batch | framework | dtype | step ms | images/s | TFLOP/s | MFU | peak MiB |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for spec, batch in zip(args.presets, batches):
        rows = []
        for dtype in args.dtypes:
            config = _config(spec, dtype)
            for framework in args.frameworks:
                if framework == "jax":
                    run, peak, kind = jax_step(config, batch, bfloat16_stream=dtype == BFLOAT16_STREAM)
                elif dtype == BFLOAT16_STREAM:
                    continue
                else:
                    run, peak, kind = torch_step(config, batch, compiled=framework == "torch-compile")
                run()  # compiles
                # one round: timed at once, so that a GPU row's peak memory is its own
                rows.append((dtype, config, framework, run, peak, kind, [measure(run, args.steps)]))
        for _ in range(args.rounds - 1):
            for *_, run, _, _, times in rows:
                times.append(measure(run, args.steps))
        for dtype, config, framework, run, peak, kind, times in rows:
            ms = float(np.median(times))
            rate = batch / ms * 1e3
            fields = throughput_fields(config, rate, config.dtype, kind)
            mfu = "" if fields["mfu"] is None else f"{100 * fields['mfu']:.1f}%"
            memory = peak()
            memory = "" if memory is None else f"{memory / MIB:,.0f}"
            print(f"| {config.name} | {batch} | {framework} | {dtype} | {ms:.1f} | {rate:,.0f} | "
                  f"{fields['tflops_per_second']:.3g} | {mfu} | {memory} |", flush=True)


if __name__ == "__main__":
    main()
