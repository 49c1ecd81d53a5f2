"""What returning attention maps costs: MultiHeadAttention forward+backward with and without its maps.

Prints milliseconds per call for both, measured side by side in one run, and their ratio. A-MoD needs the
maps; every other model takes the fused path. Usage: python benchmarks/attention.py [--batch 128]
"""

from __future__ import annotations

import argparse
import time

import jax
from flax import nnx

from moe_course.layers.attention import MultiHeadAttention


def _time_ms(fn, *args, repeats: int) -> float:
    jax.block_until_ready(fn(*args))  # compile
    start = time.perf_counter()
    for _ in range(repeats):
        out = fn(*args)
    jax.block_until_ready(out)
    return (time.perf_counter() - start) / repeats * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--tokens", type=int, nargs="+", default=[36, 64, 196])
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    attn = MultiHeadAttention(args.width, args.heads, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(attn)
    print(f"device: {jax.devices()[0].device_kind}; batch {args.batch}, width {args.width}, heads {args.heads}")
    print(f"{'tokens':>6} {'fused ms':>9} {'maps ms':>9} {'maps/fused':>10}")
    for tokens in args.tokens:
        x = jax.random.normal(jax.random.key(0), (args.batch, tokens, args.width))

        def loss(params, x, maps):
            out = nnx.merge(graphdef, params)(x, return_attention=maps)
            return (out[0] if maps else out).sum()

        fused = jax.jit(jax.grad(lambda p, x: loss(p, x, False)))
        with_maps = jax.jit(jax.grad(lambda p, x: loss(p, x, True)))
        t_fused = _time_ms(fused, params, x, repeats=args.repeats)
        t_maps = _time_ms(with_maps, params, x, repeats=args.repeats)
        print(f"{tokens:>6} {t_fused:>9.2f} {t_maps:>9.2f} {t_maps / t_fused:>10.2f}")


if __name__ == "__main__":
    main()
