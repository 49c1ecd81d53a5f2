"""What Soft MoE costs: the layer versus a dense MLP of equal FLOPs over batch sizes, and versus Tokens Choice as
the number of experts grows at a fixed number of slots (Puigcerver et al., Fig. 6 right).

Table 1: forward+backward (grad w.r.t. the parameters and the input) of a SoftMoE layer with E experts of
one slot each, at ViT-S/16 sizes by default (197 tokens, width 384, expert hidden 1536, 128 experts), next
to a dense MLP whose hidden size gives the same FLOPs per image (``soft_moe_layer_flops``: the experts on
the slots plus the three routing products). The ratio falls as the batch grows: with one slot per expert,
each expert's weights serve only ``batch`` slot rows, so small batches are bound by reading the E experts'
weights, not by arithmetic. The table says where the ratio crosses 1.5x.
Table 2: SoftMoE (slots / E slots per expert) and Tokens Choice (SparseMoE, top-1, one image per group,
buffers of slots / E) with the same total slots per image, for each E: step times and their growth from the
smallest E. All numbers are measured side by side in one run, in turn, fastest round kept.
Usage: python benchmarks/soft_moe.py [--batches 16 32 64 128] [--experts 8 32 128 256] [--quick]
"""

from __future__ import annotations

import jax
from flax import nnx

from moe_course.analysis.flops import mlp_flops, soft_moe_layer_flops
from moe_course.analysis.timing import best_ms, expert_sweep, grad_step
from moe_course.layers.mlp import MLP
from moe_course.layers.soft_moe import SoftMoE
from sizes import SizedParser

DEFAULTS = dict(batches=[16, 32, 64, 128], tokens=197, width=384, hidden=1536, num_experts=128,
                experts=[8, 32, 128, 256],
                sweep_batch=32, sweep_tokens=64, sweep_width=64, sweep_hidden=256, sweep_slots=256, repeats=3, rounds=2)
QUICK = dict(batches=[2, 4], tokens=8, width=16, hidden=32, num_experts=8, experts=[2, 8], sweep_batch=2,
             sweep_tokens=8, sweep_width=16, sweep_hidden=32, sweep_slots=8, repeats=1, rounds=1)


def _dense_table(args) -> None:
    flops = soft_moe_layer_flops(args.tokens, args.width, args.hidden, args.num_experts)
    dense_hidden = round(flops / mlp_flops(args.tokens, args.width, 1))
    print(f"\nSoftMoE vs dense MLP of equal FLOPs, forward+backward: {args.tokens} tokens, width {args.width}, "
          f"{args.num_experts} experts x 1 slot of hidden {args.hidden}; dense hidden {dense_hidden} "
          f"({flops / 1e6:.1f} MFLOPs forward per image each)")
    print(f"{'batch':>5} {'dense ms':>9} {'soft ms':>9} {'soft/dense':>10}")
    soft_fn, soft_params = grad_step(SoftMoE(args.width, args.hidden, args.num_experts, rngs=nnx.Rngs(0)))
    dense_fn, dense_params = grad_step(MLP(args.width, dense_hidden, rngs=nnx.Rngs(0)))
    crossing = None
    for batch in args.batches:
        x = jax.random.normal(jax.random.key(batch), (batch, args.tokens, args.width))
        times = best_ms({"dense": (dense_fn, (dense_params, x)), "soft": (soft_fn, (soft_params, x))},
                        repeats=args.repeats, rounds=args.rounds)
        ratio = times["soft"] / times["dense"]
        if ratio <= 1.5 and crossing is None:
            crossing = batch
        print(f"{batch:>5} {times['dense']:>9.2f} {times['soft']:>9.2f} {ratio:>10.2f}")
    print(f"smallest batch with soft/dense <= 1.5: {crossing if crossing is not None else 'none measured'}")


def _sweep_table(args) -> None:
    print(f"\nSoft MoE vs Tokens Choice as E grows at {args.sweep_slots} slots per image, forward+backward: batch "
          f"{args.sweep_batch} x {args.sweep_tokens} tokens, width {args.sweep_width}, expert hidden "
          f"{args.sweep_hidden}; growth = time / time at E = {args.experts[0]}")
    times = expert_sweep(args.experts, batch=args.sweep_batch, tokens=args.sweep_tokens, width=args.sweep_width,
                         hidden=args.sweep_hidden, slots=args.sweep_slots, repeats=args.repeats, rounds=args.rounds)
    soft, tokens = times["soft"], times["tokens_choice"]
    first = args.experts[0]
    print(f"{'experts':>7} {'soft ms':>9} {'tc ms':>9} {'soft growth':>11} {'tc growth':>9} {'tc/soft':>7}")
    for e in args.experts:
        print(f"{e:>7} {soft[e]:>9.2f} {tokens[e]:>9.2f} {soft[e] / soft[first]:>11.2f} "
              f"{tokens[e] / tokens[first]:>9.2f} {tokens[e] / soft[e]:>7.2f}")


def main() -> None:
    parser = SizedParser(__doc__.splitlines()[0], DEFAULTS, QUICK)
    for name, kind, nargs, text in [
        ("batches", int, "+", "images per batch of table 1"), ("tokens", int, None, "tokens per image, table 1"),
        ("width", int, None, "token width, table 1"), ("hidden", int, None, "expert hidden size, table 1"),
        ("num_experts", int, None, "experts (one slot each), table 1"), ("experts", int, "+", "E values of table 2"),
        ("sweep_batch", int, None, "images per batch, table 2"), ("sweep_tokens", int, None, "tokens, table 2"),
        ("sweep_width", int, None, "width, table 2"), ("sweep_hidden", int, None, "expert hidden, table 2"),
        ("sweep_slots", int, None, "slots per image (every E must divide it), table 2"),
        ("repeats", int, None, "timed calls per round"), ("rounds", int, None, "rounds of taking turns"),
    ]:
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind, nargs=nargs, help=f"{text} {parser.size(name)}")
    args = parser.parse_args()
    bad = [e for e in args.experts if args.sweep_slots % e]
    if bad:
        parser.error(f"--experts {bad} do not divide --sweep-slots {args.sweep_slots}")
    print(f"device: {jax.devices()[0].device_kind}; fastest of {args.rounds} round(s) of {args.repeats} calls, "
          f"taken in turn")
    _dense_table(args)
    _sweep_table(args)


if __name__ == "__main__":
    main()
