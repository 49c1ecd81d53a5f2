"""What the one training loop needs to run sharded: the checks of a mesh against a run, and the placement of
the training state (parameters, optimizer state, batches, keys) on the mesh by the rules of ``sharding``."""

from __future__ import annotations

from typing import Any

from flax import nnx
from jax.sharding import Mesh

from moe_course.parallel.mesh import EXPERT, axis_size, batch_shards, check_experts, format_mesh
from moe_course.parallel.process_share import check_process_split
from moe_course.parallel.sharding import (
    named_shardings, param_partition_specs, put_tree, replicated, state_shardings, use_mesh,
)


def check_mesh_fits(mesh: Mesh, model_config, train_config) -> None:
    """Raise ValueError (before any compilation) when a run cannot be split over ``mesh``: the model's
    ``num_experts`` not divisible by the expert axis, or a ``batch_size`` / ``eval_batch_size`` that is not a
    multiple of (images per routing group) x (devices) -- every device routes whole groups of its own images.
    On a mesh over several processes the message names the processes first (each reads whole groups of its
    own images, ``process_share``)."""
    check_experts(getattr(model_config, "num_experts", None), axis_size(mesh, EXPERT))
    group = getattr(model_config, "group_size", 1)
    unit = group * batch_shards(mesh)
    processes = len({device.process_index for device in mesh.devices.flat})
    for name in ("batch_size", "eval_batch_size"):
        value = getattr(train_config, name)
        if processes > 1:
            check_process_split(name, value, group, processes)
        if value % unit:
            raise ValueError(f"{name}={value} does not split over mesh {format_mesh(mesh)!r}: it must be a multiple "
                             f"of group_size x devices = {unit}")


def shard_training_state(model: nnx.Module, mesh: Mesh, tx) -> tuple[nnx.GraphDef, Any, Any, Any, tuple]:
    """Split ``model`` for the training loop with every array on ``mesh``: expert-parallel MoE layers
    (``use_mesh``, in place), parameters by ``param_partition_specs``, the rest replicated, and ``tx``'s
    optimizer state laid out like the parameters it tracks (Adam's moments of an expert weight are split
    like that weight; counters replicated).

    Returns (graphdef, params, rest, opt_state, (param shardings, optimizer state shardings)).
    """
    use_mesh(model, mesh)
    param_shardings = named_shardings(param_partition_specs(model, mesh), mesh)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    params = put_tree(params, param_shardings)
    rest = put_tree(rest, replicated(mesh))
    opt_state = tx.init(params)  # zeros_like keeps each parameter's sharding
    opt_shardings = state_shardings(opt_state, mesh)
    return graphdef, params, rest, put_tree(opt_state, opt_shardings), (param_shardings, opt_shardings)
