"""A device mesh with named axes ``data`` and ``expert``, built from a spec string such as ``data=2,expert=4``.

The mesh is the picture GShard and V-MoE (Sec. 2.4, App. B) draw of a pod: every device holds different images
(the batch is split over *all* devices), and the E experts of each MoE layer are split over the ``expert`` axis,
E / n_expert per device. Devices that share an ``expert`` coordinate hold the same experts; the ``data`` axis
counts those replicas. An axis of size 1 simply disappears from the mesh (no sharding over it).
"""

from __future__ import annotations

import math
from typing import Sequence

import jax
import numpy as np
from jax.sharding import Mesh

AXES = ("data", "expert")
DATA, EXPERT = AXES


def parse_mesh_spec(spec: str) -> dict[str, int]:
    """``"data=2,expert=4"`` -> {"data": 2, "expert": 4}. Axes left out have size 1.

    Raises ValueError naming ``mesh`` for an unknown axis, a repeated axis, a size that is not a positive
    integer, or text that is not ``name=size`` pairs separated by commas.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"mesh={spec!r} is not a mesh spec; write axis=size pairs such as 'data=2,expert=4' "
                         f"(axes: {', '.join(AXES)})")
    sizes: dict[str, int] = {}
    for part in spec.split(","):
        name, sep, size = (s.strip() for s in part.partition("="))
        if not sep:
            raise ValueError(f"mesh={spec!r}: {part.strip()!r} is not axis=size; write e.g. 'data=2,expert=4'")
        if name not in AXES:
            raise ValueError(f"mesh={spec!r}: unknown axis {name!r}; allowed axes: {', '.join(AXES)}")
        if name in sizes:
            raise ValueError(f"mesh={spec!r}: axis {name!r} is given twice")
        if not size.isdigit() or int(size) < 1:
            raise ValueError(f"mesh={spec!r}: the size of axis {name!r} is {size!r}; it must be a positive integer")
        sizes[name] = int(size)
    return {axis: sizes.get(axis, 1) for axis in AXES}


def default_mesh_sizes(num_devices: int, num_experts: int | None = None) -> dict[str, int]:
    """The mesh used when none is given: the expert axis as large as both the device count and the number of
    experts allow (their greatest common divisor), the remaining devices on the data axis. Without experts
    (a dense model), every device is on the data axis."""
    expert = math.gcd(num_devices, num_experts) if num_experts else 1
    return {DATA: num_devices // expert, EXPERT: expert}


def make_mesh(spec: str | None = None, *, devices: Sequence[jax.Device] | None = None,
              num_experts: int | None = None) -> Mesh:
    """The ``jax.sharding.Mesh`` of ``spec`` over ``devices`` (default: all visible devices, every process).

    spec: ``"data=2,expert=4"``; None uses ``default_mesh_sizes``. Axes of size 1 are left out of the mesh
    (if every axis has size 1, a one-device ``data`` axis remains). num_experts: the model's experts per MoE
    layer, to check that they split evenly over the expert axis.
    Raises ValueError naming ``mesh`` when the axis sizes' product is not the number of devices, or an axis is
    unknown, and naming ``num_experts`` when the experts do not divide evenly -- all before any compilation.
    """
    devices = list(jax.devices() if devices is None else devices)
    sizes = mesh_sizes_for(spec, len(devices), num_experts=num_experts)
    names = tuple(axis for axis in AXES if sizes[axis] > 1) or (DATA,)
    grid = np.asarray(devices, dtype=object).reshape([sizes[axis] for axis in names])
    return Mesh(grid, names)


def mesh_sizes_for(spec: str | None, num_devices: int, *, num_experts: int | None = None,
                   devices_are: str = "visible") -> dict[str, int]:
    """The axis sizes {"data": n_data, "expert": n_expert} of ``spec`` over ``num_devices`` devices (None:
    ``default_mesh_sizes``), checked as ``make_mesh`` checks them, without any device: ValueError naming ``mesh``
    when the sizes' product is not ``num_devices`` (the message says the devices are ``devices_are``, e.g. "in
    topology v5e:2x2") or the spec does not parse, and naming ``num_experts`` when the experts do not split."""
    sizes = default_mesh_sizes(num_devices, num_experts) if spec is None else parse_mesh_spec(spec)
    if math.prod(sizes.values()) != num_devices:
        raise ValueError(f"mesh={format_mesh(sizes)!r} has {math.prod(sizes.values())} devices, but "
                         f"{num_devices} are {devices_are}; the axis sizes must multiply to {num_devices}")
    check_experts(num_experts, sizes[EXPERT])
    return sizes


def check_experts(num_experts: int | None, expert_axis: int) -> None:
    """Raise ValueError naming ``num_experts`` unless the experts split evenly over ``expert_axis`` devices."""
    if num_experts is not None and num_experts % expert_axis:
        raise ValueError(f"num_experts={num_experts} is not divisible by the mesh's expert axis ({expert_axis} "
                         f"devices); use an expert axis that divides {num_experts}")


def axis_size(mesh: Mesh, axis: str) -> int:
    """The size of ``axis`` in ``mesh``; 1 for an axis the mesh does not have (size-1 axes are left out)."""
    return dict(mesh.shape).get(axis, 1)


def mesh_sizes(mesh: Mesh) -> dict[str, int]:
    """{"data": n_data, "expert": n_expert} of a course mesh, 1 for absent axes."""
    return {axis: axis_size(mesh, axis) for axis in AXES}


def format_mesh(sizes: dict[str, int] | Mesh) -> str:
    """{"data": 2, "expert": 4} or a mesh -> ``"data=2,expert=4"`` (the spec that builds it)."""
    sizes = mesh_sizes(sizes) if isinstance(sizes, Mesh) else sizes
    return ",".join(f"{axis}={sizes[axis]}" for axis in AXES)


def batch_axes(mesh: Mesh) -> tuple[str, ...]:
    """The mesh axes a batch is split over: all of them (every device holds different images)."""
    return tuple(mesh.axis_names)


def batch_shards(mesh: Mesh) -> int:
    """How many pieces a batch is cut into: the number of devices in the mesh."""
    return math.prod(dict(mesh.shape).values())
