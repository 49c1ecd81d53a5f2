"""Chapter 6's pretrained dense backbone: train it with the course's loop and record its weights in the package.

Chapter 6 (Mixture-of-Depths) adapts a *pretrained* dense ViT. Trained inside the notebook it could have 300 steps
and reached 0.32-0.45 test accuracy, so every MoD comparison stood on a model that had barely learned. This
command trains the same backbone -- the `digits-24-p4` preset: `digits-tiny` (4 blocks, width 64, 4 heads, MLP 128,
global average pooling) on 24x24 canvases of the cluttered digits in 4x4-pixel patches, 36 tokens -- with its
recipe (``moe_course.recipes``: 4,000 steps of 128 images, peak lr 1e-3) and writes its parameters to
``moe_course/results/chapter06_backbone.npz``, which the chapter loads (``MOE_COURSE_RETRAIN=1`` makes the chapter
train it again instead). Prints one JSON line: the recipe, test and validation accuracy, training time.

Usage: python benchmarks/mod_backbone.py [--steps 4000] [--seed 0] [--out PATH] [--quick]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from moe_course.configs import get_preset
from moe_course.data import load_dataset
from moe_course.recipes import recipe_for
from moe_course.settings import RECORDED_BACKBONE
from moe_course.train import evaluate, train
from moe_course.train.weights_file import save_weights


def main() -> None:
    config = get_preset("vit", "digits-24-p4")
    recipe = recipe_for(config)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=recipe.steps)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RECORDED_BACKBONE)
    parser.add_argument("--quick", action="store_true", help="a smoke test: 20 steps of 16")
    args = parser.parse_args()
    run = recipe.replace(steps=args.steps, seed=args.seed, checkpoint_every=0, eval_every=0)
    if args.quick:
        run = run.replace(steps=20, batch_size=16, warmup_steps=2)
    digits = load_dataset("digits", image_size=config.image_size)  # DigitsConfig.for_image_size(24), seed 0
    started = time.perf_counter()
    model = train(config, digits, run, progress=False).model
    seconds = time.perf_counter() - started
    save_weights(model, args.out)
    print(json.dumps({"config": config.name, "steps": run.steps, "batch_size": run.batch_size,
                      "learning_rate": run.learning_rate, "warmup_steps": run.warmup_steps, "seed": run.seed,
                      "test_accuracy": round(evaluate(model, digits, "test", batch_size=525)["accuracy"], 4),
                      "val_accuracy": round(evaluate(model, digits, "val", batch_size=525)["accuracy"], 4),
                      "train_seconds": round(seconds), "out": str(args.out)}))


if __name__ == "__main__":
    main()
