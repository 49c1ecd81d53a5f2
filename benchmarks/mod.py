"""What Mixture-of-Depths saves: an MoD block at capacity C against the full encoder block it wraps.

Forward+backward (gradients w.r.t. the parameters and the input) of ``MoDBlock`` at each capacity, with the
standard router (A-MoD Eq. 1-2) and with attention routing on given previous-layer maps (Eq. 3-5), next to
the dense ``EncoderBlock`` of the same size on all tokens. The MoD block gathers its ``round(C * P)`` tokens,
runs the whole block on them and scatters the update back, so attention costs (C P)^2 and the MLP C P.
Defaults are ViT-S/16 (width 384, 6 heads, MLP 1536, 197 tokens with the class token). All numbers are
measured side by side in one run, in turns.
Usage: python benchmarks/mod.py [--capacities 0.5 0.125] [--quick]
"""

from __future__ import annotations

import jax
from flax import nnx
from sizes import SizedParser

from moe_course.analysis.timing import best_ms
from moe_course.layers import EncoderBlock, MoDBlock

DEFAULTS = dict(batch=32, tokens=197, width=384, heads=6, mlp_dim=1536, repeats=5, rounds=3)
QUICK = dict(batch=2, tokens=17, width=32, heads=2, mlp_dim=64, repeats=1, rounds=1)


def _step(block, x, previous):
    """A jitted forward+backward of ``block`` (params, x) -> grads; ``previous``: maps for attention routing."""
    graphdef, params = nnx.split(block)

    def loss(params, x):
        module = nnx.merge(graphdef, params)
        y = module(x, previous_attention=previous)[0] if isinstance(module, MoDBlock) else module(x)[0]
        return y.sum()

    return jax.jit(jax.grad(loss, argnums=(0, 1))), params


def main() -> None:
    parser = SizedParser(__doc__.splitlines()[0], DEFAULTS, QUICK)
    for name in DEFAULTS:
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, help=f"{name} {parser.size(name)}")
    parser.add_argument("--capacities", type=float, nargs="+", default=[0.5, 0.125], help="C values")
    args = parser.parse_args()
    print(f"device: {jax.devices()[0].platform} ({jax.devices()[0].device_kind}), {len(jax.devices())} device(s)")
    x = jax.random.normal(jax.random.key(0), (args.batch, args.tokens, args.width))
    previous = jax.nn.softmax(jax.random.normal(jax.random.key(1), (args.batch, args.heads, args.tokens, args.tokens)))
    size = dict(width=args.width, heads=args.heads, mlp_dim=args.mlp_dim)
    calls = {"full": _step(EncoderBlock(**size, rngs=nnx.Rngs(0)), x, None)}
    for c in args.capacities:
        for router in ("standard", "attention"):
            block = MoDBlock(**size, capacity=c, router=router, keep_first=True, num_tokens=args.tokens,
                             rngs=nnx.Rngs(0))
            calls[f"{router} {c}"] = _step(block, x, previous)
    calls = {name: (fn, (params, x)) for name, (fn, params) in calls.items()}
    ms = best_ms(calls, repeats=args.repeats, rounds=args.rounds)
    print(f"\nMoD block vs full block, forward+backward: batch {args.batch} x {args.tokens} tokens, width "
          f"{args.width}, {args.heads} heads, MLP {args.mlp_dim}")
    print(f"{'router':>9} {'capacity':>8} {'tokens':>6} {'ms':>9} {'MoD/full':>8}")
    print(f"{'(full)':>9} {1.0:>8} {args.tokens:>6} {ms['full']:>9.2f} {1.0:>8.2f}")
    for c in args.capacities:
        for router in ("standard", "attention"):
            kept = max(1, round(c * args.tokens))
            t = ms[f"{router} {c}"]
            print(f"{router:>9} {c:>8} {kept:>6} {t:>9.2f} {t / ms['full']:>8.2f}")


if __name__ == "__main__":
    main()
