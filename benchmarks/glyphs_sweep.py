"""Where experts pay: one training run of the parameter-bound sweep on digit-glyphs (docs/results.md).

Trains one of the four models of the comparison -- dense ViT, Tokens Choice with BPR, Experts Choice, Soft MoE
-- on the embedded ``digit-glyphs`` task (which source glyph is on the canvas: ``--glyphs-per-digit`` x 10
classes), with the backbone, expert count, placement and schedule given on the command line, and prints one
JSON line: forward FLOPs per image (``flops_per_image``), parameters, test and train accuracy and loss, the
validation curve (``--eval-every``) and the training time. ``--out FILE`` appends the line to FILE. The sweep in
benchmarks/README.md is a list of these commands; the presets ``glyphs-tiny*`` are the configuration it chose.

Usage: python benchmarks/glyphs_sweep.py dense|tc|ec|soft [--seed 1] [--glyphs-per-digit 30 --steps 1500 ...]
(every option left out keeps the glyphs-tiny preset's value and its CLI recipe's schedule)
"""

from __future__ import annotations

import argparse

from moe_course.configs.vmoe import PLACEMENTS
from moe_course.data.registry import GLYPHS_PER_DIGIT
from sweep_run import parameter_count, record, train_timed

# Each kind is a glyphs-tiny preset; every option left unset keeps the preset's (or its CLI recipe's) value, so
# `glyphs_sweep.py tc --seed 1` trains what `moe-course train vmoe --preset glyphs-tiny-moe --seed 1` trains.
KINDS = {"dense": ("vit", "glyphs-tiny"), "tc": ("vmoe", "glyphs-tiny-moe"), "ec": ("vmoe", "glyphs-tiny-ec"),
         "soft": ("soft-moe", "glyphs-tiny-soft")}
MODEL_OPTIONS = dict(width="width", mlp="mlp_dim", depth="depth", heads="heads", patch="patch_size",
                     experts="num_experts", k="k", last_n="moe_last_n", group="group_size",
                     slots="slots_per_expert", capacity_ratio="capacity_ratio", placement="placement",
                     allocation="allocation")
MOE_ONLY = ("num_experts", "k", "moe_last_n", "group_size", "slots_per_expert", "capacity_ratio", "placement",
            "allocation")


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("kind", choices=KINDS, help="dense ViT, Tokens Choice (BPR), Experts Choice or Soft MoE")
    for name in ("width", "mlp", "depth", "heads", "patch", "experts", "k", "last_n", "group", "slots", "steps",
                 "batch", "eval_every"):
        p.add_argument(f"--{name.replace('_', '-')}", type=int, default=None, help="default: the preset's/recipe's")
    p.add_argument("--glyphs-per-digit", type=int, default=GLYPHS_PER_DIGIT, help="classes = 10 x this")
    p.add_argument("--seed", type=int, default=0, help="seeds the model, the data order and the canvases")
    p.add_argument("--lr", type=float, default=None, help="peak learning rate; default: the recipe's")
    p.add_argument("--capacity-ratio", type=float, default=None)
    p.add_argument("--placement", choices=PLACEMENTS, default=None,
                   help="which blocks are MoE (VMoEConfig.placement); last-n takes the last --last-n even blocks")
    p.add_argument("--allocation", choices=("vanilla", "bpr"), default=None,
                   help="Tokens Choice's buffer allocation: vanilla (V-MoE App. C Alg. 1) or bpr (Alg. 2, the "
                        "preset's)")
    p.add_argument("--digit-size", type=int, nargs=2, default=(14, 22), help="min and max digit side in pixels")
    p.add_argument("--max-strokes", type=int, default=5, help="clutter strokes per canvas: 2 (or fewer) to this")
    p.add_argument("--out", default=None, help="append the JSON line to this file")
    return p.parse_args(argv)


def variant(args: argparse.Namespace) -> str:
    """The options of this run that change what it trains (all but seed, --out and --eval-every) and differ from
    their defaults: "" for the recipe itself; the key ``moe_course.analysis.sweeps`` groups seeds by."""
    defaults = vars(parse([args.kind]))
    shown = lambda value: " ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
    return " ".join(f"--{name.replace('_', '-')} {shown(value)}" for name, value in vars(args).items()
                    if name not in ("kind", "seed", "out", "eval_every") and _plain(value) != _plain(defaults[name]))


def _plain(value):
    return tuple(value) if isinstance(value, list) else value


def configs(args: argparse.Namespace):
    """(model config, TrainConfig, dataset) of one run: the kind's preset and recipe with the given options."""
    from moe_course.configs import get_preset
    from moe_course.data import ClutteredDigits, DigitsConfig
    from moe_course.recipes import recipe_for

    if args.allocation and args.kind != "tc":
        raise ValueError(f"--allocation {args.allocation} is for Tokens Choice (tc), not {args.kind!r}")
    data = ClutteredDigits(DigitsConfig(task="glyph", glyphs_per_class=(args.glyphs_per_digit, 1, 1),
                                        seed=args.seed, digit_size=tuple(args.digit_size),
                                        strokes=(min(2, args.max_strokes), args.max_strokes)))
    preset = get_preset(*KINDS[args.kind])
    overrides = {field: getattr(args, option) for option, field in MODEL_OPTIONS.items()
                 if getattr(args, option) is not None and (args.kind != "dense" or field not in MOE_ONLY)}
    config = preset.replace(**overrides, num_classes=data.num_classes).validate()
    recipe = recipe_for(preset)
    steps = args.steps or recipe.steps
    schedule = recipe.replace(
        steps=steps, batch_size=args.batch or recipe.batch_size, learning_rate=args.lr or recipe.learning_rate,
        warmup_steps=min(recipe.warmup_steps, steps // 10), eval_every=args.eval_every or 0, seed=args.seed,
        checkpoint_every=0, log_every=max(1, steps // 10), eval_batch_size=512)
    return config, schedule, data


def main(argv=None) -> dict:
    args = parse(argv)
    from moe_course.analysis.flops import flops_per_image
    from moe_course.train import evaluate

    config, schedule, data = configs(args)
    result, seconds = train_timed(config, schedule, data)
    test, train_split = (evaluate(result.model, data, split, batch_size=512) for split in ("test", "train"))
    row = dict(kind=args.kind, variant=variant(args),
               **{k: v for k, v in vars(args).items() if k not in ("kind", "out")},
               config={f: getattr(config, f) for f in MODEL_OPTIONS.values() if hasattr(config, f)},
               schedule=dict(steps=schedule.steps, batch=schedule.batch_size, lr=schedule.learning_rate),
               flops=flops_per_image(config), params=parameter_count(result.model),
               test_accuracy=round(test["accuracy"], 4), test_loss=round(test["loss"], 4),
               train_accuracy=round(train_split["accuracy"], 4), train_loss=round(train_split["loss"], 4),
               val_curve=[(h["step"], round(h["val_accuracy"], 4)) for h in result.history if "val_accuracy" in h],
               train_seconds=round(seconds, 1))
    return record(row, args.out)


if __name__ == "__main__":
    main()
