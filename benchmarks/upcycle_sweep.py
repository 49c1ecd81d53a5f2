"""Sparse upcycling at equal extra compute: one seed of the three-arm comparison of chapter 8 (docs/results.md).

On the embedded ``digit-glyphs`` task (chapter 3's parameter-bound regime: which source glyph is on the canvas),
a dense ViT (the glyphs-tiny backbone, ``--mlp`` wide) is trained ``--dense-steps`` N steps; then, for the same
extra compute -- M dense steps' forward FLOPs (``analysis.flops_per_image``, the course's one analytic count),
each arm trained the steps that cost it that much:

- ``dense``: the dense model trained on (fresh AdamW state, a short warmup, cosine decay over the extra steps);
- ``upcycled``: the dense model upcycled (``models.upcycle``: every expert a copy of its block's MLP, a fresh
  router) into a V-MoE of the same backbone, trained on with the same schedule;
- ``scratch``: that V-MoE from a random start, given the FLOPs of N + M dense steps and the dense run's recipe.

Prints one JSON line per arm (and one, ``dense-start``, for the dense model at step N): test accuracy and loss,
train accuracy, forward FLOPs per image, the images trained on, the validation curve, and for the upcycled arm
(``divergence``) every ``--measure-every`` steps on 256 fixed test images, per MoE layer
(``moe_course.analysis.upcycling``): the mean pairwise relative distance of the experts' fc1 kernels,
||W_i - W_j|| / mean ||W|| (0 = identical copies), the entropy of the experts' shares of the combine weight
divided by log E (1 = an even split), and the fraction of tokens no expert served. ``--out FILE``
appends the lines to FILE (moe_course/results/upcycling.jsonl holds the course's runs).

Usage: python benchmarks/upcycle_sweep.py --seed 0 [--mlp 16 --dense-steps 3000 --extra-steps 1000 ...] [--out FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile

import numpy as np

from moe_course.configs.vmoe import ALLOCATIONS
from moe_course.reference.upcycle import UPCYCLING_MOE
from sweep_run import parameter_count, record, train_timed

DEFAULTS = dict(glyphs_per_digit=30, mlp=32, dense_steps=5000, extra_steps=1500, lr=3e-3, extra_lr=1e-3,
                experts=UPCYCLING_MOE["num_experts"], allocation=UPCYCLING_MOE["allocation"],
                capacity_ratio=UPCYCLING_MOE["capacity_ratio"], batch=128, measure_every=25)


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=0, help="seeds the dense model, the router, data order, canvases")
    p.add_argument("--glyphs-per-digit", type=int, default=DEFAULTS["glyphs_per_digit"], help="classes = 10 x this")
    p.add_argument("--mlp", type=int, default=DEFAULTS["mlp"], help="MLP width of the dense model and every expert")
    p.add_argument("--dense-steps", type=int, default=DEFAULTS["dense_steps"], help="N: the dense start's steps")
    p.add_argument("--extra-steps", type=int, default=DEFAULTS["extra_steps"],
                   help="M: the extra compute, in dense training steps")
    p.add_argument("--lr", type=float, default=DEFAULTS["lr"], help="peak learning rate of the dense start and of "
                   "the from-scratch V-MoE")
    p.add_argument("--extra-lr", type=float, default=DEFAULTS["extra_lr"],
                   help="peak learning rate of the two continued arms")
    p.add_argument("--experts", type=int, default=DEFAULTS["experts"], help="experts per MoE layer")
    p.add_argument("--allocation", choices=ALLOCATIONS, default=DEFAULTS["allocation"],
                   help="the V-MoE's buffer allocation (experts_choice: the paper's choice for vision)")
    p.add_argument("--capacity-ratio", type=float, default=DEFAULTS["capacity_ratio"])
    p.add_argument("--batch", type=int, default=DEFAULTS["batch"], help="images per step, every arm")
    p.add_argument("--measure-every", type=int, default=DEFAULTS["measure_every"],
                   help="steps between the upcycled arm's divergence measurements")
    p.add_argument("--out", default=None, help="append the JSON lines to this file")
    args = p.parse_args(argv)
    for name in ("glyphs_per_digit", "mlp", "dense_steps", "extra_steps", "experts", "batch", "measure_every"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')}={getattr(args, name)} must be at least 1")
    return args


def variant(args: argparse.Namespace) -> str:
    """The options that differ from DEFAULTS ("" for the recorded recipe): the key runs are grouped by."""
    return " ".join(f"--{name.replace('_', '-')} {getattr(args, name)}" for name, default in DEFAULTS.items()
                    if getattr(args, name) != default and name != "measure_every")


def configs(args: argparse.Namespace):
    """(dense ViTConfig, VMoEConfig, dataset, dense TrainConfig): glyphs-tiny's backbone with ``--mlp``, and on it
    the paper's MoE layers (``reference.upcycle.UPCYCLING_MOE``: every other block, blocks 1 and 3 here; Experts
    Choice at C = 2 with 32 experts; groups of 8 images) with ``--experts``, ``--allocation``, C."""
    from moe_course.configs import get_preset
    from moe_course.configs.vmoe import VMoEConfig
    from moe_course.data import ClutteredDigits, DigitsConfig
    from moe_course.recipes import recipe_for

    data = ClutteredDigits(DigitsConfig(task="glyph", glyphs_per_class=(args.glyphs_per_digit, 1, 1),
                                        seed=args.seed))
    dense = get_preset("vit", "glyphs-tiny").replace(mlp_dim=args.mlp, num_classes=data.num_classes).validate()
    moe = VMoEConfig(**{**dataclasses.asdict(dense), "name": "glyphs-tiny-upcycled"}, **{
        **UPCYCLING_MOE, "num_experts": args.experts, "allocation": args.allocation,
        "capacity_ratio": args.capacity_ratio}).validate()
    recipe = recipe_for(get_preset("vit", "glyphs-tiny"))
    schedule = recipe.replace(steps=args.dense_steps, batch_size=args.batch, learning_rate=args.lr, seed=args.seed,
                              checkpoint_every=0, warmup_steps=min(recipe.warmup_steps, args.dense_steps // 10),
                              eval_batch_size=512, eval_every=max(1, args.dense_steps // 4), log_every=max(1, args.dense_steps // 10))
    return dense, moe, data, schedule


def extra_schedule(schedule, steps: int, lr: float):
    """The continued arms' schedule: ``steps`` steps, warmup a tenth of them, cosine from ``lr``."""
    return schedule.replace(steps=steps, learning_rate=lr, warmup_steps=max(1, steps // 10),
                            eval_every=max(1, steps // 2), log_every=max(1, steps // 10))


def divergence_point(step: int, model, images: np.ndarray) -> dict:
    """The upcycled arm's measurements at ``step`` on ``images`` (``analysis.upcycling``), one value per MoE
    layer: expert distance, importance entropy / log E, fraction of tokens no expert served."""
    from moe_course.analysis import collect_routing
    from moe_course.analysis.upcycling import expert_distance, importance_entropy, unserved_fraction

    _, records = collect_routing(model, images)
    return dict(step=step, expert_distance=[round(d, 5) for d in expert_distance(model)],
                importance_entropy=[round(importance_entropy(r), 4) for r in records],
                unserved=[round(unserved_fraction(r, len(images)), 4) for r in records])


def train_measured(config, data, schedule, model, images: np.ndarray, every: int):
    """Train ``model`` (``init_model``) with checkpoints every ``every`` steps in a temporary folder, then measure
    ``divergence_point`` at step 0 and at each checkpoint. Returns (TrainResult, seconds, points)."""
    from moe_course.train.restore import load_run

    points = [divergence_point(0, model, images)]
    with tempfile.TemporaryDirectory(prefix="upcycle-") as workdir:
        result, seconds = train_timed(config, schedule.replace(
            checkpoint_every=every, keep_checkpoints=schedule.steps // every + 1), data, workdir=workdir,
            init_model=model)
        for step in range(every, schedule.steps + 1, every):
            points.append(divergence_point(step, load_run(workdir, step).model, images))
    return result, seconds, points


def main(argv=None) -> list[dict]:
    args = parse(argv)
    from moe_course.analysis.flops import flops_per_image
    from moe_course.models import upcycle
    from moe_course.train import evaluate

    dense_config, moe_config, data, schedule = configs(args)
    dense_flops, moe_flops = flops_per_image(dense_config), flops_per_image(moe_config)
    extra = round(args.extra_steps * dense_flops / moe_flops)  # the V-MoE's steps for M dense steps' FLOPs
    scratch = round((args.dense_steps + args.extra_steps) * dense_flops / moe_flops)
    test_images = data.arrays("test")[0]
    images = test_images[:min(256, len(test_images)) // moe_config.group_size * moe_config.group_size]
    common = dict(variant=variant(args), seed=args.seed, **{k: getattr(args, k) for k in DEFAULTS})
    rows = []

    def row(kind, result, seconds, flops, steps, **more):
        test, train_split = (evaluate(result.model, data, split, batch_size=512) for split in ("test", "train"))
        rows.append(record(dict(
            kind=kind, **common, steps=steps, flops=flops, images=steps * schedule.batch_size,
            params=parameter_count(result.model), test_accuracy=round(test["accuracy"], 4),
            test_loss=round(test["loss"], 4), train_accuracy=round(train_split["accuracy"], 4),
            train_loss=round(train_split["loss"], 4),
            val_curve=[(h["step"], round(h["val_accuracy"], 4)) for h in result.history if "val_accuracy" in h],
            train_seconds=round(seconds, 1), **more), args.out))

    start, seconds = train_timed(dense_config, schedule, data)
    row("dense-start", start, seconds, dense_flops, args.dense_steps)
    upcycled = upcycle(start.model, moe_config, seed=args.seed)
    result, seconds, points = train_measured(moe_config, data, extra_schedule(schedule, extra, args.extra_lr),
                                             upcycled, images, args.measure_every)
    row("upcycled", result, seconds, moe_flops, extra, divergence=points)
    continued = train_timed(dense_config, extra_schedule(schedule, args.extra_steps, args.extra_lr), data,
                            init_model=start.model)
    row("dense", *continued, dense_flops, args.extra_steps)
    result, seconds = train_timed(moe_config, dataclasses.replace(
        schedule, steps=scratch, eval_every=max(1, scratch // 4), log_every=max(1, scratch // 10)), data)
    row("scratch", result, seconds, moe_flops, scratch, divergence=[divergence_point(scratch, result.model, images)])
    return rows


if __name__ == "__main__":
    main()
