"""How far one training run drifts when the CPU's instruction set changes: the same preset, seed and data, trained
with XLA free to use every instruction set of this CPU (``native``) and limited to AVX2 (``avx2``,
``XLA_FLAGS=--xla_cpu_max_isa=AVX2``), each in its own process.

Prints, side by side, the training loss of both runs at chosen steps and their difference (the first step where
they differ, how the gap grows), whether the first MoE layer routes the first batch identically before any
training, and the finished models' test metric. A third process draws the first training batches with NumPy's
AVX-512 kernels switched off (``NPY_DISABLE_CPU_FEATURES``) to show whether the *data* depend on the CPU too.
Why it matters and what it found: docs/results.md, "Why a chapter's numbers move with the CPU".

Usage: python benchmarks/isa_drift.py [--preset limoe:digits-limoe] [--steps 300] [--batch-size 128]
       [--learning-rate 2e-3] [--seed 0] [--quick]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys

ISA_FLAGS = {"native": "", "avx2": "--xla_cpu_max_isa=AVX2"}


def numpy_avx512_targets() -> str:
    """NumPy's AVX-512 dispatch targets in this NumPy (``X86_V4 AVX512_ICL ...`` from 2.3 on, ``AVX512F ...``
    before), the names ``NPY_DISABLE_CPU_FEATURES`` takes."""
    try:
        from numpy._core._multiarray_umath import __cpu_dispatch__
    except ImportError:  # NumPy 1.x
        from numpy.core._multiarray_umath import __cpu_dispatch__
    return " ".join(name for name in __cpu_dispatch__ if "512" in name or name == "X86_V4")


def _dataset(config):
    from moe_course.data import load_dataset
    from moe_course.train.objectives import CONTRASTIVE, objective_for

    contrastive = objective_for(config) is CONTRASTIVE
    name = "digits-captions" if contrastive else "digit-glyphs" if config.name.startswith("glyphs-") else "digits"
    return load_dataset(name, None, image_size=config.image_size), contrastive


def _batch_digest(dataset, batches: int, batch_size: int) -> str:
    """SHA-256 of the first training batches' pixels and tokens, as the training loop draws them (epoch 0)."""
    digest = hashlib.sha256()
    import numpy as np

    for b in range(batches):
        batch = dataset.get("train", np.arange(b * batch_size, (b + 1) * batch_size), epoch=0)
        for key in sorted(batch):
            if np.asarray(batch[key]).dtype.kind in "fiub":
                digest.update(np.ascontiguousarray(batch[key]).tobytes())
    return digest.hexdigest()[:16]


def child(args) -> dict:
    """One run in this process (XLA_FLAGS already set by the parent): losses per step, routing, final metric."""
    import jax
    import numpy as np
    from flax import nnx

    from moe_course.configs import get_preset
    from moe_course.models import build_model
    from moe_course.train import TrainConfig, evaluate, train
    from moe_course.analysis import evaluate_contrastive

    family, _, name = args.preset.partition(":")
    config = get_preset(family, name)
    dataset, contrastive = _dataset(config)
    digest = _batch_digest(dataset, 3, args.batch_size)
    if args.data_only:
        return {"digest": digest}
    first = dataset.get("train", np.arange(args.batch_size), epoch=0)
    fresh = build_model(config, rngs=nnx.Rngs(args.seed))
    inputs = (first["image"], first["text"], first["text_mask"]) if contrastive else (first["image"],)
    routing = fresh(*inputs).routing
    experts = np.asarray(routing[0].expert_index) if routing else np.zeros(0)
    run = TrainConfig(steps=args.steps, batch_size=args.batch_size, learning_rate=args.learning_rate,
                      warmup_steps=min(100, args.steps // 4), log_every=1, eval_every=0, checkpoint_every=0,
                      seed=args.seed)
    result = train(config, dataset, run, progress=False)
    metric = (evaluate_contrastive(result.model, dataset, "test", batch_size=512)["zero_shot_accuracy"] if contrastive
              else evaluate(result.model, dataset, "test")["accuracy"])
    return {"digest": digest, "losses": [float(h["loss"]) for h in result.history], "experts": experts.tolist(),
            "metric": float(metric), "device": jax.devices()[0].device_kind}


def _spawn(args, env: dict, data_only: bool = False) -> dict:
    command = [sys.executable, __file__, "--child", "--preset", args.preset, "--steps", str(args.steps),
               "--batch-size", str(args.batch_size), "--learning-rate", str(args.learning_rate),
               "--seed", str(args.seed)] + (["--data-only"] if data_only else [])
    result = subprocess.run(command, env={**os.environ, **env}, capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(f"child {env} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="limoe:digits-limoe", help="FAMILY:NAME (default limoe:digits-limoe)")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--learning-rate", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="a smoke test: 6 steps of 16")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--data-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.steps, args.batch_size = 6, 16
    if args.child:
        print(json.dumps(child(args)))
        return
    if ":" not in args.preset:
        parser.error(f"--preset={args.preset!r} is not FAMILY:NAME, e.g. limoe:digits-limoe or vit:digits-tiny")
    base = os.environ.get("XLA_FLAGS", "")
    runs = {isa: _spawn(args, {"XLA_FLAGS": f"{base} {flag}".strip()}) for isa, flag in ISA_FLAGS.items()}
    numpy_plain = _spawn(args, {"NPY_DISABLE_CPU_FEATURES": numpy_avx512_targets()}, data_only=True)
    print(f"device: {runs['native']['device']}; preset {args.preset}, {args.steps} steps of {args.batch_size}, "
          f"seed {args.seed}")
    print(f"first 3 training batches, SHA-256: native NumPy {runs['native']['digest']}, NumPy without AVX-512 "
          f"({numpy_avx512_targets() or 'none dispatched'} off) {numpy_plain['digest']}, the avx2 run "
          f"{runs['avx2']['digest']}")
    same_routing = runs["native"]["experts"] == runs["avx2"]["experts"]
    print(f"first MoE layer's expert choices for batch 0 at initialisation: "
          f"{'identical' if same_routing else 'DIFFERENT'} under the two instruction sets")
    native, avx2 = runs["native"]["losses"], runs["avx2"]["losses"]
    differs = next((i for i, (a, b) in enumerate(zip(native, avx2)) if a != b), None)
    print("first step whose training loss differs: " + ("none" if differs is None else f"step {differs + 1}"))
    print("step   loss native   loss avx2   |difference|")
    shown = sorted({s for s in (1, 2, 3, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, len(native)) if s <= len(native)})
    for step in shown:
        a, b = native[step - 1], avx2[step - 1]
        print(f"{step:5d}  {a:12.8f}  {b:12.8f}  {abs(a - b):.2e}")
    print(f"test metric after {args.steps} steps: native {runs['native']['metric']:.4f}, avx2 "
          f"{runs['avx2']['metric']:.4f} (difference {runs['native']['metric'] - runs['avx2']['metric']:+.4f})")


if __name__ == "__main__":
    main()
