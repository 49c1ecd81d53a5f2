"""LIMoE's experiments at toy scale: one training run of the Fig. 3 / Fig. 5 / Figs. 9-10 sweeps (docs/results.md).

Trains one of the four models of the comparison on the embedded captioned digits (``digits-captions``) and
prints one JSON line. KIND is a step of the paper's Fig. 3 ladder or its baseline:
- classic: ``digits-limoe-classic``, the paper's classic losses (importance + load over all real tokens);
- local: ``digits-limoe-local``, + the local entropy loss on text (Fig. 3, middle row);
- paper: ``digits-limoe``, + the global entropy losses (the paper's five terms, Fig. 3 bottom row);
- dense: ``digits-dense-one-tower``, the dense one-tower model of equal active FLOPs.
Options override the preset -- ``--patch-size`` sets the image:text balance (8: 16 image tokens per caption of
up to 16 text tokens; 4: 64), experts, k, capacity ratio, aux weight, the global-entropy thresholds (as the
paper's soft minimum S = e^tau) -- and the CLI recipe's schedule (every option left out keeps the recipe's
value: with none, a run trains what ``moe-course train limoe --preset <preset> --seed S`` trains).

The line holds: forward FLOPs per pair (``flops_per_image``), parameters, the real image and text tokens per pair,
test zero-shot accuracy and retrieval recall@1/@5 both ways, per modality and MoE layer on the test pairs the
success rate, every expert's share of top-1 choices, the busiest one's and the experts that take 90% of them
(App. B.2), and curves over training: every ``--log-every`` steps the mean and largest single-step loss and the
in-batch success rates and busiest shares, every ``--eval-every`` steps validation zero-shot accuracy.

Usage: python benchmarks/limoe_sweep.py classic|local|paper|dense [--seed 1] [--patch-size 4] [--text-soft-min 4] ...
"""

from __future__ import annotations

import argparse
import math

from sweep_run import parameter_count, record, train_timed

KINDS = {"classic": "digits-limoe-classic", "local": "digits-limoe-local", "paper": "digits-limoe",
         "dense": "digits-dense-one-tower"}
MODEL_OPTIONS = dict(patch_size="patch_size", experts="num_experts", k="k", capacity_ratio="capacity_ratio",
                     aux_weight="aux_loss_weight", text_soft_min="text_tau", image_soft_min="image_tau",
                     group="group_size")
MOE_ONLY = ("num_experts", "k", "capacity_ratio", "aux_loss_weight", "text_tau", "image_tau", "group_size")
CURVE_PREFIXES = ("success/", "busiest/")


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("kind", choices=KINDS, help="classic, local, paper (the Fig. 3 ladder) or dense")
    for name in ("patch_size", "experts", "k", "group", "steps", "batch", "log_every", "eval_every"):
        p.add_argument(f"--{name.replace('_', '-')}", type=int, default=None, help="default: the preset's/recipe's")
    for name in ("capacity_ratio", "aux_weight", "lr"):
        p.add_argument(f"--{name.replace('_', '-')}", type=float, default=None, help="default: the preset's/recipe's")
    p.add_argument("--text-soft-min", type=float, default=None, metavar="S",
                   help="text's global-entropy threshold as the paper's soft minimum S_T = e^tau (tau = log S: use "
                        "at least about S experts; S <= 1 turns the loss off); default: the preset's")
    p.add_argument("--image-soft-min", type=float, default=None, metavar="S", help="the same for images")
    p.add_argument("--seed", type=int, default=0, help="seeds the model, the data order and the canvases")
    p.add_argument("--out", default=None, help="append the JSON line to this file")
    return p.parse_args(argv)


def variant(args: argparse.Namespace) -> str:
    """The options of this run that change what it trains (all but seed, --out, --log-every and --eval-every),
    "" for the recipe itself; the key ``moe_course.analysis.sweeps`` groups seeds by."""
    return " ".join(f"--{name.replace('_', '-')} {value}" for name, value in vars(args).items()
                    if name not in ("kind", "seed", "out", "log_every", "eval_every") and value is not None)


def configs(args: argparse.Namespace):
    """(model config, TrainConfig, dataset) of one run: the kind's preset and recipe with the given options."""
    from moe_course.configs import get_preset
    from moe_course.data import load_dataset
    from moe_course.recipes import recipe_for

    preset = get_preset("limoe", KINDS[args.kind])
    overrides = {field: getattr(args, option) for option, field in MODEL_OPTIONS.items()
                 if getattr(args, option) is not None and (args.kind != "dense" or field not in MOE_ONLY)}
    for field in ("text_tau", "image_tau"):
        if field in overrides:  # a soft minimum S <= 1 means tau <= 0: the loss is off
            overrides[field] = math.log(overrides[field]) if overrides[field] > 0 else 0.0
    config = preset.replace(**overrides).validate()
    data = load_dataset("digits-captions", image_size=config.image_size, seed=args.seed)
    recipe = recipe_for(preset)
    steps = args.steps or recipe.steps
    schedule = recipe.replace(
        steps=steps, batch_size=args.batch or recipe.batch_size, learning_rate=args.lr or recipe.learning_rate,
        warmup_steps=min(recipe.warmup_steps, steps // 10), seed=args.seed, checkpoint_every=0,
        log_every=args.log_every or max(1, steps // 60), eval_every=args.eval_every or max(1, steps // 6),
        eval_batch_size=256).validate()
    return config, schedule, data


def routing_summary(model, data) -> dict:
    """Per modality and MoE layer on the test pairs: success rate, every expert's share of top-1 choices, the
    busiest expert's share and the experts covering 90% of them (LIMoE App. B.2)."""
    import numpy as np

    from moe_course.analysis.modality import measure_routing

    summary = {}
    for key, value in measure_routing(model, data, "test", batch_size=256).items():
        if key.startswith("success/"):
            summary[key] = round(value, 4)
        else:
            shares = np.sort(value)[::-1]
            layer = key.removeprefix("shares/")
            summary[f"busiest/{layer}"] = round(float(shares[0]), 4)
            summary[f"experts90/{layer}"] = int(np.searchsorted(np.cumsum(shares), 0.9 - 1e-6) + 1)
            summary[f"shares/{layer}"] = [round(float(x), 4) for x in value]
    return summary


def curves(history: list[dict]) -> dict:
    """The logged history reduced to what the sweep reads: one list of [step, value] per metric."""
    keys = ["loss", "loss_max"] + sorted(k for k in history[0] if k.startswith(CURVE_PREFIXES))
    out = {key: [[h["step"], round(h[key], 4)] for h in history] for key in keys}
    out["val_zero_shot"] = [[h["step"], round(h["val_accuracy"], 4)] for h in history if "val_accuracy" in h]
    return out


def main(argv=None) -> dict:
    args = parse(argv)
    import numpy as np

    from moe_course.analysis.flops import flops_per_image
    from moe_course.analysis.zero_shot import evaluate_contrastive

    config, schedule, data = configs(args)
    result, seconds = train_timed(config, schedule, data)
    test = evaluate_contrastive(result.model, data, "test", batch_size=256)
    test_pairs = data.get("test", np.arange(data.split_size("test")))
    row = dict(kind=args.kind, variant=variant(args), seed=args.seed,
               options={k: v for k, v in vars(args).items() if k not in ("kind", "out", "seed")},
               config={f: getattr(config, f) for f in MODEL_OPTIONS.values()} | {"placement": config.placement},
               schedule=dict(steps=schedule.steps, batch=schedule.batch_size, lr=schedule.learning_rate),
               flops=flops_per_image(config), params=parameter_count(result.model),
               image_tokens=(config.image_size // config.patch_size) ** 2,
               text_tokens=round(float(test_pairs["text_mask"].sum(-1).mean()), 2),
               test_zero_shot=round(test["zero_shot_accuracy"], 4),
               **{f"test_{k}": round(test[k], 4) for k in ("i2t_recall@1", "t2i_recall@1", "i2t_recall@5",
                                                           "t2i_recall@5")},
               routing=routing_summary(result.model, data) if result.model.moe_layers() else {},
               curves=curves(result.history), train_seconds=round(seconds, 1))
    return record(row, args.out)


if __name__ == "__main__":
    main()
