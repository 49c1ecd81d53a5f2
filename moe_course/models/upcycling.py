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


def upcycle(dense: ViT, config: VMoEConfig, *, seed: int = 0) -> VMoE:
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

    Raises ValueError (``check_upcyclable``) when ``dense`` is not a dense ViT (a V-MoE, an MoD ViT ...) or does
    not fit ``config``, before any parameter is made.
    """
    if type(dense) is not ViT:
        raise ValueError(f"model is a {type(dense).__name__}; upcycling starts from a dense ViT "
                         f"(moe_course.models.ViT) whose every block has an MLP")
    check_upcyclable(dense.config, config)
    moe = VMoE(config, rngs=nnx.Rngs(seed))
    source = {path: variable[...] for path, variable in nnx.to_flat_state(nnx.state(dense, nnx.Param))}
    moe_blocks = set(config.moe_blocks())
    filled = []
    for path, variable in nnx.to_flat_state(nnx.state(moe, nnx.Param)):
        if path[0] == "blocks" and path[1] in moe_blocks and path[2] == "mlp":
            if path[3] == "router":
                continue  # vmoe: an unmatched target keeps its initial value
            layer, kind = path[4].split("_")  # experts.fc1_kernel -> the dense mlp.fc1.kernel
            value = expand_tile(source.pop((*path[:3], layer, kind)), config.num_experts)
        else:
            value = source.pop(path)
        filled.append((path, variable.replace(jnp.asarray(value, variable[...].dtype))))
    if source:  # cannot happen for a ViT of the checked config; a guard against a silently dropped parameter
        raise ValueError(f"dense parameters {sorted(source)[:3]} have no place in {config.name!r}")
    nnx.update(moe, nnx.from_flat_state(filled))
    return moe
