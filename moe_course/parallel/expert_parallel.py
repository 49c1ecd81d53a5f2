"""Expert parallelism: the experts of an MoE layer live on different devices, and tokens travel to them.

V-MoE (Sec. 2.4, App. B) and GShard split the E experts of every MoE layer over the devices of the
``expert`` mesh axis, n of them, E / n experts each, while every device holds different images. Routing
needs no communication: a routing group is a few images, all on one device, so each device routes its own
groups with the ordinary single-device functions (router -> capacity -> vanilla/BPR allocation) and fills
one capacity-padded buffer per expert, (groups, E, B, D). Then, inside ``jax.shard_map``:

1. dispatch (local): tokens -> buffers ``(g, E, B, D)`` on the device that holds the tokens;
2. all-to-all: the E axis is cut into n blocks of E / n experts; block j goes to device j of the expert
   axis, and each device stacks what it receives along the group axis: ``(n * g, E / n, B, D)`` -- every
   group of the n devices, but only for the experts this device holds;
3. the local experts run on their buffers (one batched matmul per weight, as on one device);
4. all-to-all back: the inverse exchange returns ``(g, E, B, D)`` to the devices that own the tokens;
5. combine (local): each token sums its served choices' outputs, weighted by their gates.

Every buffer has the same padded size B whether full or not, so the exchange is a fixed-size
``jax.lax.all_to_all`` that runs on every backend, CPU devices included. (``jax.lax.ragged_all_to_all`` sends
only the filled slots, but XLA:CPU does not implement it.) Each device sends (n - 1) / n of its buffers
each way per MoE layer: ``2 * (n - 1) / n * g * E * B * D`` numbers (``all_to_all_bytes``).

The routing decisions are those of the single-device layer exactly: the same groups (consecutive images),
the same router noise (drawn for the whole batch from the same key), the same allocation functions.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
from flax import nnx
from jax.sharding import Mesh, PartitionSpec as P

from moe_course.layers.experts import Experts
from moe_course.parallel.mesh import EXPERT, axis_size, batch_axes, batch_shards, check_experts
from moe_course.routing import Allocation, apply_experts


def check_groups(num_groups: int, mesh: Mesh, group_size: int) -> None:
    """Raise ValueError naming ``batch`` unless the routing groups split evenly over the mesh's devices."""
    shards = batch_shards(mesh)
    if num_groups % shards:
        raise ValueError(f"batch of {num_groups * group_size} images = {num_groups} routing groups of {group_size} "
                         f"does not split over the {shards} devices of the mesh; use a batch that is a multiple "
                         f"of group_size * devices = {group_size * shards}")


def exchange(buffers: jax.Array, *, back: bool = False) -> jax.Array:
    """The all-to-all of expert parallelism, inside ``shard_map`` over a mesh with an ``expert`` axis of size n.

    Forward: buffers (g, E, B, D) of this device's groups for every expert -> (n * g, E / n, B, D): every
    device's buffers for this device's E / n experts, source device i in rows i*g ... (i+1)*g - 1.
    back=True: the inverse, (n * g, E / n, B, D) -> (g, E, B, D).
    """
    if back:
        return jax.lax.all_to_all(buffers, EXPERT, split_axis=0, concat_axis=1, tiled=True)
    return jax.lax.all_to_all(buffers, EXPERT, split_axis=1, concat_axis=0, tiled=True)


def apply_experts_parallel(x: jax.Array, allocation: Allocation, experts: Experts, mesh: Mesh, *,
                           implementation: str = "gather", deterministic: bool = True,
                           key: jax.Array | None = None, group_size: int = 1) -> jax.Array:
    """``routing.apply_experts`` with the experts split over the mesh's ``expert`` axis (steps 1-5 above).

    x: (groups, tokens, dim) float32, all routing groups of the batch (a global array; groups are split over
    every mesh axis). allocation: its ``Allocation`` (same groups). experts: the layer's ``Experts``, whose
    weights have leading axis E, split over ``expert`` (``parallel.shard_model``). key: for expert dropout in
    training (masks drawn per device, so they differ from a one-device run; without dropout the output equals
    the one-device layer's). group_size: images per routing group (for the error message).
    Returns (groups, tokens, dim_out), laid out like x.
    Raises ValueError naming ``batch`` when the groups do not split over the devices, and naming
    ``num_experts`` when the experts do not split over the expert axis.
    """
    check_groups(x.shape[0], mesh, group_size)
    check_experts(allocation.num_experts, axis_size(mesh, EXPERT))
    graphdef, state = nnx.split(experts)
    groups_spec, expert_weights = P(batch_axes(mesh)), P(EXPERT)
    use_key = key is not None and not deterministic and experts.drop.rate > 0

    def per_device(x, allocation, state, key):
        local_experts = nnx.merge(graphdef, state)  # this device's E / n experts
        rngs = None
        if use_key:
            device = jax.lax.axis_index(batch_axes(mesh))
            rngs = nnx.Rngs(dropout=jax.random.fold_in(key, device))

        def expert_fn(buffers):  # (g, E, B, D): this device's groups, every expert
            inbox = exchange(buffers)  # (n*g, E/n, B, D): every device's tokens for my experts
            return exchange(local_experts(inbox, deterministic=deterministic, rngs=rngs), back=True)

        return apply_experts(x, allocation, expert_fn, implementation=implementation)

    run = jax.shard_map(per_device, mesh=mesh, in_specs=(groups_spec, groups_spec, expert_weights, P()),
                        out_specs=groups_spec)
    return run(x, allocation, state, key if use_key else jax.random.key(0))


@dataclass(frozen=True)
class ExpertParallel:
    """What ``use_mesh`` hands a ``SparseMoE`` layer as its ``expert_apply``: run the layer's experts split over
    ``mesh``'s ``expert`` axis (``apply_experts_parallel``). Frozen and compared by mesh, so jitted functions
    see the same static layer for the same mesh."""

    mesh: Mesh

    def __call__(self, groups: jax.Array, routed: Allocation, layer, *, deterministic: bool = True,
                 rngs: nnx.Rngs | None = None) -> jax.Array:
        dropout = not deterministic and rngs is not None and layer.experts.drop.rate > 0
        return apply_experts_parallel(groups, routed, layer.experts, self.mesh, implementation=layer.dispatch,
                                      deterministic=deterministic, key=rngs.dropout() if dropout else None,
                                      group_size=layer.group_size)


def all_to_all_elements(groups_per_device: int, num_experts: int, capacity: int, dim: int, expert_devices: int) -> int:
    """Numbers one device sends to the other devices of its expert axis in one MoE layer, forward pass:
    both exchanges, ``2 * (n - 1) / n * g * E * B * D`` (the block for its own experts stays put)."""
    n = expert_devices
    return 2 * (n - 1) * groups_per_device * (num_experts // n) * capacity * dim


def all_to_all_bytes(groups_per_device: int, num_experts: int, capacity: int, dim: int, expert_devices: int,
                     *, itemsize: int = 4) -> int:
    """``all_to_all_elements`` in bytes (``itemsize`` 4 for float32)."""
    return itemsize * all_to_all_elements(groups_per_device, num_experts, capacity, dim, expert_devices)
