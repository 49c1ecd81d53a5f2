"""What the framework costs: forward+backward of every routed layer in JAX (jit) and in PyTorch (eager).

Each layer is built in Flax NNX, converted to its PyTorch twin (``moe_course.torch``), and both take one
training step's gradient -- of sum(output) (+ aux loss) w.r.t. the parameters and the input -- on the same
input: SparseMoE (V-MoE; gather and one-hot einsum dispatch), SoftMoE, the MoD block with both routers, and
the dense encoder block and MLP for reference. JAX runs jit-compiled (compile time excluded); PyTorch runs
eagerly, as a PyTorch user would call the layer. Both are timed in turns in one run (fastest of ``--rounds``
rounds of ``--repeats`` calls), so only the ratios are meaningful: "torch/jax" > 1 means PyTorch is slower.
Usage: python benchmarks/torch_vs_jax.py [--quick]
"""

from __future__ import annotations

import time
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx
from sizes import SizedParser

from moe_course import layers as jl
from moe_course.analysis.timing import best_ms
from moe_course.routing import CapacityRoundingWarning
from moe_course.torch import layers as tl
from moe_course.torch.convert import torch_state_dict

DEFAULTS = dict(batch=32, tokens=64, width=128, hidden=512, heads=4, experts=8, group_size=8, repeats=5, rounds=3)
QUICK = dict(batch=4, tokens=8, width=16, hidden=32, heads=2, experts=4, group_size=2, repeats=1, rounds=1)


def _layers(a) -> dict[str, tuple]:
    """{name: (NNX layer, the same layer's PyTorch class and constructor arguments, extra call arguments)}."""
    moe = dict(k=2, capacity_ratio=1.05, group_size=a.group_size)
    mod = dict(router="standard", capacity=0.5, keep_first=False, num_tokens=a.tokens)
    out = {
        "dense MLP": (jl.MLP(a.width, a.hidden, rngs=nnx.Rngs(0)), (tl.MLP, (a.width, a.hidden), {})),
        "encoder block": (jl.EncoderBlock(a.width, a.heads, a.hidden, rngs=nnx.Rngs(0)),
                          (tl.EncoderBlock, (a.width, a.heads, a.hidden), {})),
    }
    for dispatch in ("gather", "einsum"):
        settings = dict(moe, dispatch=dispatch)
        out[f"SparseMoE {dispatch}"] = (jl.SparseMoE(a.width, a.hidden, a.experts, rngs=nnx.Rngs(0), **settings),
                                        (tl.SparseMoE, (a.width, a.hidden, a.experts), settings))
    out["SoftMoE"] = (jl.SoftMoE(a.width, a.hidden, a.experts, rngs=nnx.Rngs(0)),
                      (tl.SoftMoE, (a.width, a.hidden, a.experts), {}))
    for router in ("standard", "attention"):
        settings = dict(mod, router=router)
        out[f"MoD {router} C=0.5"] = (jl.MoDBlock(a.width, a.heads, a.hidden, rngs=nnx.Rngs(0), **settings),
                                      (tl.MoDBlock, (a.width, a.heads, a.hidden), settings))
    return out


def _loss_value(out):
    """sum(output) (+ aux loss) of a layer's output: an array, an MoEOutput, or a block's (y, maps, record)."""
    if isinstance(out, tuple) and not hasattr(out, "aux_loss"):
        return out[0].sum()
    if hasattr(out, "aux_loss"):
        return out.output.sum() + out.aux_loss
    return out.sum()


def _jax_step(layer, kwargs):
    """(jitted fn, params): fn(params, x, kwargs) = gradients w.r.t. params and x. ``kwargs`` (the previous
    block's maps for attention routing) are arguments, not constants, so XLA cannot fold the routing away."""
    graphdef, params = nnx.split(layer)

    def loss(params, x, kwargs):
        return _loss_value(nnx.merge(graphdef, params)(x, **kwargs))

    return jax.jit(jax.grad(loss, argnums=(0, 1))), params


def _torch_step(layer, kwargs):
    def step(x):
        x = x.detach().requires_grad_()
        layer.zero_grad(set_to_none=True)
        _loss_value(layer(x, **kwargs)).backward()
        if x.is_cuda:
            torch.cuda.synchronize()
        return None

    return step


def main() -> None:
    parser = SizedParser(__doc__.splitlines()[0], DEFAULTS, QUICK)
    for name in DEFAULTS:
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, help=f"{name} {parser.size(name)}")
    a = parser.parse_args()
    if a.batch % a.group_size:
        parser.error(f"--batch {a.batch} is not a multiple of --group-size {a.group_size}")
    warnings.simplefilter("ignore", CapacityRoundingWarning)
    jax_device = jax.devices()[0]
    print(f"device: JAX {jax_device.platform} ({jax_device.device_kind}), {len(jax.devices())} device(s); "
          f"PyTorch {torch.__version__} cpu, {torch.get_num_threads()} threads")
    x = np.random.default_rng(0).normal(size=(a.batch, a.tokens, a.width)).astype(np.float32)
    maps = jax.nn.softmax(jax.random.normal(jax.random.key(1), (a.batch, a.heads, a.tokens, a.tokens)), axis=-1)
    print(f"\nforward+backward, batch {a.batch} x {a.tokens} tokens, width {a.width}, hidden {a.hidden}, "
          f"{a.experts} experts (k 2, C 1.05, {a.group_size} images per group), fastest of {a.rounds} round(s) "
          f"of {a.repeats} call(s)")
    print(f"{'layer':<22} {'jax ms':>9} {'torch ms':>9} {'torch/jax':>9}")
    for name, (ours, (cls, args, settings), ) in ((n, v[:2]) for n, v in _layers(a).items()):
        twin = cls(*args, **settings)
        twin.load_state_dict(torch_state_dict(ours), strict=True)
        attention = "attention" in name
        jax_kwargs = {"previous_attention": maps} if attention else {}
        torch_kwargs = {"previous_attention": torch.from_numpy(np.array(maps))} if attention else {}
        jax_fn, params = _jax_step(ours, jax_kwargs)
        times = best_ms({"jax": (jax_fn, (params, jnp.asarray(x), jax_kwargs)),
                         "torch": (_torch_step(twin, torch_kwargs), (torch.from_numpy(x),))},
                        repeats=a.repeats, rounds=a.rounds)
        print(f"{name:<22} {times['jax']:>9.2f} {times['torch']:>9.2f} {times['torch'] / times['jax']:>9.2f}")


if __name__ == "__main__":
    start = time.perf_counter()
    main()
    print(f"\ntotal {time.perf_counter() - start:.0f} s")
