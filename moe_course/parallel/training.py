"""What the one training loop needs to run sharded: the checks of a mesh against a run, and the placement of
the training state (parameters, optimizer state, batches, keys) on the mesh by the rules of ``sharding``."""

from __future__ import annotations

from typing import Any

import jax
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding

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


def _abstract_model(model_config, mesh: Mesh, seed: int) -> nnx.Module:
    """``build_model(model_config)`` as shapes only (``nnx.eval_shape``), switched to ``mesh`` (``use_mesh``)."""
    from moe_course.models import build_model

    abstract = nnx.eval_shape(lambda: build_model(model_config, rngs=nnx.Rngs(seed)))
    return use_mesh(abstract, mesh)


def _state_layout(abstract: nnx.Module, mesh: Mesh, tx) -> tuple[nnx.GraphDef, Any, Any, Any, tuple]:
    """(graphdef, abstract params, abstract rest, abstract optimizer state, (param, rest, opt shardings))."""
    param_shardings = named_shardings(param_partition_specs(abstract, mesh), mesh)
    graphdef, params, rest = nnx.split(abstract, nnx.Param, ...)
    opt_state = jax.eval_shape(tx.init, params)
    # Adam's moments of a parameter are laid out like it; counters and other non-parameter leaves replicated.
    opt_shardings = optax.tree_map_params(tx, lambda _, sharding: sharding, opt_state, param_shardings,
                                          transform_non_params=lambda _: replicated(mesh),
                                          is_leaf=lambda x: isinstance(x, NamedSharding))
    rest_shardings = jax.tree.map(lambda _: replicated(mesh), rest)
    return graphdef, params, rest, opt_state, (param_shardings, rest_shardings, opt_shardings)


def abstract_training_state(model_config, mesh: Mesh, tx, *, seed: int = 0) -> tuple[nnx.GraphDef, Any, Any, Any,
                                                                                      tuple]:
    """The training state ``init_training_state`` would create, as ``jax.ShapeDtypeStruct`` leaves carrying their
    ``NamedSharding`` on ``mesh``: nothing is allocated, so a model of any size can be compiled ahead of time
    (``parallel.plan``) on compile-only devices.

    Returns (graphdef, params, rest, opt_state, (param shardings, optimizer state shardings)), the trees of
    ``shard_training_state``. Raises ValueError naming ``num_experts`` when the experts do not split over the
    mesh's expert axis."""
    graphdef, params, rest, opt_state, (param_sh, rest_sh, opt_sh) = _state_layout(
        _abstract_model(model_config, mesh, seed), mesh, tx)
    with_sharding = lambda tree, shardings: jax.tree.map(  # noqa: E731
        lambda leaf, sharding: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding), tree, shardings)
    return (graphdef, with_sharding(params, param_sh), with_sharding(rest, rest_sh),
            with_sharding(opt_state, opt_sh), (param_sh, opt_sh))


def init_training_state(model_config, mesh: Mesh, tx, *, seed: int = 0) -> tuple[nnx.GraphDef, Any, Any, Any,
                                                                                  tuple]:
    """A fresh ``build_model(model_config, rngs=nnx.Rngs(seed))`` and ``tx``'s optimizer state, created sharded on
    ``mesh`` by one ``jax.jit(init, out_shardings=...)`` (big_vision's train.py): every device computes only its
    own shards, and no process ever holds the whole model in host memory (``shard_training_state`` builds it
    on the host first). The values equal ``shard_training_state(build_model(...), mesh, tx)``'s.

    Returns (graphdef, params, rest, opt_state, (param shardings, optimizer state shardings)), as
    ``shard_training_state``. Raises ValueError naming ``num_experts`` when the experts do not split over the
    mesh's expert axis (before any compilation)."""
    from moe_course.models import build_model

    graphdef, _, _, _, (param_sh, rest_sh, opt_sh) = _state_layout(_abstract_model(model_config, mesh, seed),
                                                                   mesh, tx)

    def init():  # use_mesh writes the same sharding metadata into the Params as into the layout's tree
        _, params, rest = nnx.split(use_mesh(build_model(model_config, rngs=nnx.Rngs(seed)), mesh), nnx.Param, ...)
        return params, rest, tx.init(params)

    params, rest, opt_state = jax.jit(init, out_shardings=(param_sh, rest_sh, opt_sh))()
    return graphdef, params, rest, opt_state, (param_sh, opt_sh)


def shard_training_state(model: nnx.Module, mesh: Mesh, tx) -> tuple[nnx.GraphDef, Any, Any, Any, tuple]:
    """For a model that already exists (loaded or upcycled weights; a fresh run uses ``init_training_state``):
    split ``model`` for the training loop with every array on ``mesh``: expert-parallel MoE layers
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
