"""What LIMoE's sparse layers cost: one training step of the one-tower LIMoE versus the dense one-tower model of
the same backbone, whose active FLOPs per image-text pair are equal up to the router and the combine
(``analysis.flops``; with k = 1 and C = 1 the experts process as many slots as a dense MLP processes tokens).

One step = the course's compiled training step (``train.steps.make_train_step`` with the contrastive
objective): forward, contrastive loss (Eq. 1) + aux losses, backward, AdamW update. Both models are timed side
by side in one run, in turn, fastest round kept; the ratio is what to read.
Usage: python benchmarks/limoe.py [--preset digits-limoe] [--batch 128] [--quick]
"""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from moe_course.analysis.flops import flops_per_image
from moe_course.analysis.timing import best_ms
from moe_course.configs import get_preset
from moe_course.models import build_model
from moe_course.train.config import TrainConfig
from moe_course.train.objectives import CONTRASTIVE
from moe_course.train.optim import make_optimizer
from moe_course.train.steps import make_train_step
from sizes import SizedParser

DEFAULTS = dict(batch=128, image_size=None, repeats=5, rounds=3)
QUICK = dict(batch=16, image_size=16, repeats=1, rounds=1)


def _step(config, batch: dict) -> tuple:
    model = build_model(config, rngs=nnx.Rngs(0))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx = make_optimizer(TrainConfig(steps=10, warmup_steps=1))
    step = make_train_step(graphdef, tx, objective=CONTRASTIVE)
    return step, (params, rest, tx.init(params), batch, jax.random.key(0))


def main() -> None:
    parser = SizedParser(__doc__.splitlines()[0], DEFAULTS, QUICK)
    parser.add_argument("--preset", default="digits-limoe", help="a limoe preset (default digits-limoe)")
    parser.add_argument("--batch", type=int, help=f"image-text pairs per step {parser.size('batch')}")
    parser.add_argument("--image-size", type=int, help=f"override the preset's image size {parser.size('image_size')}")
    parser.add_argument("--repeats", type=int, help=f"timed steps per round {parser.size('repeats')}")
    parser.add_argument("--rounds", type=int, help=f"rounds of taking turns {parser.size('rounds')}")
    args = parser.parse_args()
    limoe = get_preset("limoe", args.preset)
    if args.image_size:
        limoe = limoe.replace(image_size=args.image_size)
    dense = limoe.replace(name=f"{limoe.name}-dense", placement="none")
    rng = np.random.default_rng(0)
    lengths = rng.integers(limoe.seq_len // 2, limoe.seq_len + 1, args.batch)
    text_mask = np.arange(limoe.seq_len)[None] < lengths[:, None]
    batch = {"image": rng.random((args.batch, limoe.image_size, limoe.image_size, limoe.channels), np.float32),
             "text": np.where(text_mask, rng.integers(2, limoe.vocab_size, text_mask.shape), 0).astype(np.int32),
             "text_mask": text_mask}
    flops = {name: flops_per_image(config) for name, config in (("limoe", limoe), ("dense", dense))}
    print(f"device: {jax.devices()[0].device_kind}; fastest of {args.rounds} round(s) of {args.repeats} steps, "
          f"taken in turn")
    print(f"\n{limoe.name}: {len(limoe.moe_blocks())} MoE layers of {limoe.num_experts} experts, k={limoe.k}, "
          f"C={limoe.capacity_ratio}, {limoe.num_patches} image + {limoe.seq_len} text tokens per pair, batch "
          f"{args.batch}")
    times = best_ms({"dense": _step(dense, batch), "limoe": _step(limoe, batch)}, repeats=args.repeats,
                    rounds=args.rounds)
    print(f"{'model':>8} {'MFLOPs/pair':>11} {'step ms':>9}")
    for name in ("dense", "limoe"):
        print(f"{name:>8} {flops[name] / 1e6:>11.3f} {times[name]:>9.2f}")
    print(f"limoe/dense: FLOPs {flops['limoe'] / flops['dense']:.3f}x, step time {times['limoe'] / times['dense']:.2f}x")


if __name__ == "__main__":
    main()
