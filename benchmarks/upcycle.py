"""The training step of an upcycled V-MoE against its dense ViT's, side by side (sparse upcycling, arXiv 2212.05055).

A dense ViT (random weights: a step's time does not depend on their values) is upcycled with
``moe_course.models.upcycle`` into (a) a V-MoE preset of its backbone and (b) the paper's MoE layers on the same
backbone (``reference.upcycle.UPCYCLING_MOE``: 32 experts in every other block, Expert Choice at C = 2), and the
library's training step (``train_throughput.jax_step``: AdamW, aux losses) of the three models is timed in
interleaved rounds, so that a load on the machine hits all three alike. One row per model: milliseconds per step
(median over the rounds of each round's mean), the ratio to the dense step measured in the same rounds, the
analytic forward-FLOP ratio (``analysis.flops_per_image``) for comparison, and every round's mean (the spread).
Usage: python benchmarks/upcycle.py [--dense vit-s/16-i1k --moe vmoe-s/16-i1k-every-2-k1 --batch 256] [--quick]
"""

from __future__ import annotations

import os
import statistics
import time
import warnings

import jax
from flax import nnx

from moe_course.analysis import flops_per_image
from moe_course.configs import get_preset
from moe_course.configs.vit import backbone_of
from moe_course.configs.vmoe import VMoEConfig
from moe_course.models import ViT, upcycle
from moe_course.reference.upcycle import UPCYCLING_MOE
from moe_course.routing import CapacityRoundingWarning
from sizes import SizedParser
from train_throughput import jax_step

DEFAULTS = dict(dense="vit-s/16-i1k", moe="vmoe-s/16-i1k-every-2-k1", batch=256, steps=10, rounds=3, dtype="bfloat16")
QUICK = dict(dense="digits-tiny", moe="digits-tiny-moe", batch=32, steps=5, rounds=3, dtype="float32")


def models(dense_name: str, moe_name: str, dtype: str) -> dict:
    """{row name: model}: the dense ViT and its two upcycled V-MoEs, all computing in ``dtype``."""
    dense = ViT(get_preset("vit", dense_name).replace(dtype=dtype), rngs=nnx.Rngs(0))
    preset = get_preset("vmoe", moe_name).replace(dtype=dtype)
    paper = VMoEConfig(**{**backbone_of(dense.config).__dict__, "name": f"{dense_name}-upcycled-paper"},
                       **UPCYCLING_MOE)
    return {dense_name: dense, f"{moe_name} (upcycled)": upcycle(dense, preset),
            f"{paper.name} (E=32, EC, C=2)": upcycle(dense, paper)}


def main() -> None:
    parser = SizedParser(__doc__.splitlines()[0], DEFAULTS, QUICK)
    parser.add_argument("--dense", default=None, help=f"dense ViT preset {parser.size('dense')}")
    parser.add_argument("--moe", default=None, help=f"V-MoE preset of the same backbone {parser.size('moe')}")
    parser.add_argument("--batch", type=int, default=None, help=f"images per step {parser.size('batch')}")
    parser.add_argument("--steps", type=int, default=None, help=f"timed steps per round {parser.size('steps')}")
    parser.add_argument("--rounds", type=int, default=None, help=f"interleaved rounds {parser.size('rounds')}")
    parser.add_argument("--dtype", default=None, choices=["float32", "bfloat16"], help=parser.size("dtype"))
    args = parser.parse_args()
    warnings.simplefilter("ignore", CapacityRoundingWarning)
    rows = models(args.dense, args.moe, args.dtype)
    steps = {}
    for name, model in rows.items():
        run, _, kind = jax_step(model.config, args.batch, model=model)
        run()  # compiles
        steps[name] = run
    times = {name: [] for name in rows}
    for _ in range(args.rounds):
        for name, run in steps.items():
            start = time.perf_counter()
            for _ in range(args.steps):
                run()
            times[name].append((time.perf_counter() - start) / args.steps * 1e3)
    dense_name = next(iter(rows))
    print(f"device: {kind}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; JAX {jax.__version__}; "
          f"batch {args.batch}, {args.dtype}; {args.rounds} interleaved rounds of {args.steps} steps after a "
          f"compiling one")
    print("| model | step ms (median of rounds) | step vs dense (median of the rounds' ratios) | forward FLOPs vs "
          "dense | step ms per round |")
    print("| --- | --- | --- | --- | --- |")
    dense_flops = flops_per_image(rows[dense_name].config)
    for name, model in rows.items():
        ratio = statistics.median(t / d for t, d in zip(times[name], times[dense_name]))
        print(f"| {name} | {statistics.median(times[name]):.1f} | {ratio:.2f} | "
              f"{flops_per_image(model.config) / dense_flops:.3f} | {' '.join(f'{t:.1f}' for t in times[name])} |",
              flush=True)


if __name__ == "__main__":
    main()
