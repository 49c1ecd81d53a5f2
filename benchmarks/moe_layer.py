"""What sparsity costs: a SparseMoE layer versus a dense MLP of equal active FLOPs, and einsum versus gather dispatch.

Table 1: forward+backward (grad w.r.t. the parameters and the input) of SparseMoE with E experts of hidden
size H, k experts per token, next to a dense MLP of hidden size k*H -- per token the same multiply-adds as
its k experts at capacity ratio C = 1 (at C > 1 the experts also process the padding slots).
Table 2: the routing alone -- ``dispatch`` then ``combine`` with an identity expert, forward+backward
w.r.t. x -- for the one-hot "einsum" reference and the index "gather" implementation, over group sizes:
milliseconds and compiled peak memory (temp + output of XLA's memory analysis). The einsum one-hot
(groups, tokens, experts, capacity) tensor grows quadratically with the group size; a size whose one-hot
tensor (or compiled memory) exceeds --max-onehot-gib is not run.
Table 3: where the experts' product loses time against the dense one. The forward expert product of table 1
(each of E experts multiplies its R = groups x capacity slot rows by its own width x hidden matrix) three ways
with the same FLOPs: the batched einsum of ``Experts`` (E distinct weights), the same R-row product called E
times on one weight (which stays in cache), and one 2-D product of E*R rows (the dense MLP's shape).
All numbers are measured side by side in one run.
Usage: python benchmarks/moe_layer.py [--experts 8 32] [--k 1 2] [--quick]
"""

from __future__ import annotations

import os
import resource
import warnings

import jax
import jax.numpy as jnp
from flax import nnx

from moe_course.analysis.timing import best_ms
from moe_course.layers.mlp import MLP
from moe_course.layers.moe import SparseMoE
from moe_course.routing import CapacityRoundingWarning, allocate, combine, dispatch, expert_capacity, top_k_routing
from sizes import SizedParser

# Sizes of the default run and of --quick (a smoke test); an option given on the command line wins.
DEFAULTS = dict(batch=128, tokens=16, group_size=8, group_tokens=[256, 1024, 4096, 16384], repeats=5, rounds=3)
QUICK = dict(batch=16, tokens=4, group_size=8, group_tokens=[64, 256], repeats=2, rounds=1)
MIB, GIB = 2**20, 2**30


def _peak_mib(compiled) -> float:
    """Temp + output buffers of a compiled executable (arguments excluded), from XLA's memory analysis."""
    stats = compiled.memory_analysis()
    return (stats.temp_size_in_bytes + stats.output_size_in_bytes) / MIB


def _faulted_mib(fn, *args, calls: int = 3) -> float:
    """MiB of fresh memory the kernel had to map per call (minor page faults of this process x page size).

    Output and temporary buffers larger than glibc's mmap threshold are fresh pages on every call; each
    4 KiB page costs a fault and zeroing unless transparent huge pages back them (see benchmarks/README.md)."""
    jax.block_until_ready(fn(*args))
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(calls):
        jax.block_until_ready(fn(*args))
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / calls * resource.getpagesize() / MIB


def _layer_table(args) -> None:
    x = jax.random.normal(jax.random.key(0), (args.batch, args.tokens, args.width))
    group_tokens = args.group_size * args.tokens
    print(f"\nSparseMoE vs dense MLP of equal active FLOPs, forward+backward: batch {args.batch} x {args.tokens} "
          f"tokens, width {args.width}, expert hidden {args.hidden}, C {args.capacity_ratio}, "
          f"{group_tokens} tokens per group, dispatch {args.dispatch!r}")
    print(f"{'experts':>7} {'k':>3} {'capacity':>8} {'dense hidden':>12} {'dense ms':>9} {'moe ms':>9} "
          f"{'moe/dense':>9} {'faulted MiB/call dense, moe':>27}")
    for num_experts in args.experts:
        for k in args.k:
            if k > num_experts:
                print(f"{num_experts:>7} {k:>3} skipped (k > experts)")
                continue
            moe = SparseMoE(args.width, args.hidden, num_experts, k=k, capacity_ratio=args.capacity_ratio,
                            group_size=args.group_size, dispatch=args.dispatch, rngs=nnx.Rngs(0))
            dense = MLP(args.width, k * args.hidden, rngs=nnx.Rngs(0))
            moe_def, moe_params = nnx.split(moe)
            dense_def, dense_params = nnx.split(dense)

            def moe_loss(params, x):
                out = nnx.merge(moe_def, params)(x)
                return out.output.sum() + out.aux_loss

            def dense_loss(params, x):
                return nnx.merge(dense_def, params)(x).sum()

            moe_grad = jax.jit(jax.grad(moe_loss, argnums=(0, 1)))
            dense_grad = jax.jit(jax.grad(dense_loss, argnums=(0, 1)))
            times = best_ms({"dense": (dense_grad, (dense_params, x)), "moe": (moe_grad, (moe_params, x))},
                             repeats=args.repeats, rounds=args.rounds)
            t_dense, t_moe = times["dense"], times["moe"]
            capacity = expert_capacity(k, group_tokens, args.capacity_ratio, num_experts)
            faulted = f"{_faulted_mib(dense_grad, dense_params, x):.0f}, {_faulted_mib(moe_grad, moe_params, x):.0f}"
            print(f"{num_experts:>7} {k:>3} {capacity:>8} {k * args.hidden:>12} {t_dense:>9.2f} {t_moe:>9.2f} "
                  f"{t_moe / t_dense:>9.2f} {faulted:>27}")


def _weights_table(args) -> None:
    print(f"\nforward expert product, width {args.width} x hidden {args.hidden}, same FLOPs three ways: "
          f"E distinct weights (batched einsum) / one weight called E times / one 2-D product of E*R rows")
    print(f"{'experts':>7} {'k':>3} {'rows R':>6} {'weights MiB':>11} {'distinct ms':>11} {'one weight ms':>13} "
          f"{'2-D ms':>8} {'distinct/2-D':>12} {'one weight/2-D':>14}")
    groups = args.batch // args.group_size
    for num_experts in args.experts:
        for k in [k for k in args.k if k <= num_experts]:
            rows = groups * expert_capacity(k, args.group_size * args.tokens, args.capacity_ratio, num_experts)
            kx, kw = jax.random.split(jax.random.key(num_experts * 10 + k))
            x = jax.random.normal(kx, (num_experts, rows, args.width))
            w = jax.random.normal(kw, (num_experts, args.width, args.hidden))
            batched = jax.jit(lambda x, w: jnp.einsum("end,edh->enh", x, w))
            product = jax.jit(jnp.matmul)
            one_weight = lambda slices, w: [product(rows_e, w) for rows_e in slices]
            slices = list(x)  # split before timing: eager slicing would be timed with the products
            times = best_ms({"distinct": (batched, (x, w)), "one": (one_weight, (slices, w[0])),
                             "2d": (product, (x.reshape(-1, args.width), w[0]))},
                            repeats=args.repeats, rounds=args.rounds)
            print(f"{num_experts:>7} {k:>3} {rows:>6} {w.nbytes / MIB:>11.1f} {times['distinct']:>11.2f} "
                  f"{times['one']:>13.2f} {times['2d']:>8.2f} {times['distinct'] / times['2d']:>12.2f} "
                  f"{times['one'] / times['2d']:>14.2f}")


def _dispatch_table(args) -> None:
    num_experts, k = args.experts[0], args.k[0]
    print(f"\neinsum vs gather dispatch+combine (identity experts), forward+backward w.r.t. x: {args.groups} "
          f"group(s), dim {args.width}, E {num_experts}, k {k}, C {args.capacity_ratio}; "
          f"MiB = compiled temp + output")
    print(f"{'tokens':>6} {'capacity':>8} {'gather ms':>9} {'gather MiB':>10} {'einsum ms':>9} {'einsum MiB':>10} "
          f"{'einsum/gather ms':>16} {'einsum/gather MiB':>17}")
    for tokens in args.group_tokens:
        kx, kl = jax.random.split(jax.random.key(tokens))
        x = jax.random.normal(kx, (args.groups, tokens, args.width))
        logits = jax.random.normal(kl, (args.groups, tokens, num_experts))
        capacity = expert_capacity(k, tokens, args.capacity_ratio, num_experts)
        router = top_k_routing(logits, k)
        allocation = allocate(router.expert_index, router.gates, capacity, num_experts, method="vanilla")
        calls, skipped, peak = {}, None, {}
        for impl in ("gather", "einsum"):
            onehot_gib = args.groups * tokens * num_experts * capacity * x.dtype.itemsize / GIB
            if impl == "einsum" and onehot_gib > args.max_onehot_gib:
                skipped = f"skipped ({onehot_gib:.3g} GiB one-hot)"
                continue

            def loss(x, allocation, impl=impl):
                return combine(dispatch(x, allocation, implementation=impl), allocation, implementation=impl).sum()

            compiled = jax.jit(jax.grad(loss)).lower(x, allocation).compile()  # compiling allocates nothing
            peak[impl] = _peak_mib(compiled)
            if impl == "einsum" and peak[impl] * MIB / GIB > args.max_onehot_gib:  # the one-hot's copies add up
                skipped = f"skipped ({onehot_gib:.3g} GiB one-hot, {peak[impl] * MIB / GIB:.3g} GiB compiled)"
                continue
            calls[impl] = (compiled, (x, allocation))
        times = best_ms(calls, repeats=args.repeats, rounds=args.rounds)
        row = f"{tokens:>6} {capacity:>8} {times['gather']:>9.2f} {peak['gather']:>10.2f}"
        if skipped:
            print(f"{row} {skipped}")
            continue
        print(f"{row} {times['einsum']:>9.2f} {peak['einsum']:>10.2f} {times['einsum'] / times['gather']:>16.2f} "
              f"{peak['einsum'] / peak['gather']:>17.2f}")


def main() -> None:
    parser = SizedParser(__doc__.splitlines()[0], DEFAULTS, QUICK)
    sizes = parser.size
    parser.add_argument("--width", type=int, default=64, help="token width (also the dim of table 2)")
    parser.add_argument("--hidden", type=int, default=128, help="expert hidden size H; the dense MLP has k*H")
    parser.add_argument("--experts", type=int, nargs="+", default=[8],
                        help="numbers of experts E (table 1 row per E and k; table 2 uses the first)")
    parser.add_argument("--k", type=int, nargs="+", default=[2], help="experts per token (table 2 uses the first)")
    parser.add_argument("--capacity-ratio", type=float, default=1.05)
    parser.add_argument("--dispatch", choices=("gather", "einsum"), default="gather",
                        help="SparseMoE dispatch of table 1")
    parser.add_argument("--batch", type=int, help=f"images in table 1 {sizes('batch')}")
    parser.add_argument("--tokens", type=int, help=f"tokens per image in table 1 {sizes('tokens')}")
    parser.add_argument("--group-size", type=int, help=f"images per routing group in table 1 {sizes('group_size')}")
    parser.add_argument("--group-tokens", type=int, nargs="+",
                        help=f"tokens per group of table 2 {sizes('group_tokens')}")
    parser.add_argument("--groups", type=int, default=1, help="groups of table 2")
    parser.add_argument("--max-onehot-gib", type=float, default=2.0,
                        help="do not run einsum sizes whose one-hot dispatch tensor, or whose compiled temp + "
                             "output memory, is larger (GiB)")
    parser.add_argument("--repeats", type=int, help=f"timed calls per round {sizes('repeats')}")
    parser.add_argument("--rounds", type=int,
                        help=f"rounds of taking turns; each number is its fastest round {sizes('rounds')}")
    args = parser.parse_args()
    if args.batch % args.group_size:
        parser.error(f"--batch {args.batch} is not a multiple of --group-size {args.group_size}")
    if args.k[0] > args.experts[0]:
        parser.error(f"--k {args.k[0]} is larger than --experts {args.experts[0]} (table 2 uses the first of each)")
    # Small groups round the capacity by more than 1 %; the tables print the capacity that was used.
    warnings.simplefilter("ignore", CapacityRoundingWarning)
    print(f"device: {jax.devices()[0].device_kind}; fastest of {args.rounds} round(s) of {args.repeats} calls, "
          f"taken in turn; GLIBC_TUNABLES={os.environ.get('GLIBC_TUNABLES', '(unset)')}")
    _layer_table(args)
    _dispatch_table(args)
    _weights_table(args)


if __name__ == "__main__":
    main()
