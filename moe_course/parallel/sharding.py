"""Where every array lives on a mesh: the sharding rules of the course's models, batches and training state.

Rules (GShard; V-MoE Sec. 2.4, App. B):
- expert weights -- every parameter of an ``Experts`` module, leading axis E -- are split over the ``expert``
  axis: device coordinate j along it holds experts j*E/n ... (j+1)*E/n - 1 of every MoE layer;
- every other parameter (patch embedding, attention, LayerNorms, routers, dense MLPs, heads, Soft MoE's
  slot parameters) is replicated: each device holds a full copy, and the gradient is averaged over the
  devices that compute it (data parallelism);
- a batch is split along its first axis over all mesh axes, so every device holds different images.
This covers every model family at once (ViT, V-MoE, Soft MoE, MoD/A-MoD, LIMoE): the rule looks for the
``Experts`` modules, wherever a family puts them. The rules are written into each parameter's Flax NNX
sharding metadata, so ``nnx.get_partition_spec`` shows them.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from moe_course.layers.experts import Experts
from moe_course.layers.moe import SparseMoE
from moe_course.parallel.expert_parallel import ExpertParallel
from moe_course.parallel.mesh import EXPERT, axis_size, batch_axes, check_experts

# Flax NNX has renamed the sharding metadata across versions ("sharding" -> "sharding_names" -> "out_sharding");
# ``nnx.get_partition_spec`` reads whichever its version uses. We set every name it may read.
_SHARDING_METADATA = ("sharding_names", "sharding", "out_sharding")


def expert_module_paths(model: nnx.Module) -> list[tuple]:
    """The graph paths of every ``Experts`` module in ``model`` (e.g. ``('blocks', 1, 'mlp', 'experts')``)."""
    return [tuple(path) for path, node in nnx.iter_graph(model) if isinstance(node, Experts)]


def expert_spec(ndim: int, mesh: Mesh) -> P:
    """PartitionSpec of an expert weight of ``ndim`` axes (leading axis E): split over ``expert`` if present."""
    return P(EXPERT, *([None] * (ndim - 1))) if axis_size(mesh, EXPERT) > 1 else P()


def param_partition_specs(model: nnx.Module, mesh: Mesh) -> nnx.State:
    """The PartitionSpec of every parameter of ``model`` (an ``nnx.State`` shaped like
    ``nnx.state(model, nnx.Param)``): expert weights over the ``expert`` axis, everything else replicated (``P()``)."""
    experts = expert_module_paths(model)

    def spec(path, leaf):
        keys = tuple(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k))) for k in path)
        inside = any(keys[:len(prefix)] == prefix for prefix in experts)
        return expert_spec(len(np.shape(leaf)), mesh) if inside else P()  # also a ShapeDtypeStruct

    return jax.tree_util.tree_map_with_path(spec, nnx.state(model, nnx.Param))


def annotate(model: nnx.Module, mesh: Mesh) -> nnx.Module:
    """Write the sharding rules into every parameter's NNX sharding metadata (in place) and return ``model``.

    Afterwards ``nnx.get_partition_spec(nnx.state(model, nnx.Param))`` gives ``param_partition_specs``.
    """
    specs = param_partition_specs(model, mesh)
    for (path, variable), (_, spec) in zip(nnx.to_flat_state(nnx.state(model, nnx.Param)),
                                           nnx.to_flat_state(specs)):
        names = tuple(spec) + (None,) * (len(variable.get_value().shape) - len(spec))
        for name in _SHARDING_METADATA:
            variable.set_metadata(name, names)
    return model


def annotated_specs(model: nnx.Module) -> dict[str, P]:
    """{"blocks/1/mlp/experts/fc1_kernel": PartitionSpec, ...}: each parameter's spec as Flax NNX reads it from
    the sharding metadata (``nnx.get_partition_spec``; written by ``annotate``). Unannotated: all None."""
    specs = nnx.to_flat_state(nnx.get_partition_spec(nnx.state(model, nnx.Param)))
    unwrap = lambda spec: spec.get_value() if isinstance(spec, nnx.Variable) else spec  # noqa: E731
    return {"/".join(map(str, path)): unwrap(spec) for path, spec in specs}


def named_shardings(specs: Any, mesh: Mesh) -> Any:
    """A tree of PartitionSpecs -> the same tree of ``NamedSharding(mesh, spec)``."""
    return jax.tree.map(lambda spec: NamedSharding(mesh, spec), specs, is_leaf=lambda x: isinstance(x, P))


def replicated(mesh: Mesh) -> NamedSharding:
    """Every device holds the whole array."""
    return NamedSharding(mesh, P())


def batch_sharding(mesh: Mesh, ndim: int = 1) -> NamedSharding:
    """Axis 0 (the batch) split over every mesh axis; the other ``ndim - 1`` axes whole."""
    return NamedSharding(mesh, P(batch_axes(mesh), *([None] * (ndim - 1))))


def put(value, sharding: NamedSharding) -> jax.Array:
    """``value`` (numpy or a jax array holding the full, global value on every process) as a global array laid
    out by ``sharding``. Each process fills only the shards of its own devices, so this also works when the
    mesh spans several processes (``jax.distributed``), unlike ``jax.device_put``."""
    if isinstance(value, jax.Array) and value.sharding == sharding:
        return value
    if isinstance(value, jax.Array) and jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key):
        data = put(jax.random.key_data(value), sharding)
        return jax.random.wrap_key_data(data, impl=jax.random.key_impl(value))
    host = np.asarray(value)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def put_tree(tree: Any, shardings: Any) -> Any:
    """``put`` for every leaf of ``tree``; ``shardings`` is one NamedSharding or a matching tree of them."""
    if isinstance(shardings, NamedSharding):
        return jax.tree.map(lambda leaf: put(leaf, shardings), tree)
    return jax.tree.map(put, tree, shardings)


def shard_batch(batch: dict[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
    """A batch dict of numpy arrays (the same full batch on every process) split over the mesh by images."""
    return {name: put(value, batch_sharding(mesh, np.ndim(value))) for name, value in batch.items()}


def state_shardings(tree: Any, mesh: Mesh) -> Any:
    """The sharding to keep for every leaf of ``tree`` (optimizer state, ...): its own if it already lives on
    ``mesh`` (e.g. Adam's moments, created like their parameters), else replicated."""
    def keep(leaf):
        sharding = getattr(leaf, "sharding", None)
        if isinstance(sharding, NamedSharding) and sharding.mesh == mesh:
            return sharding
        return replicated(mesh)
    return jax.tree.map(keep, tree)


def use_mesh(model: nnx.Module, mesh: Mesh | None) -> nnx.Module:
    """Tell every sparse MoE layer of ``model`` to run expert-parallel on ``mesh`` (None: back to one device):
    each gets ``mesh`` and, when the mesh has an ``expert`` axis, an ``ExpertParallel`` as its ``expert_apply``;
    annotate the parameters with their partition specs. Returns ``model`` (changed in place).
    Raises ValueError naming ``num_experts`` when any layer's experts (sparse or soft) do not split over the
    expert axis (before anything is changed or placed)."""
    if mesh is not None:  # every Experts module (SparseMoE, Soft MoE, LIMoE), leading axis E
        for _, node in nnx.iter_graph(model):
            if isinstance(node, Experts):
                check_experts(node.fc1_kernel.shape[0], axis_size(mesh, EXPERT))
    layers = [node for _, node in nnx.iter_graph(model) if isinstance(node, SparseMoE)]
    expert_apply = ExpertParallel(mesh) if mesh is not None and EXPERT in mesh.axis_names else None
    for layer in layers:
        layer.mesh, layer.expert_apply = mesh, expert_apply
    return annotate(model, mesh) if mesh is not None else model


def shard_model(model: nnx.Module, mesh: Mesh) -> nnx.Module:
    """``use_mesh`` and then place every array of ``model`` on ``mesh`` by the rules (in place; returns it).
    Raises ValueError naming ``num_experts`` when the experts do not split over the mesh's expert axis."""
    use_mesh(model, mesh)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    params = put_tree(params, named_shardings(param_partition_specs(model, mesh), mesh))
    rest = put_tree(rest, replicated(mesh))
    nnx.update(model, params, rest)
    return model


def expert_and_shared_params(model_config) -> tuple[int, int]:
    """(parameters inside Experts modules, all other parameters) of ``build_model(model_config)``, counted from
    shapes only (nothing allocated). On a mesh with an expert axis of n devices, a device holds
    ``shared + expert / n`` parameters (4 bytes each in float32; Adam's two moments triple it in training)."""
    import math

    from moe_course.models import build_model

    abstract = nnx.eval_shape(lambda: build_model(model_config, rngs=nnx.Rngs(0)))
    total = sum(math.prod(v.shape) for v in jax.tree.leaves(nnx.state(abstract, nnx.Param)))
    experts = sum(math.prod(v.shape) for _, node in nnx.iter_graph(abstract) if isinstance(node, Experts)
                  for v in jax.tree.leaves(nnx.state(node, nnx.Param)))
    return experts, total - experts
