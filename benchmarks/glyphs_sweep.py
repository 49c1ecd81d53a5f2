"""Where experts pay: one training run of the parameter-bound sweep on digit-glyphs (README, "Where experts pay").

Trains one of the four models of the comparison -- dense ViT, Tokens Choice with BPR, Experts Choice, Soft MoE
-- on the embedded ``digit-glyphs`` task (which source glyph is on the canvas: ``--glyphs-per-digit`` x 10
classes), with the backbone, expert count, placement and schedule given on the command line, and prints one
JSON line: forward FLOPs per image (``flops_per_image``), parameters, test and train accuracy and loss, the
validation curve (``--eval-every``) and the training time. ``--out FILE`` appends the line to FILE. The sweep in
benchmarks/README.md is a list of these commands; the presets ``glyphs-tiny*`` are the configuration it chose.

Usage: python benchmarks/glyphs_sweep.py dense|tc|ec|soft [--width 64 --mlp 128 --experts 16 --steps 1500 ...]
"""

from __future__ import annotations

import argparse
import json
import time
import warnings

from moe_course.configs.vmoe import PLACEMENTS

KINDS = ("dense", "tc", "ec", "soft")


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("kind", choices=KINDS, help="dense ViT, Tokens Choice (BPR), Experts Choice or Soft MoE")
    for name, default in dict(width=64, mlp=128, depth=4, heads=4, experts=16, k=1, steps=1500, batch=128,
                              glyphs_per_digit=30, seed=0, patch=8, last_n=2, group=8, slots=1, eval_every=0
                              ).items():
        p.add_argument(f"--{name.replace('_', '-')}", type=int, default=default)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--capacity-ratio", type=float, default=1.05)
    p.add_argument("--placement", choices=PLACEMENTS, default="last-n",
                   help="which blocks are MoE (VMoEConfig.placement); last-n takes the last --last-n even blocks")
    p.add_argument("--digit-size", type=int, nargs=2, default=(14, 22), help="min and max digit side in pixels")
    p.add_argument("--max-strokes", type=int, default=5, help="clutter strokes per canvas: 2 (or fewer) to this")
    p.add_argument("--out", default=None, help="append the JSON line to this file")
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse(argv)
    warnings.filterwarnings("ignore", message=".*capacity.*")
    import jax
    from flax import nnx

    from moe_course.analysis.flops import flops_per_image
    from moe_course.configs import SoftMoEConfig, ViTConfig, VMoEConfig
    from moe_course.data import ClutteredDigits, DigitsConfig
    from moe_course.train import evaluate, train
    from moe_course.train.config import TrainConfig

    print(f"device: {jax.devices()[0].device_kind}")
    data = ClutteredDigits(DigitsConfig(task="glyph", glyphs_per_class=(args.glyphs_per_digit, 1, 1),
                                        seed=args.seed, digit_size=tuple(args.digit_size),
                                        strokes=(min(2, args.max_strokes), args.max_strokes)))
    backbone = dict(name=f"glyphs-{args.kind}", image_size=32, patch_size=args.patch, channels=1, width=args.width,
                    depth=args.depth, heads=args.heads, mlp_dim=args.mlp, num_classes=data.num_classes, pool="gap")
    moe = dict(num_experts=args.experts, k=args.k, capacity_ratio=args.capacity_ratio, group_size=args.group,
               placement=args.placement, moe_last_n=args.last_n)
    config = {"dense": lambda: ViTConfig(**backbone),
              "tc": lambda: VMoEConfig(**backbone, **moe, allocation="bpr"),
              "ec": lambda: VMoEConfig(**backbone, **moe, allocation="experts_choice"),
              "soft": lambda: SoftMoEConfig(**backbone, **{**moe, "group_size": 1}, slots_per_expert=args.slots),
              }[args.kind]().validate()
    schedule = TrainConfig(steps=args.steps, batch_size=args.batch, learning_rate=args.lr,
                           warmup_steps=min(100, args.steps // 10), checkpoint_every=0, log_every=max(1, args.steps // 10),
                           eval_every=args.eval_every, seed=args.seed, eval_batch_size=512)
    start = time.time()
    result = train(config, data, schedule, progress=False)
    seconds = time.time() - start
    test, train_split = (evaluate(result.model, data, split, batch_size=512) for split in ("test", "train"))
    row = dict(kind=args.kind, **{k: v for k, v in vars(args).items() if k not in ("kind", "out")},
               flops=flops_per_image(config),
               params=int(sum(x.size for x in jax.tree.leaves(nnx.state(result.model, nnx.Param)))),
               test_accuracy=round(test["accuracy"], 4), test_loss=round(test["loss"], 4),
               train_accuracy=round(train_split["accuracy"], 4), train_loss=round(train_split["loss"], 4),
               val_curve=[(h["step"], round(h["val_accuracy"], 4)) for h in result.history if "val_accuracy" in h],
               train_seconds=round(seconds, 1))
    print(json.dumps(row))
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps(row) + "\n")
    return row


if __name__ == "__main__":
    main()
