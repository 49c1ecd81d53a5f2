"""Measured cost: wall-clock time of compiled calls taken side by side, and the Soft MoE / Tokens Choice sweep
over the number of experts at a fixed number of slots (Puigcerver et al., Fig. 6 right).

Timings depend on the machine and its load; only ratios measured in one run, in turn, are meaningful.
"""

from __future__ import annotations

import time
import warnings
from typing import Callable

import jax
from flax import nnx

from moe_course.layers.moe import SparseMoE
from moe_course.layers.soft_moe import SoftMoE
from moe_course.routing import CapacityRoundingWarning
from moe_course.routing.checks import check_int


def time_ms(fn: Callable, *args, repeats: int, warm_up: bool = True) -> float:
    """Mean wall time of ``fn(*args)`` in milliseconds over ``repeats`` calls, after one untimed warm-up call
    (which compiles a jitted function) unless ``warm_up`` is False."""
    if warm_up:
        jax.block_until_ready(fn(*args))
    start = time.perf_counter()
    for _ in range(repeats):
        out = fn(*args)
    jax.block_until_ready(out)
    return (time.perf_counter() - start) / repeats * 1e3


def best_ms(calls: dict, *, repeats: int, rounds: int) -> dict:
    """Time the calls {name: (fn, args)} in turn, ``rounds`` times over; the fastest round of each, in ms.

    Taking turns and the minimum keeps a burst of load from another process off the ratios.
    """
    return {name: min(times) for name, times in rounds_ms(calls, repeats=repeats, rounds=rounds).items()}


def rounds_ms(calls: dict, *, repeats: int, rounds: int) -> dict[str, list[float]]:
    """Time the calls {name: (fn, args)} in turn, ``rounds`` times over: {name: [mean ms of each round]}.

    Each call is warmed up (compiled) once before the first round, so every round is a timed one; all calls
    see the same load because they alternate. Take the median of a list for a typical time, its spread for
    how much the load moved the numbers.
    """
    for fn, args in calls.values():
        jax.block_until_ready(fn(*args))
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, (fn, args) in calls.items():
            times[name].append(time_ms(fn, *args, repeats=repeats, warm_up=False))
    return times


def grad_step(module: nnx.Module) -> tuple[Callable, tuple]:
    """(jitted fn, params): fn(params, x) = the gradients of sum(output) (+ aux loss) w.r.t. the parameters and
    x -- one forward+backward pass of ``module`` (an MLP, or a layer returning an MoEOutput)."""
    graphdef, params = nnx.split(module)

    def loss(params, x):
        out = nnx.merge(graphdef, params)(x)
        return out.sum() if isinstance(out, jax.Array) else out.output.sum() + out.aux_loss

    return jax.jit(jax.grad(loss, argnums=(0, 1))), params


def expert_sweep_layers(num_experts: int, width: int, hidden: int, slots: int, tokens: int) -> dict[str, nnx.Module]:
    """The two layers of Fig. 6 (right) at ``num_experts`` E, with the same expert work per image:

    "soft": SoftMoE with ``slots`` slots per image in total (slots_per_expert = slots / E);
    "tokens_choice": SparseMoE, top-1 of E, routing groups of one image, capacity ratio slots / tokens, so
    its E buffers hold ``slots`` token slots per image in total (B = slots / E).
    Raises ValueError unless E divides ``slots``.
    """
    num_experts = check_int("num_experts", num_experts)
    if slots % num_experts:
        raise ValueError(f"num_experts={num_experts} does not divide slots={slots}; use a divisor")
    rngs = nnx.Rngs(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CapacityRoundingWarning)
        return {
            "soft": SoftMoE(width, hidden, num_experts, slots_per_expert=slots // num_experts, rngs=rngs),
            "tokens_choice": SparseMoE(width, hidden, num_experts, k=1, capacity_ratio=slots / tokens, group_size=1,
                                       rngs=rngs),
        }


def expert_sweep(experts: list[int], *, batch: int, tokens: int, width: int, hidden: int, slots: int,
                 repeats: int = 3, rounds: int = 2) -> dict[str, dict[int, float]]:
    """Forward+backward milliseconds of Soft MoE and Tokens Choice as the number of experts grows at a fixed
    number of slots / buffer size (Fig. 6 right): {"soft": {E: ms}, "tokens_choice": {E: ms}}.

    x: (batch, tokens, width) float32 normal. All layers, of every E, are timed in turn (``best_ms``) for
    ``rounds`` rounds, so the growth from the first E to the last is measured under the same load as the
    ratio of the two layers at one E.
    """
    x = jax.random.normal(jax.random.key(0), (batch, tokens, width))
    calls = {(name, e): (fn, (params, x)) for e in experts
             for name, layer in expert_sweep_layers(e, width, hidden, slots, tokens).items()
             for fn, params in [grad_step(layer)]}
    times: dict[str, dict[int, float]] = {"soft": {}, "tokens_choice": {}}
    for (name, e), ms in best_ms(calls, repeats=repeats, rounds=rounds).items():
        times[name][e] = ms
    return times
