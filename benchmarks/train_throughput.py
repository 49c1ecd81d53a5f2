"""Training throughput of the presets, side by side: preset x dtype x framework (JAX jit; PyTorch eager and
torch.compile), on random in-memory batches already on the device, so that the step alone is timed.

One row per combination: milliseconds per step (mean over --steps after a warm-up step that compiles),
images/s, achieved TFLOP/s (3 x the shared analytic forward FLOP count, ``moe_course.train.throughput``),
MFU against the device's published dense peak (blank where none is known: a CPU), and peak device memory
(GPU only: JAX's ``peak_bytes_in_use``, torch's ``max_memory_allocated``).
The JAX step is the library's own (``train.steps.make_train_step``: AdamW, aux losses, float32 parameters and
optimizer state, ``dtype`` from the row); the PyTorch step is the twin (``moe_course.torch.models``) with
``torch.optim.AdamW``, cross-entropy + aux loss, under ``torch.autocast`` for bfloat16 rows. LIMoE is left out
(its objective is contrastive and it has no PyTorch twin).
Usage: python benchmarks/train_throughput.py [--presets vit:deit-s/16 ...] [--dtypes float32 bfloat16]
       [--frameworks jax torch torch-compile] [--quick]
"""

from __future__ import annotations

import time
import warnings

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
DEFAULTS = dict(presets=PAPER, batch=[512, 512, 256, 256, 256], steps=10, dtypes=["float32", "bfloat16"],
                frameworks=["jax", "torch", "torch-compile"], torch_threads=None)
QUICK = dict(presets=["vit:digits-tiny", "vmoe:digits-tiny-moe"], batch=[32], steps=3,
             dtypes=["float32", "bfloat16"], frameworks=["jax", "torch", "torch-compile"], torch_threads=1)
MIB = 2**20


def _config(spec: str, dtype: str):
    family, name = spec.split(":", 1)
    return get_preset(family, name).replace(dtype=dtype)


def _batch(config, batch: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (batch, config.image_size, config.image_size, config.channels), dtype=np.uint8)
    return images, rng.integers(0, config.num_classes, batch).astype(np.int32)


def jax_step(config, batch: int, model=None):
    """() -> runs one training step of the library's loop on a fixed device batch; () -> peak bytes or None.
    ``model``: train this one (of ``config``) instead of a fresh ``build_model(config)``."""
    model = build_model(config, rngs=nnx.Rngs(0)) if model is None else model
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
    """Mean milliseconds per step over ``steps`` steps, after one untimed step (compilation)."""
    run()
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
    parser.add_argument("--dtypes", nargs="+", default=None, choices=["float32", "bfloat16"],
                        help=f"computation dtypes {parser.size('dtypes')}")
    parser.add_argument("--frameworks", nargs="+", default=None, choices=["jax", "torch", "torch-compile"],
                        help=f"{parser.size('frameworks')}")
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
        for dtype in args.dtypes:
            config = _config(spec, dtype)
            for framework in args.frameworks:
                if framework == "jax":
                    run, peak, kind = jax_step(config, batch)
                else:
                    run, peak, kind = torch_step(config, batch, compiled=framework == "torch-compile")
                ms = measure(run, args.steps)
                rate = batch / ms * 1e3
                fields = throughput_fields(config, rate, dtype, kind)
                mfu = "" if fields["mfu"] is None else f"{100 * fields['mfu']:.1f}%"
                memory = peak()
                memory = "" if memory is None else f"{memory / MIB:,.0f}"
                print(f"| {config.name} | {batch} | {framework} | {dtype} | {ms:.1f} | {rate:,.0f} | "
                      f"{fields['tflops_per_second']:.3g} | {mfu} | {memory} |", flush=True)


if __name__ == "__main__":
    main()
