"""Sparse upcycling (Komatsuzaki et al., ICLR 2023, arXiv 2212.05055): a trained dense ViT becomes a V-MoE.

The paper's Fig. 1: every parameter of the dense checkpoint is copied, except in the blocks that become MoE
layers, whose MLP is copied once per expert, and the router, which the dense model does not have and which
starts from its random initialisation. google-research/vmoe does it with its checkpoint-mapping rules
(``vmoe/initialization/rules.py``): the rule ``(pattern, replacement, 'expand_tile', 0, E)`` turns a dense MLP
array of shape ``s`` into ``(E, *s)`` by ``jnp.expand_dims`` on axis 0 and ``jnp.tile`` with E repetitions there
(``ExpandTileTransformation``); any target array no rule fills, the router's kernel here, keeps the value the
freshly initialised target model gave it (``mapping.map_state_dict`` with ``raise_if_target_unmatched=False``).
vmoe's router kernel (``NoisyTopExpertsPerItemRouter``, a bias-free ``nn.Dense``) starts as Flax's default,
LeCun normal; ours (``SparseMoE.router``, a bias-free ``nnx.Linear``) draws the same law.

What the upcycled model computes at step 0: each MoE layer returns sum over a token's served choices of
gate * MLP(x) = (sum of its served gates) * MLP(x), the experts being identical. So the model computes the dense
model's function exactly where every choice of every token is served and a token's gates sum to one -- top-k
with ``router_order="topk_then_softmax"`` (any k), or k = E -- with a capacity that drops nothing. Otherwise the
MLP's output is scaled per token by the sum of its served gates: with the V-MoE default (top-1 after the
softmax) by the largest router probability, between 1/E and 1 (0.55 on average for E = 4 and unit-variance
tokens, measured in tests/test_upcycle.py); a dropped token gets 0 from the layer (the residual carries it on).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from moe_course.configs.vit import ViTConfig
from moe_course.configs.vmoe import VMoEConfig
from moe_course.models.vit import ViT
from moe_course.models.vmoe import VMoE

# The backbone fields the dense model and the V-MoE must share for the parameters to carry over and the function
# to stay the same; dropout and the computation dtype may differ, and so may the name.
MATCHED_FIELDS = tuple(f.name for f in dataclasses.fields(ViTConfig) if f.name not in ("name", "dropout", "dtype"))


def expand_tile(array: jnp.ndarray, num_experts: int) -> jnp.ndarray:
    """One dense MLP array of shape ``s`` -> ``(num_experts, *s)``, E identical copies: vmoe's
    ``('...', '...', 'expand_tile', 0, num_experts)`` rule (``vmoe/initialization/rules.py``,
    ``ExpandTileTransformation``: ``jnp.expand_dims`` on axis 0, then ``jnp.tile`` with E repetitions there)."""
    array = jnp.expand_dims(jnp.asarray(array), 0)
    return jnp.tile(array, (num_experts,) + (1,) * (array.ndim - 1))


def check_upcyclable(dense_config: ViTConfig, config: VMoEConfig) -> None:
    """Raise ValueError unless a dense ViT of ``dense_config`` upcycles to a V-MoE of ``config``: a sparse-router
    VMoEConfig (validated first), MoE layers only in blocks the dense model has, and the same backbone
    (``MATCHED_FIELDS``: image and patch size, width, depth, heads, MLP width, classes, pooling, GELU, ...).
    The error names the field, both values and what to do. Nothing is built or compiled before it."""
    if type(config) is not VMoEConfig:
        raise ValueError(f"config is a {type(config).__name__}; upcycling builds a V-MoE: pass a VMoEConfig "
                         f"(moe_course.configs.vmoe)")
    config.validate()
    outside = [block for block in config.moe_blocks() if block >= dense_config.depth]
    if outside:
        raise ValueError(f"config {config.name!r} puts MoE layers in blocks {outside}, where the dense model "
                         f"{dense_config.name!r} has no block (depth={dense_config.depth}: blocks 0 to "
                         f"{dense_config.depth - 1}); use a placement within the dense model's depth")
    for field in MATCHED_FIELDS:
        dense_value, value = getattr(dense_config, field), getattr(config, field)
        if dense_value != value:
            raise ValueError(f"{field}={value!r} of config {config.name!r} differs from the dense model's "
                             f"{field}={dense_value!r}; upcycling keeps the dense backbone, so the V-MoE must have "
                             f"the same {field}")


class OptimizerStateMismatch(ValueError):
    """An optimizer state that does not fit the model it is carried to: its moments are not shaped like the
    dense model's parameters (``upcycle``), or the carried state is not the state the run's optimizer keeps
    (``train.train(..., init_opt_state=...)``). The message names the first path that differs."""


def _upcycled_leaves(source: dict, target, moe_blocks: set, num_experts: int, fresh) -> list[tuple[tuple, object]]:
    """(path, value) for every (path, variable) of ``target`` (a V-MoE's flat nnx state): the dense ``source``
    {path: array} entry of the same name, the dense MLP's ``expand_tile``d for an expert array of an MoE block,
    and ``fresh(path, variable)`` for a router. Pops what it uses from ``source`` (the callers check first that
    its names are the dense ViT's). The one mapping of names, for the weights and for their optimizer moments."""
    filled = []
    for path, variable in target:
        if path[0] == "blocks" and path[1] in moe_blocks and path[2] == "mlp":
            if path[3] == "router":
                filled.append((path, fresh(path, variable)))
                continue
            layer, kind = path[4].split("_")  # experts.fc1_kernel -> the dense mlp.fc1.kernel
            value = expand_tile(source.pop((*path[:3], layer, kind)), num_experts)
        else:
            value = source.pop(path)
        filled.append((path, value))
    return filled


def upcycle_optimizer_state(optimizer_state, dense: ViT, moe: VMoE):
    """The dense run's optax state mapped onto the V-MoE ``moe`` that ``upcycle`` built from ``dense``: the
    paper copies the dense optimizer state for its vision models (Komatsuzaki et al. 2023). vmoe's example
    (``vmoe/initialization/mapping.py``, module docstring) maps an old ViT optimizer state into a new V-MoE train
    state but reads only its parameters (``target/vit/...``, the moments left unmatched); here the moments go
    through the same rules as the weights (``_upcycled_leaves``).

    optimizer_state: ``tx.init(params)`` or a later state of any optax optimizer, ``params`` the dense model's
    ``nnx.state(dense, nnx.Param)`` (what ``train.train`` keeps and checkpoints; the ``opt_state`` of
    ``train.restore.load_run(...)``). Every part shaped like the parameters (Adam's ``mu`` and ``nu``, SGD's momentum ``trace``)
    is mapped as the weights are: a dense MLP's moment of shape ``s`` becomes ``(E, *s)`` for each MoE block's
    experts (``expand_tile``), the router's moments are zeros (router kernel shape (width, E), the dtype of the
    block's dense ``fc1`` kernel moment: float32, or bfloat16 under ``mu_dtype="bfloat16"``), every other moment
    is copied in its own dtype. Everything else is copied: Adam's step ``count`` (its bias correction belongs
    to the carried moments) and the learning-rate schedule's step (``optax.ScaleByScheduleState``; a run that
    starts its own schedule afresh resets it with ``train.optim.restart_schedule``, as ``--upcycle-from`` does).

    Raises OptimizerStateMismatch naming the first path whose moment is missing, extra or of another shape than
    the dense parameter, and when the state holds no parameter-shaped part at all.
    """
    dense_params = dict(nnx.to_flat_state(nnx.state(dense, nnx.Param)))
    target = list(nnx.to_flat_state(nnx.state(moe, nnx.Param)))
    moe_blocks = set(moe.config.moe_blocks())
    leaves, treedef = jax.tree.flatten(optimizer_state, is_leaf=lambda x: isinstance(x, nnx.State))
    if not any(isinstance(leaf, nnx.State) for leaf in leaves):
        raise OptimizerStateMismatch(
            f"optimizer_state ({type(optimizer_state).__name__}) holds no part shaped like the dense model's "
            f"parameters; pass the optax state of an optimizer initialised on nnx.state(dense, nnx.Param)")
    mapped = []
    for leaf in leaves:
        if not isinstance(leaf, nnx.State):
            mapped.append(leaf)  # counts and empty states: copied
            continue
        moments = {path: variable[...] for path, variable in nnx.to_flat_state(leaf)}
        _check_moments(moments, dense_params)

        dtypes = {block: moments[("blocks", block, "mlp", "fc1", "kernel")].dtype for block in moe_blocks}

        def fresh(path, variable, dtypes=dtypes):
            return jnp.zeros(variable[...].shape, dtypes[path[1]])

        filled = _upcycled_leaves(moments, target, moe_blocks, moe.config.num_experts, fresh)
        mapped.append(nnx.from_flat_state([(path, variable.replace(value))
                                           for (path, variable), (_, value) in zip(target, filled)]))
    return jax.tree.unflatten(treedef, mapped)


def _check_moments(moments: dict, dense_params: dict) -> None:
    """Raise OptimizerStateMismatch unless ``moments`` has exactly the dense parameters' paths and shapes."""
    for path in sorted(set(moments) | set(dense_params), key=str):
        name = ".".join(map(str, path))
        if path not in dense_params:
            raise OptimizerStateMismatch(f"optimizer_state has a moment at {name}, which the dense model has no "
                                         f"parameter for; pass the state of the dense model's own optimizer")
        if path not in moments:
            raise OptimizerStateMismatch(f"optimizer_state has no moment for the dense parameter {name}; pass the "
                                         f"state of the dense model's own optimizer")
        if moments[path].shape != dense_params[path][...].shape:
            raise OptimizerStateMismatch(
                f"optimizer_state's moment at {name} has shape {tuple(moments[path].shape)}, the dense parameter "
                f"{tuple(dense_params[path][...].shape)}; pass the state of the dense model's own optimizer")


def upcycle(dense: ViT, config: VMoEConfig, *, seed: int = 0, optimizer_state=None):
    """The V-MoE of ``config`` upcycled from the trained dense ViT ``dense`` (the paper's Fig. 1; vmoe's rules).

    dense: a ``moe_course.models.ViT`` (a course run's model, ``train.restore.load_run(...).model``, or a
    big_vision checkpoint, ``moe_course.reference.vit_from_big_vision(path)``). config: its VMoEConfig; which
    blocks are MoE layers is ``config.moe_blocks()`` (the paper upcycles every other MLP layer: placement
    "every-2"). Each expert of an MoE block gets a copy of that block's dense MLP: ``fc1_kernel``
    (E, width, mlp_dim), ``fc1_bias`` (E, mlp_dim), ``fc2_kernel`` (E, mlp_dim, width), ``fc2_bias`` (E, width)
    = ``expand_tile`` of ``mlp.fc1.kernel`` ... ``mlp.fc2.bias``; the router kernel (width, E) is a fresh
    ``VMoE(config, rngs=nnx.Rngs(seed))``'s (LeCun normal); every other parameter is copied unchanged, in the
    config's ``param_dtype``. The dense model is not changed. For what the result computes at step 0, see the
    module docstring.

    optimizer_state: the dense run's optax state (``train.restore.load_run(...).opt_state``), or None. Given,
    it is carried as the weights are (``upcycle_optimizer_state``: moments tiled to the experts, the router's
    zeros, counts copied) and the result is the pair (V-MoE, its optimizer state), to start a run with
    ``train.train(config, ..., init_model=moe, init_opt_state=state)``; None returns the V-MoE alone.

    Raises ValueError (``check_upcyclable``) when ``dense`` is not a dense ViT (a V-MoE, an MoD ViT ...) or does
    not fit ``config``, before any parameter is made; OptimizerStateMismatch (a ValueError) when
    ``optimizer_state`` is not shaped like ``dense``'s parameters.
    """
    if type(dense) is not ViT:
        raise ValueError(f"model is a {type(dense).__name__}; upcycling starts from a dense ViT "
                         f"(moe_course.models.ViT) whose every block has an MLP")
    check_upcyclable(dense.config, config)
    moe = VMoE(config, rngs=nnx.Rngs(seed))
    source = {path: variable[...] for path, variable in nnx.to_flat_state(nnx.state(dense, nnx.Param))}
    target = list(nnx.to_flat_state(nnx.state(moe, nnx.Param)))
    # vmoe: an unmatched target (the router) keeps its initial value
    filled = _upcycled_leaves(source, target, set(config.moe_blocks()), config.num_experts,
                              lambda path, variable: variable[...])
    if source:  # cannot happen for a ViT of the checked config; a guard against a silently dropped parameter
        raise ValueError(f"dense parameters {sorted(source)[:3]} have no place in {config.name!r}")
    nnx.update(moe, nnx.from_flat_state([(path, variable.replace(jnp.asarray(value, variable[...].dtype)))
                                         for (path, variable), (_, value) in zip(target, filled)]))
    if optimizer_state is None:
        return moe
    return moe, upcycle_optimizer_state(optimizer_state, dense, moe)
