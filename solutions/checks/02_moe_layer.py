"""Checks of assignment 02: the inputs each answer is called on, and the course library's reference.

Runs in two places: in the grading sandbox (only ``cases``: the inputs, drawn from the grading seed, with NumPy
alone) and in the grader (``reference``, with the library: ``moe_course.routing`` for TOP-k, the capacity, the
vanilla allocation, dispatch and combine (the einsum implementation), the losses and the debug task's gates;
``moe_course.layers`` for the experts, the whole ``SparseMoE`` and its router gradient). Parameter trees are drawn
here as plain nested dicts of NumPy arrays with the paths and shapes of ``nnx.to_pure_dict(nnx.state(SparseMoE(...),
nnx.Param))``, and the references load them into the library's modules, one compiled computation per case
(``references.run_module``). The sandbox gets this file without the references (``moe_course.course.limits.inputs``).
See ``moe_course.course.inside.answers``.
"""

import numpy as np

from moe_course.course.inside.answers import Check


def _normal(rng, *shape):
    return rng.normal(size=shape).astype(np.float32)


# 1. top_k_routing: k = 1, 2, 3 of 5 experts, and logits rounded to integers (many ties: the lower expert first).
def _topk_cases(rng):
    cases = [(_normal(rng, 2, 9, 5), k) for k in (1, 2, 3)]
    return cases + [(np.round(rng.normal(size=(1, 6, 4)), 0).astype(np.float32), 2)]  # ties


def _top_k(logits, k):
    from moe_course.course.instructor.references import run_compiled
    from moe_course.routing import top_k_routing

    routed = run_compiled(top_k_routing, logits, k=k)
    return np.asarray(routed.expert_index), np.asarray(routed.gates)


# 2. expert_capacity: the library's rounding (halves up, float slack, at least 1).
def _capacity_cases(rng):
    tokens = [int(t) for t in rng.integers(5, 60, size=3)] + [40]
    return [(k, t, c, e) for k in (1, 2) for t in tokens for c in (0.1, 0.25, 0.5, 1.05, 1.5) for e in (2, 4, 8)
            if k <= e]


def _capacity(k, tokens, capacity_ratio, num_experts):
    import warnings

    from moe_course.routing import expert_capacity

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return expert_capacity(k, tokens, capacity_ratio, num_experts)


# 3. The predicted number of tokens of 16 that an all-zero router leaves without an expert (E = 4, k = 2, C = 1,
# vanilla): no inputs; the reference routes them with the library's SparseMoE.
def _unserved():
    from flax import nnx

    from moe_course.course.instructor.references import run_module
    from moe_course.layers import SparseMoE

    make = lambda: SparseMoE(8, 16, 4, k=2, capacity_ratio=1.0, group_size=1, allocation="vanilla", rngs=nnx.Rngs(0))
    params = {"router": {"kernel": np.zeros((8, 4), np.float32)},
              "experts": {name: np.ones(shape, np.float32) for name, shape in (
                  ("fc1_kernel", (4, 8, 16)), ("fc1_bias", (4, 16)), ("fc2_kernel", (4, 16, 8)), ("fc2_bias", (4, 8)))}}
    tokens = np.ones((1, 16, 8), np.float32)
    served = np.asarray(run_module(make, params, lambda layer, x: layer(x).routing.served, tokens))
    return int((~served.any(-1)).sum())


def _choices(rng, groups, tokens, k, num_experts):
    """(groups, tokens, k) int32: k distinct experts per token, drawn."""
    return np.stack([rng.permutation(num_experts)[:k] for _ in range(groups * tokens)]).reshape(
        groups, tokens, k).astype(np.int32)


# 4. allocate: TOP-1 to TOP-3 choices, buffers from 1 slot to more than every choice needs; and all tokens choosing
# the same experts (every buffer overflows). The reference is the library's vanilla allocation's slots.
def _allocate_cases(rng):
    cases = [(_choices(rng, 2, 12, k, 5), capacity, 5) for k, capacity in ((1, 2), (2, 3), (3, 1), (2, 30))]
    same = np.broadcast_to(rng.permutation(4)[:2].astype(np.int32), (1, 10, 2)).copy()
    return cases + [(same, 4, 4)]


def _allocate(expert_index, capacity, num_experts):
    from moe_course.course.instructor.references import run_compiled
    from moe_course.routing import vanilla_allocation

    gates = np.ones(expert_index.shape, np.float32)
    return np.asarray(run_compiled(vanilla_allocation, expert_index, gates, capacity=capacity,
                                num_experts=num_experts).slot)


def _slots(rng, expert_index, capacity, num_experts):
    """Slots for drawn choices, filled in a random order of the choices (not the vanilla order: an allocation
    of its own, so that dispatch and combine are checked apart from task 4); -1 where the buffer was full."""
    groups, tokens, k = expert_index.shape
    slot = np.full(expert_index.shape, -1, np.int32)
    for g in range(groups):
        used = np.zeros(num_experts, np.int32)
        for flat in rng.permutation(tokens * k):
            t, j = divmod(int(flat), k)
            e = expert_index[g, t, j]
            if used[e] < capacity:
                slot[g, t, j], used[e] = used[e], used[e] + 1
    return slot


def _routed_cases(rng):
    """(expert_index, slot, num_experts, capacity) of a few shapes, some choices dropped."""
    cases = []
    for groups, tokens, k, experts, capacity in ((2, 8, 2, 4, 3), (1, 10, 1, 3, 2), (3, 5, 3, 4, 4)):
        index = _choices(rng, groups, tokens, k, experts)
        cases.append((index, _slots(rng, index, capacity, experts), experts, capacity))
    return cases


def _allocation(expert_index, slot, num_experts, capacity, gates=None):
    from moe_course.routing import Allocation

    gates = np.ones(expert_index.shape, np.float32) if gates is None else gates
    return Allocation(expert_index, gates, slot, None, num_experts, capacity)


# 5. dispatch: the library's one-hot einsum dispatch of drawn tokens.
def _dispatch_cases(rng):
    return [(_normal(rng, index.shape[0], index.shape[1], 6), index, slot, experts, capacity)
            for index, slot, experts, capacity in _routed_cases(rng)]


def _dispatch(x, expert_index, slot, num_experts, capacity):
    from moe_course.course.instructor.references import run_compiled
    from moe_course.routing import einsum_dispatch

    return np.asarray(run_compiled(einsum_dispatch, x, _allocation(expert_index, slot, num_experts, capacity)))


# 6. combine: drawn expert outputs and gates; the library's one-hot einsum combine.
def _combine_cases(rng):
    return [(_normal(rng, index.shape[0], experts, capacity, 5), index, slot, rng.random(index.shape).astype(np.float32))
            for index, slot, experts, capacity in _routed_cases(rng)]


def _combine(expert_outputs, expert_index, slot, gates):
    from moe_course.course.instructor.references import run_compiled
    from moe_course.routing import einsum_combine

    _, experts, capacity, _ = expert_outputs.shape
    return np.asarray(run_compiled(einsum_combine, expert_outputs, _allocation(expert_index, slot, experts, capacity,
                                                                            gates)))


# 7. experts: drawn expert trees (nonzero biases) and buffers; the library's Experts (exact GELU).
def _experts_params(rng, num_experts, width, hidden):
    return {"fc1_kernel": _normal(rng, num_experts, width, hidden) / np.float32(np.sqrt(width)),
            "fc1_bias": 0.3 * _normal(rng, num_experts, hidden),
            "fc2_kernel": _normal(rng, num_experts, hidden, width) / np.float32(np.sqrt(hidden)),
            "fc2_bias": 0.3 * _normal(rng, num_experts, width)}


def _experts_cases(rng):
    return [(_experts_params(rng, e, d, h), 2 * _normal(rng, g, e, b, d)) for g, e, b, d, h in ((2, 4, 3, 6, 12),
                                                                                            (1, 3, 5, 8, 4))]


def _experts(params, buffers):
    from flax import nnx

    from moe_course.course.instructor.references import run_module
    from moe_course.layers.experts import Experts

    num_experts, width, hidden = params["fc1_kernel"].shape
    return np.asarray(run_module(lambda: Experts(num_experts, width, hidden, rngs=nnx.Rngs(0)), params,
                                 lambda module, b: module(b), buffers))


# 8-9. the losses.
def _importance(logits):
    from moe_course.course.instructor.references import run_compiled
    from moe_course.routing import importance_loss

    return float(run_compiled(importance_loss, logits))


def _load_cases(rng):
    cases = []
    for k in (1, 2):
        clean = _normal(rng, 2, 12, 5)
        cases.append((clean, clean + 0.2 * _normal(rng, *clean.shape), k, 0.2))
    return cases


def _load_loss(logits, noisy_logits, k, sigma):
    from moe_course.course.instructor.references import run_compiled
    from moe_course.routing import load_loss

    return float(run_compiled(load_loss, logits, noisy_logits, k=k, noise_std=sigma))


# 10. sparse_gates (the debug task): the library's TOP-k gates, zero elsewhere (TOP-1 among the cases).
def _sparse_gates(logits, k):
    from moe_course.course.instructor.references import run_compiled
    from moe_course.routing import top_k_routing

    routed = run_compiled(top_k_routing, logits, k=k)
    gates = np.zeros(logits.shape, np.float32)
    np.put_along_axis(gates, np.asarray(routed.expert_index), np.asarray(routed.gates), axis=-1)
    return gates


# 11-12. The whole layer: drawn SparseMoE trees (router scaled so that some experts are popular and choices are
# dropped), tokens of several batches, group sizes, k and capacity ratios; the reference is the library's
# SparseMoE (vanilla allocation, evaluation: no noise) with the drawn parameters.
def _layer_params(rng, width, hidden, num_experts):
    return {"router": {"kernel": 1.5 * _normal(rng, width, num_experts) / np.float32(np.sqrt(width))},
            "experts": _experts_params(rng, num_experts, width, hidden)}


_LAYERS = ((4, 6, 8, 16, 4, 2, 1.0, 2), (2, 5, 6, 12, 3, 1, 1.5, 1), (6, 4, 8, 8, 5, 3, 0.5, 3))


def _layer_cases(rng):
    return [(_layer_params(rng, d, h, e), _normal(rng, b, t, d), k, c, g) for b, t, d, h, e, k, c, g in _LAYERS]


def _library_layer(params, k, capacity_ratio, group_size, order, function, *arrays):
    """``function(layer, *arrays)`` for the library's SparseMoE (vanilla allocation) with the drawn tree
    ``params``, as one compiled computation (``references.run_module``)."""
    import warnings

    from flax import nnx

    from moe_course.course.instructor.references import run_module
    from moe_course.layers import SparseMoE

    width, num_experts = params["router"]["kernel"].shape
    hidden = params["experts"]["fc1_kernel"].shape[-1]
    make = lambda: SparseMoE(width, hidden, num_experts, k=k, capacity_ratio=capacity_ratio,  # noqa: E731
                             group_size=group_size, allocation="vanilla", router_order=order, rngs=nnx.Rngs(0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return run_module(make, params, function, *arrays)


def _layer(params, x, k, capacity_ratio, group_size, order="softmax_then_topk"):
    out = _library_layer(params, k, capacity_ratio, group_size, order, lambda layer, tokens: layer(tokens), x)
    return np.asarray(out.output), np.asarray(out.routing.served), float(out.aux_loss)


def _gradient_cases(rng):
    cases = []
    for b, t, d, h, e, _, c, g in _LAYERS[:2]:
        x = _normal(rng, b, t, d)
        params, w = _layer_params(rng, d, h, e), _normal(rng, b, t, d)
        cases += [(params, x, w, c, g, order) for order in ("softmax_then_topk", "topk_then_softmax")]
    return cases


def _gradient(params, x, w, capacity_ratio, group_size, order):
    import jax.numpy as jnp
    from flax import nnx

    grad = nnx.grad(lambda model, tokens: jnp.sum(model(tokens).output * w))
    grads = _library_layer(params, 1, capacity_ratio, group_size, order, grad, x)
    return np.asarray(nnx.to_pure_dict(grads)["router"]["kernel"])


def _traced(*static):
    """``call`` of the layer's checks: the learner's function compiled with jax.jit, the arguments at ``static``
    (k, the capacity ratio, the group size, the order) fixed. The function must be traceable anyway (task 12
    differentiates it), and eager dispatch of a whole layer on every drawn shape took the sandbox past its memory
    limit. Computes nothing itself."""
    def call(function, *args):
        import jax

        return jax.jit(function, static_argnums=static)(*args)

    return call


_FLOAT = {"rtol": 1e-4, "atol": 1e-5}
CHECKS = {
    "topk_tests": Check(_topk_cases, _top_k, rtol=1e-5, atol=1e-6),
    "capacity_tests": Check(_capacity_cases, _capacity, exact=True, scalar=True),
    "unserved_tests": Check(lambda rng: [()], _unserved, exact=True, scalar=True),  # a prediction: no inputs
    "allocate_tests": Check(_allocate_cases, _allocate, exact=True),
    "dispatch_tests": Check(_dispatch_cases, _dispatch, **_FLOAT),
    "combine_tests": Check(_combine_cases, _combine, **_FLOAT),
    "experts_tests": Check(_experts_cases, _experts, **_FLOAT),
    "importance_tests": Check(lambda rng: [(rng.normal(scale=s, size=(3, 10, 6)).astype(np.float32),)
                                           for s in (0.5, 2.0)], _importance, rtol=1e-4, atol=0.0, scalar=True),
    "load_tests": Check(_load_cases, _load_loss, rtol=2e-3, atol=1e-6, scalar=True),
    "gates_tests": Check(_topk_cases, _sparse_gates, rtol=1e-5, atol=1e-6),
    "layer_tests": Check(_layer_cases, _layer, **_FLOAT, call=_traced(2, 3, 4)),
    "gradient_tests": Check(_gradient_cases, _gradient, rtol=1e-4, atol=1e-5, call=_traced(3, 4, 5)),
}
