"""Checks of assignment 07: the inputs each answer is called on, and the course library's reference.

Runs in two places: in the grading sandbox (``cases``, the inputs, drawn from the grading seed, and ``call``,
which calls the learner's function and turns what it did into arrays) and in the grader (``reference``,
with the library and JAX). See ``moe_course.course.inside.answers``. Apart from ``Check``, only the ``reference``
functions import ``moe_course`` (inside their bodies).

The grading kernel has ONE device, so the references simulate the n devices of an all-to-all as a named axis
of ``jax.vmap``: JAX runs the same collective over that axis (its batching rule), on one device.
(tests/test_parallel.py checks that ``parallel.exchange`` under such a vmap equals, bit for bit, the same
function inside ``jax.shard_map`` on 8 devices. ``apply_experts_parallel`` on a one-device mesh would not do:
an all-to-all over an axis of size 1 moves nothing.)

Where an answer must raise ValueError, the case ends with ``RAISES`` and its one output is whether the
learner's function raised ValueError (1) or returned (0); the reference says whether the library refuses the
same input. Other cases end with ``RETURNS`` and their outputs are the function's return values.
"""

import numpy as np

from moe_course.course.inside.answers import Check

RETURNS, RAISES = "returns", "raises"  # the last argument of a case: what the function must do
# The answers are NumPy; all_to_all's reference is jax.lax.all_to_all itself, so the grading sandbox of this
# assignment has no JAX to call (moe_course.course.limits.inputs): the primitive cannot answer its own check.
SANDBOX_WITHOUT = ("jax", "jaxlib")


def _raised(function, *args) -> np.ndarray:
    """1 when ``function(*args)`` raises ValueError, 0 when it returns (any other exception propagates)."""
    try:
        function(*args)
    except ValueError:
        return np.array(1)
    return np.array(0)


# all_to_all_tests: all_to_all(per_device, split_axis, concat_axis) against jax.lax.all_to_all(tiled=True).

def _all_to_all_cases(rng):
    cases = [(rng.permutation(4 * 8 * 6).astype(np.float32).reshape(4, 8, 6), 0, 1),  # distinct values
             (rng.normal(size=(2, 6, 4, 3)).astype(np.float32), 1, 0),
             (rng.normal(size=(3, 2, 6, 5)).astype(np.float32), 1, 2),
             (rng.normal(size=(4, 4, 3)).astype(np.float32), 0, 0),
             (rng.normal(size=(1, 2, 3)).astype(np.float32), 0, 1)]  # one device: nothing moves
    return [case + (RETURNS,) for case in cases] + [(rng.normal(size=(4, 6, 2)), 0, 1, RAISES)]  # 6 rows, 4 devices


def _all_to_all_call(function, per_device, split_axis, concat_axis, mode):
    if mode == RAISES:
        return _raised(function, per_device, split_axis, concat_axis)
    return np.asarray(function(per_device, split_axis, concat_axis))


def _all_to_all(per_device, split_axis, concat_axis, mode):
    import jax

    def collective(x):
        return jax.vmap(lambda a: jax.lax.all_to_all(a, "devices", split_axis, concat_axis, tiled=True),
                        axis_name="devices")(x)

    if mode == RAISES:
        return _raised(collective, per_device)
    return np.asarray(collective(per_device))


# exchange_tests: (to_experts, to_owners) against the library's exchange there and back
# (jax.lax.all_to_all over the mesh's "expert" axis, simulated as a vmap axis of that name).

def _exchange_cases(rng):
    cases = []
    for n, g, experts, capacity, width in [(2, 1, 4, 3, 2), (4, 3, 8, 2, 3), (8, 2, 8, 1, 4), (1, 2, 3, 2, 2)]:
        buffers = rng.normal(size=(n, g, experts, capacity, width)).astype(np.float32)
        inbox = rng.normal(size=(n, n * g, experts // n, capacity, width)).astype(np.float32)
        cases.append((buffers, inbox))
    return cases


def _exchange_call(functions, buffers, inbox):
    to_experts, to_owners = functions
    return np.asarray(to_experts(buffers)), np.asarray(to_owners(inbox))


def _exchange(buffers, inbox):
    import functools

    import jax

    from moe_course.parallel import EXPERT, exchange

    there = jax.vmap(exchange, axis_name=EXPERT)
    back = jax.vmap(functools.partial(exchange, back=True), axis_name=EXPERT)
    return np.asarray(there(buffers)), np.asarray(back(inbox))


# home_tests: expert_home(expert, num_experts, devices) for every expert, against the device the library's
# exchange delivers that expert's buffer to; ValueError where the library refuses the mesh (check_experts).

def _home_cases(rng):
    fixed = [(8, 1), (8, 2), (8, 4), (8, 8), (12, 3), (32, 4), (6, 6)]
    drawn = [(int(n * rng.integers(1, 6)), int(n)) for n in rng.integers(2, 7, size=2)]
    refused = [(8, 3), (6, 4), (10, 4)]
    n = int(rng.integers(3, 7))
    refused.append((int(n * rng.integers(1, 5) + rng.integers(1, n)), n))  # not a multiple of n
    return [(e, n, RETURNS) for e, n in fixed + drawn] + [(e, n, RAISES) for e, n in refused]


def _home_call(function, num_experts, devices, mode):
    if mode == RAISES:
        return _raised(function, 0, num_experts, devices)
    return np.array([int(function(e, num_experts, devices)) for e in range(num_experts)])


def _home(num_experts, devices, mode):
    import jax

    from moe_course.parallel import EXPERT, check_experts, exchange

    if mode == RAISES:
        return _raised(check_experts, num_experts, devices)
    # Tag expert e's buffer with e, exchange over n simulated devices, read which device received it.
    tags = np.broadcast_to(np.arange(num_experts, dtype=np.float32)[None, None, :, None, None],
                           (devices, 1, num_experts, 1, 1))
    inbox = np.asarray(jax.vmap(exchange, axis_name=EXPERT)(tags))  # (n, n, E/n, 1, 1)
    home = np.full(num_experts, -1)
    for device in range(devices):
        home[inbox[device, 0, :, 0, 0].astype(int)] = device
    return home


# bytes_tests: mesh_bytes (the port of task 5 fixed) against moe_course.parallel.all_to_all_bytes, with the groups
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
# width 64), checked after task 5: no inputs (the question is fixed); the reference is the library's count.
def _mesh():
    return _bytes(16, 64, 16, 1, 1.25, 64, 2, 4, 4) / _bytes(16, 64, 16, 2, 1.0, 64, 1, 8, 4)


CHECKS = {
    "all_to_all_tests": Check(_all_to_all_cases, _all_to_all, exact=True, call=_all_to_all_call),
    "exchange_tests": Check(_exchange_cases, _exchange, exact=True, call=_exchange_call),
    "home_tests": Check(_home_cases, _home, exact=True, call=_home_call),
    "bytes_tests": Check(_bytes_cases, _bytes, exact=True, scalar=True, call=_bytes_call),
    "mesh_tests": Check(lambda rng: [()], _mesh, rtol=0.0, atol=1e-3, scalar=True),  # a prediction: no inputs
}
