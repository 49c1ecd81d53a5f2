"""Checks of assignment 07: the inputs each answer is called on, and the course library's reference.

Runs in two places: in the grading sandbox (``cases``, the inputs, drawn from the grading seed, and ``call``,
which runs the learner's function on CPU devices and turns what it did into arrays) and in the grader
(``reference``, with the library and JAX). See ``moe_course.course.inside.answers``. Apart from ``Check``, only the
``reference`` functions import ``moe_course`` (inside their bodies).

The learner's exchanges and layer run in the sandbox inside ``jax.shard_map`` over a mesh of n CPU devices
(``_mesh``): the notebook's setup cell asks JAX for 4 before it starts them (``jax_num_cpu_devices``, which
overrides the grading kernel's XLA_FLAGS). The grader may have one device, so the references do without a mesh:
the library's ``parallel.exchange`` under ``jax.vmap`` with a named axis (JAX runs the same collective over it,
on one device; tests/test_parallel.py checks it equals ``shard_map`` on 8 devices), and for the layer the
one-device ``SparseMoE`` (vanilla allocation, evaluation), which the expert-parallel layer must equal.
"""

import numpy as np

from moe_course.course.inside.answers import Check


def _normal(rng, *shape):
    return rng.normal(size=shape).astype(np.float32)


def _mesh(devices):
    """A mesh of the first ``devices`` CPU devices with one axis, ``expert`` (in the sandbox)."""
    import jax

    cpus = jax.devices("cpu")
    if len(cpus) < devices:
        raise RuntimeError(f"{devices} CPU devices needed, JAX has {len(cpus)}: run the setup cell first")
    return jax.sharding.Mesh(np.array(cpus[:devices]), ("expert",))


# exchange_tests: (to_experts, to_owners), each run per device inside shard_map over n devices, against the
# library's exchange there and back. buffers (n, g, E, B, D) and inbox (n, n * g, E/n, B, D): device d's are [d].

def _exchange_cases(rng):
    cases = []
    for n, g, experts, capacity, width in [(2, 1, 4, 3, 2), (4, 3, 8, 2, 3), (4, 1, 4, 1, 4), (1, 2, 3, 2, 2)]:
        cases.append((_normal(rng, n, g, experts, capacity, width),
                      _normal(rng, n, n * g, experts // n, capacity, width)))
    return cases


def _exchange_call(functions, buffers, inbox):
    """Each function on the devices' arrays laid end to end along axis 0 (device d's are rows d*m ... (d+1)*m - 1
    of the global array), split over the mesh and back into (n, ...)."""
    import jax

    mesh, spec = _mesh(len(buffers)), jax.sharding.PartitionSpec("expert")
    outputs = []
    for function, per_device in zip(functions, (buffers, inbox)):
        joined = per_device.reshape(-1, *per_device.shape[2:])
        out = jax.jit(jax.shard_map(function, mesh=mesh, in_specs=spec, out_specs=spec))(joined)
        outputs.append(np.asarray(out).reshape(len(per_device), -1, *out.shape[1:]))
    return tuple(outputs)


def _exchange(buffers, inbox):
    import functools

    import jax

    from moe_course.parallel import EXPERT, exchange

    there = jax.vmap(exchange, axis_name=EXPERT)
    back = jax.vmap(functools.partial(exchange, back=True), axis_name=EXPERT)
    return np.asarray(there(buffers)), np.asarray(back(inbox))


# layer_tests: expert_parallel_layer(params, x, k, capacity_ratio, group_size, mesh) on n devices against the
# library's one-device SparseMoE with the drawn parameters: 1 to 3 routing groups per device, k = 1 to 3,
# capacity ratios that drop choices; the router scaled so that some experts are popular.

_LAYERS = ((4, 16, 5, 6, 12, 8, 2, 1.0, 2), (2, 4, 6, 8, 8, 4, 1, 1.5, 1), (4, 12, 4, 4, 8, 4, 3, 0.5, 1),
           (1, 2, 3, 4, 4, 2, 1, 1.0, 2))


def _layer_cases(rng):
    cases = []
    for n, batch, tokens, width, hidden, experts, k, ratio, group_size in _LAYERS:
        params = {"router": {"kernel": 1.5 * _normal(rng, width, experts) / np.float32(np.sqrt(width))},
                  "experts": {"fc1_kernel": _normal(rng, experts, width, hidden) / np.float32(np.sqrt(width)),
                              "fc1_bias": 0.3 * _normal(rng, experts, hidden),
                              "fc2_kernel": _normal(rng, experts, hidden, width) / np.float32(np.sqrt(hidden)),
                              "fc2_bias": 0.3 * _normal(rng, experts, width)}}
        cases.append((params, _normal(rng, batch, tokens, width), k, ratio, group_size, n))
    return cases


def _layer_call(function, params, x, k, capacity_ratio, group_size, devices):
    """The learner's layer on a mesh of ``devices`` CPU devices, compiled once (jax.jit: eager dispatch of a
    whole layer on every drawn shape costs the sandbox memory and time)."""
    import jax

    mesh = _mesh(devices)
    return np.asarray(jax.jit(lambda p, tokens: function(p, tokens, k, capacity_ratio, group_size, mesh))(params, x))


def _layer(params, x, k, capacity_ratio, group_size, devices):
    import warnings

    from flax import nnx

    from moe_course.course.instructor.references import run_module
    from moe_course.layers import SparseMoE

    width, experts = params["router"]["kernel"].shape
    make = lambda: SparseMoE(width, params["experts"]["fc1_kernel"].shape[-1], experts, k=k,  # noqa: E731
                             capacity_ratio=capacity_ratio, group_size=group_size, allocation="vanilla",
                             rngs=nnx.Rngs(0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a capacity that rounds
        return np.asarray(run_module(make, params, lambda layer, tokens: layer(tokens).output, x))


# bytes_tests: mesh_bytes (the port of task 4 fixed) against moe_course.parallel.all_to_all_bytes, with the groups
# per device and the buffer capacity (moe_course.routing.expert_capacity) of the mesh and the layer: meshes with 1
# or 2 rows and 1 to 8 devices per row, capacities that round (a half up) and one below one slot.

def _bytes_cases(rng):
    cases = []
    for data, expert in ((1, 1), (1, 4), (2, 2), (2, 8), (1, 8)):
        for num_experts, k, ratio in ((8, 1, 1.0), (16, 2, 1.25), (32, 2, 0.5), (8, 1, 0.01)):
            tokens, dim = int(rng.integers(8, 80)), int(rng.integers(8, 129))
            total = data * expert * int(rng.integers(1, 4))
            cases.append((total, tokens, num_experts, k, ratio, dim, data, expert, int(rng.choice([2, 4]))))
    return cases


def _bytes_call(function, total, tokens, num_experts, k, ratio, dim, data, expert, itemsize):
    return int(function(total, tokens, num_experts, k, ratio, dim, data, expert, itemsize=itemsize))


def _bytes(total, tokens, num_experts, k, ratio, dim, data, expert, itemsize):
    import warnings

    from moe_course.parallel import all_to_all_bytes
    from moe_course.routing import expert_capacity

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a capacity below one slot warns; the buffer then holds one
        capacity = expert_capacity(k, tokens, ratio, num_experts)
    return all_to_all_bytes(total // (data * expert), num_experts, capacity, dim, expert, itemsize=itemsize)


# mesh_tests: the predicted factor by which one device's bytes change when one row of 8 devices (k = 2, C = 1)
# becomes the mesh data=2 x expert=4 and the layer runs at k = 1, C = 1.25 (16 experts, 16 groups of 64 tokens,
# width 64), checked after task 4: no inputs (the question is fixed); the reference is the library's count.
def _mesh_factor():
    return _bytes(16, 64, 16, 1, 1.25, 64, 2, 4, 4) / _bytes(16, 64, 16, 2, 1.0, 64, 1, 8, 4)


CHECKS = {
    "exchange_tests": Check(_exchange_cases, _exchange, exact=True, call=_exchange_call),
    "layer_tests": Check(_layer_cases, _layer, rtol=1e-4, atol=1e-5, call=_layer_call),
    "bytes_tests": Check(_bytes_cases, _bytes, exact=True, scalar=True, call=_bytes_call),
    "mesh_tests": Check(lambda rng: [()], _mesh_factor, rtol=0.0, atol=1e-3, scalar=True),  # a prediction: no inputs
}
