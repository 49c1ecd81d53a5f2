"""Checks of assignment 08: the inputs each answer is called on, and the course library's reference.

Runs in two places: in the grading sandbox (only ``cases`` and ``call``: the inputs, drawn from the grading seed,
with NumPy alone, and the flattening of a returned tree into numbers) and in the grader (``reference``, with the
library: ``VMoEConfig.moe_blocks`` for the placement, ``moe_course.models.upcycling`` for ``expand_tile``, the
whole upcycled tree (``upcycle``) and the carried optimizer moments (``upcycle_optimizer_state``),
``moe_course.routing.token_normalized_weights`` for the debug task, and upcycled V-MoEs run beside their dense ViT
for the prediction). Parameter trees are drawn here as plain nested dicts of NumPy arrays with the paths and
shapes of ``nnx.to_pure_dict(nnx.state(model, nnx.Param))`` of a ViT and of a V-MoE, and the references load them
into the library's modules (``_load``, from shapes alone: ``nnx.eval_shape``). The sandbox gets this file without
the references (``moe_course.course.limits.inputs``). See ``moe_course.course.inside.answers``.
"""

import numpy as np

from moe_course.course.inside.answers import Check

# Flax stays out of the sandbox: a fresh V-MoE's router is given (the ``fresh`` tree), never drawn there. JAX is
# offered: the answers are written in jax.numpy.
SANDBOX_WITHOUT = ("flax",)


def _normal(rng, *shape):
    return rng.normal(size=shape).astype(np.float32)


def _linear(rng, fan_in, fan_out):
    return {"kernel": _normal(rng, fan_in, fan_out) / np.float32(np.sqrt(fan_in)), "bias": 0.2 * _normal(rng, fan_out)}


def _backbone(rng, shape):
    """A dense ViT's tree for ``shape`` = (image_size, patch_size, channels, width, depth, mlp_dim, classes,
    pool), every leaf drawn (the LayerNorms away from their initial ones and zeros)."""
    size, patch, channels, width, depth, mlp, classes, pool = shape
    norm = lambda: {"scale": 1 + 0.2 * _normal(rng, width), "bias": 0.2 * _normal(rng, width)}
    tree = {"patch_embed": {"proj": {"kernel": _normal(rng, patch, patch, channels, width) / np.float32(patch),
                                     "bias": 0.2 * _normal(rng, width)}},
            "pos_embed": 0.5 * _normal(rng, 1, (size // patch) ** 2 + (pool == "cls"), width),
            "blocks": {i: {"norm1": norm(), "norm2": norm(),
                           "attn": {name: _linear(rng, width, width) for name in ("query", "key", "value", "out")},
                           "mlp": {"fc1": _linear(rng, width, mlp), "fc2": _linear(rng, mlp, width)}}
                       for i in range(depth)},
            "norm": norm(), "head": _linear(rng, width, classes)}
    if pool == "cls":
        tree["cls_token"] = 0.5 * _normal(rng, 1, 1, width)
    return tree


def _fresh(rng, shape, num_experts, blocks):
    """A fresh V-MoE's tree: the backbone of ``shape`` drawn anew, the MLP of each block of ``blocks`` an MoE
    layer's (router and ``num_experts`` experts), every leaf drawn."""
    tree = _backbone(rng, shape)
    width, mlp = shape[3], shape[5]
    for i in blocks:
        tree["blocks"][i]["mlp"] = {
            "router": {"kernel": _normal(rng, width, num_experts) / np.float32(np.sqrt(width))},
            "experts": {"fc1_kernel": _normal(rng, num_experts, width, mlp), "fc1_bias": _normal(rng, num_experts, mlp),
                        "fc2_kernel": _normal(rng, num_experts, mlp, width), "fc2_bias": _normal(rng, num_experts, width)}}
    return tree


def _leaves(tree):
    """A nested dict of arrays as three arrays of numbers (the grader compares numbers, at most 64 per case): a
    checksum of its paths (their sorted text's bytes, each times its position), the leaves' shapes (ndim, then
    the shape, for each leaf in that order) and all their values, flattened in that order."""
    flat, pending = {}, [((), tree)]
    while pending:
        path, node = pending.pop()
        if isinstance(node, dict):
            pending.extend(((*path, key), value) for key, value in node.items())
        else:
            flat[repr(path)] = np.asarray(node)
    order = sorted(flat)
    text = np.frombuffer("|".join(order).encode(), np.uint8).astype(np.int64)
    shapes = [n for path in order for n in (flat[path].ndim, *flat[path].shape)]
    return (np.int64((text * np.arange(1, text.size + 1)).sum()), np.array(shapes, np.int64),
            np.concatenate([flat[path].ravel() for path in order]))


def _tree_call(function, *args):
    """``call`` of the tree-returning answers: the returned tree as ``_leaves``. Computes nothing itself."""
    return _leaves(function(*args))


def _load(make, params):
    """The nnx.Module ``make()`` builds, with its parameters the plain dict ``params`` (its paths exactly), built
    from shapes alone (``nnx.eval_shape``: no initialiser runs)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    module = nnx.eval_shape(make)
    state = nnx.state(module, nnx.Param)
    nnx.replace_by_pure_dict(state, jax.tree.map(jnp.asarray, params))
    nnx.update(module, state)
    return module


def _configs(dense, num_experts, blocks):
    """(the ViTConfig of a drawn dense tree, the VMoEConfig of that backbone with ``num_experts`` experts whose
    ``moe_blocks()`` are ``blocks``)."""
    from moe_course.configs.vit import ViTConfig
    from moe_course.configs.vmoe import VMoEConfig

    patch, _, channels, width = dense["patch_embed"]["proj"]["kernel"].shape
    pool = "cls" if "cls_token" in dense else "gap"
    side = int(round(np.sqrt(dense["pos_embed"].shape[1] - (pool == "cls"))))
    vit = ViTConfig(image_size=side * patch, patch_size=patch, channels=channels, width=width,
                    depth=len(dense["blocks"]), heads=1, mlp_dim=dense["blocks"][0]["mlp"]["fc1"]["kernel"].shape[1],
                    num_classes=dense["head"]["kernel"].shape[1], pool=pool)
    placements = [("every-2", 1), ("second-half", 1)] + [("last-n", n) for n in range(1, vit.depth)]
    for placement, last_n in placements:
        config = VMoEConfig(**{f: getattr(vit, f) for f in ("image_size", "patch_size", "channels", "width", "depth",
                                                             "heads", "mlp_dim", "num_classes", "pool")},
                            num_experts=num_experts, placement=placement, moe_last_n=last_n)
        if config.moe_blocks() == tuple(blocks):
            return vit, config
    raise ValueError(f"no placement puts MoE layers in blocks {blocks}")


# 1. moe_blocks: every placement on even and odd depths, last-n with several n.
def _blocks_cases(rng):
    depths = [int(d) for d in rng.integers(2, 13, size=3)] + [1, 12]
    return [(d, p, n) for d in depths for p, n in (("every-2", 1), ("second-half", 1), ("last-n", 1), ("last-n", 2))
            if p != "last-n" or n <= len(range(1, d, 2))]


def _placement(depth, placement, last_n):
    from moe_course.configs.vmoe import VMoEConfig

    return np.array(VMoEConfig(depth=depth, placement=placement, moe_last_n=last_n).moe_blocks(), np.int64)


# 2. expand_tile: arrays of 1 to 4 axes (a bias, a kernel, the patch embedding's), E from 1 to 5.
def _tile_cases(rng):
    return [(_normal(rng, *shape), e) for shape, e in (((7,), 3), ((4, 6), 1), ((5, 3), 5), ((2, 2, 3, 4), 2))]


def _tile(array, num_experts):
    from moe_course.models.upcycling import expand_tile

    return np.asarray(expand_tile(array, num_experts))


# 4. upcycle_params: dense and fresh trees drawn apart (with a class token and without; every-2, last-1, second-half;
# E = 4, 2, 3); the reference is the library's upcycle with its fresh V-MoE the drawn one.
_UPCYCLED = (((8, 4, 3, 12, 4, 24, 5, "cls"), 4, (1, 3)), ((6, 2, 1, 8, 6, 16, 3, "gap"), 2, (5,)),
             ((8, 4, 2, 8, 4, 8, 4, "cls"), 3, (2, 3)))


def _upcycle_cases(rng):
    return [(_backbone(rng, shape), _fresh(rng, shape, e, blocks), blocks) for shape, e, blocks in _UPCYCLED]


def _upcycle_into(dense, config, fresh):
    """upcycle(dense, config) (``dense`` a ViT module), the V-MoE it builds first (``VMoE(config,
    rngs=nnx.Rngs(seed))``) replaced by one with the plain tree ``fresh`` (built from shapes alone): its router is
    the one the library keeps, everything else is what upcycle fills."""
    from unittest import mock

    from flax import nnx

    from moe_course.models import upcycling
    from moe_course.models.vmoe import VMoE

    target = _load(lambda: VMoE(config, rngs=nnx.Rngs(0)), fresh)
    with mock.patch.object(upcycling, "VMoE", lambda *_, **__: target):
        return upcycling.upcycle(dense, config)


def _upcycled(dense, fresh, blocks):
    from flax import nnx

    from moe_course.models.vit import ViT

    vit, config = _configs(dense, fresh["blocks"][blocks[0]]["mlp"]["router"]["kernel"].shape[1], blocks)
    moe = _upcycle_into(_load(lambda: ViT(vit, rngs=nnx.Rngs(0)), dense), config, fresh)
    return _leaves(nnx.to_pure_dict(nnx.state(moe, nnx.Param)))


# 3. The prediction: which of five routings (E = 4, groups of 4 images) keep the dense function. Everything but
# the MoE layers is copied, so the reference compares where the two models differ: the library's SparseMoE of each
# routing, its experts the expand_tile'd MLP of a drawn dense one (moe_course.layers.MLP) and a random router,
# beside that dense MLP, on two groups of 20 drawn tokens (4 images of 5 tokens: the question's model).
_ROUTINGS = (dict(k=1, capacity_ratio=4.0), dict(k=1, router_order="topk_then_softmax", capacity_ratio=4.0),
             dict(k=2, capacity_ratio=4.0), dict(k=4, capacity_ratio=4.0),
             dict(k=1, router_order="topk_then_softmax", capacity_ratio=1.0))


def _exact():
    import warnings

    import jax
    import jax.numpy as jnp
    from flax import nnx

    from moe_course.layers import MLP, SparseMoE
    from moe_course.models.upcycling import expand_tile

    draw = np.random.default_rng(0)
    width, hidden, experts = 12, 24, 4
    mlp = {"fc1": _linear(draw, width, hidden), "fc2": _linear(draw, hidden, width)}
    router = {"kernel": _normal(draw, width, experts) / np.float32(np.sqrt(width))}
    tiled = {f"{layer}_{kind}": np.asarray(expand_tile(mlp[layer][kind], experts))
             for layer in ("fc1", "fc2") for kind in ("kernel", "bias")}
    tokens = jnp.asarray(_normal(draw, 2, 20, width))
    want = np.asarray(_load(lambda: MLP(width, hidden, rngs=nnx.Rngs(0)), mlp)(tokens))

    def upcycled(fields):
        layer = _load(lambda: SparseMoE(width, hidden, experts, group_size=1, rngs=nnx.Rngs(0), **fields),
                      {"router": router, "experts": tiled})
        graph, state = nnx.split(layer)
        return np.asarray(jax.jit(lambda s, x: nnx.merge(graph, s)(x).output)(state, tokens))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tuple(bool(np.abs(upcycled(fields) - want).max() < 1e-4) for fields in _ROUTINGS)


# 5. upcycle_moments: moment trees drawn (nu-like, positive) for the backbones above; the reference is the mu that
# upcycle_optimizer_state carries in an Adam state whose mu and nu are that tree.
def _moments_cases(rng):
    return [(_absolute(_backbone(rng, shape)), e, blocks) for shape, e, blocks in _UPCYCLED]


def _absolute(tree):
    """|tree|, leaf by leaf (a second moment is not negative)."""
    return {key: _absolute(value) if isinstance(value, dict) else np.abs(value) for key, value in tree.items()}


def _moments(moments, num_experts, blocks):
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from moe_course.models.upcycling import upcycle_optimizer_state
    from moe_course.models.vit import ViT
    from moe_course.models.vmoe import VMoE

    vit, config = _configs(moments, num_experts, blocks)
    dense = _load(lambda: ViT(vit, rngs=nnx.Rngs(0)), moments)
    state = nnx.state(dense, nnx.Param)
    adam = optax.ScaleByAdamState(count=jnp.asarray(7, jnp.int32), mu=state, nu=state)
    target = nnx.eval_shape(lambda: VMoE(config, rngs=nnx.Rngs(0)))  # only its shapes are read
    carried = upcycle_optimizer_state((adam, optax.EmptyState()), dense, _load(lambda: target, jax.tree.map(
        lambda leaf: np.zeros(leaf.shape, leaf.dtype), nnx.to_pure_dict(nnx.state(target, nnx.Param)))))
    return _leaves(nnx.to_pure_dict(carried[0].mu))


# 6. token_normalized (the debug task): Experts Choice groups (each expert takes C tokens of its group, some taken
# by several experts, some by none); the reference is the library's token_normalized_weights, scattered back to
# (groups, tokens, experts).
def _normalized_cases(rng):
    cases = []
    for groups, tokens, experts, capacity in ((2, 8, 4, 3), (1, 6, 3, 4), (3, 5, 2, 1)):
        probs = rng.dirichlet(np.ones(experts), size=(groups, tokens))  # each token's router probabilities
        taken = np.zeros((groups, tokens, experts), bool)
        for g in range(groups):
            for e in range(experts):
                taken[g, rng.permutation(tokens)[:capacity], e] = True
        cases.append((probs.astype(np.float32), taken))
    return cases


def _normalized(probs, taken):
    import jax.numpy as jnp

    from moe_course.routing import token_normalized_weights

    groups, tokens, experts = probs.shape
    token_index = np.stack([np.stack([np.flatnonzero(taken[g, :, e]) for e in range(experts)]) for g in range(groups)])
    weights = np.take_along_axis(np.swapaxes(probs, 1, 2), token_index, axis=2)
    normalized = np.asarray(token_normalized_weights(jnp.asarray(token_index), jnp.asarray(weights), tokens))
    out = np.zeros((groups, experts, tokens), np.float32)
    np.put_along_axis(out, token_index, normalized, axis=2)
    return np.swapaxes(out, 1, 2)


CHECKS = {
    "blocks_tests": Check(_blocks_cases, _placement, exact=True, call=lambda f, *a: np.array(f(*a), np.int64)),
    "tile_tests": Check(_tile_cases, _tile, exact=True),
    "exact_tests": Check(lambda rng: [()], _exact, exact=True, scalar=True),  # a prediction: no inputs
    "upcycle_tests": Check(_upcycle_cases, _upcycled, exact=True, call=_tree_call),
    "moments_tests": Check(_moments_cases, _moments, exact=True, call=_tree_call),
    "normalized_tests": Check(_normalized_cases, _normalized, rtol=1e-5, atol=1e-6),
}
