"""The input of a P-process run, before and after process-local input, side by side: images each process decodes
per global step and the input's CPU-seconds per global batch (all processes together).

For P = 1, 2, 4 (``--processes``), P OS processes run side by side on this machine, as the P hosts of a pod
would, each building global steps 0 .. --steps - 1 of the same training pipeline (``data.pipeline.train_pipeline``,
one Grain thread in the process, seed 0):
- before: every process builds the whole global batch (what the loop did when each process fed the full batch
  to ``jax.device_put``);
- after: process p builds only rows p*B/P .. (p+1)*B/P - 1 (``rows=``, the share its devices hold on a data mesh,
  ``parallel.process_rows``).
Images per process per step come from the pipeline's own count (``images``); CPU-seconds are each process's
``time.process_time`` over the timed steps (every thread of the process), summed over the P processes and
divided by the steps. No JAX devices or collectives are involved: only the input is measured.
Data: JPEGs of ImageNet-like sizes (300-500 px sides, made as benchmarks/input_pipeline.py makes them) read as an
image folder at --image-size with the training augmentation (Inception crop + flip), or the embedded digits.
Usage: python benchmarks/multihost_input.py [--dataset imagefolder|digits] [--processes 1 2 4] [--steps 8]
       [--batch-size 128] [--image-size 224] [--quick]
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from input_pipeline import make_files
from sizes import SizedParser

DEFAULTS = dict(processes=[1, 2, 4], steps=8, batch_size=128, image_size=224, jpegs=512, jpeg_sides=(300, 500))
QUICK = dict(processes=[1, 2], steps=2, batch_size=8, image_size=32, jpegs=16, jpeg_sides=(60, 90))


def _load(dataset: str, folder: str | None, image_size: int):
    from moe_course.data import load_dataset

    if dataset == "digits":
        return load_dataset("digits", None, seed=0)
    return load_dataset("imagefolder", folder, image_size=image_size, seed=0)


def build_share(dataset: str, folder: str | None, image_size: int, batch_size: int, steps: int,
                rows: tuple[int, int] | None, results) -> None:
    """One process: build global steps 0 .. steps - 1; put (images a step, CPU-seconds) on ``results``. The
    clock runs from the pipeline's creation to its last batch (its thread builds ahead, so no later start)."""
    from moe_course.data.pipeline import close_pipeline, train_pipeline

    data = _load(dataset, folder, image_size)
    data.get_uint8("train", np.arange(1), augment=True)  # imports and first-use set-up outside the clock
    started = time.process_time()
    pipeline = train_pipeline(data, batch_size, seed=0, stop_step=steps, workers=0, rows=rows)
    for _ in pipeline:
        pass
    seconds, images = time.process_time() - started, pipeline.images
    close_pipeline(pipeline)
    results.put((images / steps, seconds))


def measure(args, folder: str | None, processes: int, local: bool) -> tuple[float, float]:
    """(images decoded per process per step, input CPU-seconds per global batch) of ``processes`` processes."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    share = args.batch_size // processes
    workers = [context.Process(target=build_share, args=(
        args.dataset, folder, args.image_size, args.batch_size, args.steps,
        (p * share, (p + 1) * share) if local else None, results)) for p in range(processes)]
    for worker in workers:
        worker.start()
    measured = [results.get() for _ in workers]
    for worker in workers:
        worker.join()
        if worker.exitcode:
            raise SystemExit(f"a measuring process failed (exit code {worker.exitcode})")
    per_process = sum(images for images, _ in measured) / processes
    return per_process, sum(seconds for _, seconds in measured) / args.steps


def main() -> None:
    parser = SizedParser(__doc__.splitlines()[0], DEFAULTS, QUICK)
    parser.add_argument("--dataset", choices=["imagefolder", "digits"], default="imagefolder")
    parser.add_argument("--processes", type=int, nargs="+", help=f"process counts P {parser.size('processes')}")
    for name, text in [("steps", "timed global steps"), ("batch_size", "global batch"),
                       ("image_size", "image-folder side in px"), ("jpegs", "JPEG files made")]:
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, help=f"{text} {parser.size(name)}")
    parser.add_argument("--jpeg-sides", type=int, nargs=2, help=f"JPEG side range in px {parser.size('jpeg_sides')}")
    args = parser.parse_args()
    for p in args.processes:
        if p < 1 or args.batch_size % p:
            raise SystemExit(f"--processes {p}: each must be >= 1 and divide --batch-size {args.batch_size}")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"device: CPU input only (no accelerator used); {os.cpu_count()} cores, load average {load:.1f} at the "
          f"start; dataset {args.dataset}"
          + (f" ({args.jpegs} JPEGs, {args.image_size} px crops)" if args.dataset == "imagefolder" else "")
          + f", global batch {args.batch_size}, {args.steps} timed steps, seed 0")
    with tempfile.TemporaryDirectory() as tmp:
        folder = str(make_files(Path(tmp), args)["imagefolder"]) if args.dataset == "imagefolder" else None
        print("P   images/process/step (before, after)   input CPU-s per global batch (before, after, after/before)")
        for p in args.processes:
            before = measure(args, folder, p, local=False)
            after = measure(args, folder, p, local=True)
            print(f"{p:<3} {before[0]:9.1f} {after[0]:9.1f}                    "
                  f"{before[1]:9.3f} {after[1]:9.3f} {after[1] / before[1]:9.2f}", flush=True)


if __name__ == "__main__":
    main()
