"""Checks of assignment 05 (Soft MoE): the inputs each answer is called on, and the course library's reference.

Runs in two places: in the grading sandbox (``cases``: the inputs, drawn from the grading seed, with NumPy
alone) and in the grader (``reference``, with the library: ``moe_course.routing.soft`` for the logits, the
weights and the slot inputs; ``moe_course.layers.Experts``, ``SoftMoE`` and ``EncoderBlock`` for the experts,
the layer and the block). Parameter trees are drawn here as plain nested dicts of NumPy arrays with the paths
and shapes of ``nnx.to_pure_dict(nnx.state(SoftMoE(...), nnx.Param))`` (and of an ``EncoderBlock`` with that
layer as its MLP), and the references load them into the library's modules (``references.run_module``: one
compiled computation per case). Each piece is checked
on its own inputs (the weights on drawn logits, the slot inputs on drawn dispatch weights, the experts on drawn
slots), so that a bug in one piece costs that piece's points and those of the pieces built from it. See
``moe_course.course.inside.answers``.
"""

import numpy as np

from moe_course.course.inside.answers import Check

_FLOAT = {"rtol": 1e-4, "atol": 1e-5}


def _normal(rng, *shape):
    return rng.normal(size=shape).astype(np.float32)


def _tokens(rng, batch, tokens, width):
    """Tokens of norms 0.2 to 5 (a normalised slot input, or a missing normalisation, shows)."""
    return _normal(rng, batch, tokens, width) * rng.uniform(0.2, 5, size=(batch, tokens, 1)).astype(np.float32)


def _expert_tree(rng, experts, width, hidden):
    return {"fc1_kernel": _normal(rng, experts, width, hidden) / np.float32(np.sqrt(width)),
            "fc1_bias": 0.3 * _normal(rng, experts, hidden),
            "fc2_kernel": _normal(rng, experts, hidden, width) / np.float32(np.sqrt(hidden)),
            "fc2_bias": 0.3 * _normal(rng, experts, width)}


def _soft_params(rng, width, hidden, experts, per_expert):
    """A SoftMoE's tree: phi of columns of different norms, a scale away from 1, every expert leaf drawn."""
    phi = _normal(rng, width, experts * per_expert) * rng.uniform(0.3, 3, size=(1, experts * per_expert))
    return {"phi": phi.astype(np.float32), "scale": np.float32(rng.uniform(0.5, 4)),
            "experts": _expert_tree(rng, experts, width, hidden)}


def _dense(rng, fan_in, fan_out):
    return {"kernel": _normal(rng, fan_in, fan_out) / np.float32(np.sqrt(fan_in)), "bias": 0.1 * _normal(rng, fan_out)}


def _norm(rng, width):
    return {"scale": 1 + 0.2 * _normal(rng, width), "bias": 0.2 * _normal(rng, width)}


# (width, hidden, experts, slots per expert, batch, tokens, heads): one slot per expert and several; more
# slots than tokens and fewer.
_SIZES = ((12, 24, 3, 2, 2, 5, 3), (8, 16, 4, 1, 3, 7, 2), (6, 10, 2, 3, 1, 4, 1))


def _layer_cases(rng):
    return [(_soft_params(rng, w, h, e, p), _tokens(rng, b, t, w)) for w, h, e, p, b, t, _ in _SIZES]


def _soft_moe_maker(params):
    """A function making the library's SoftMoE of the drawn tree's shapes (its parameters set by
    ``references.run_module``)."""
    from flax import nnx

    from moe_course.layers import SoftMoE

    experts, width, hidden = params["experts"]["fc1_kernel"].shape
    per_expert = params["phi"].shape[1] // experts
    return lambda: SoftMoE(width, hidden, experts, slots_per_expert=per_expert, rngs=nnx.Rngs(0))


# 1. soft_logits: the library's logits on the drawn tree.
def _logits(params, x):
    from moe_course.course.instructor.references import run_compiled
    from moe_course.routing import soft_logits

    return np.asarray(run_compiled(soft_logits, x, params["phi"], params["scale"]))


# 4. soft_weights: logits of scale 3 (far from uniform) with more tokens than slots and fewer.
def _weights_cases(rng):
    return [(3 * _normal(rng, 2, 9, 4),), (3 * _normal(rng, 3, 3, 6),)]


def _weights(logits):
    from moe_course.course.instructor.references import run_compiled
    from moe_course.routing import soft_combine_weights, soft_dispatch_weights

    return tuple(np.asarray(run_compiled(weights, logits)) for weights in (soft_dispatch_weights, soft_combine_weights))


# 3. the predicted number of dispatch weights (checked after task 4): no inputs; the reference counts one layer's
# D from the library's routing on abstract shapes (nothing of that size is computed) and multiplies by 6.
def _dispatch():
    import jax
    import jax.numpy as jnp

    from moe_course.routing import soft_routing

    shape = jax.eval_shape(lambda x, phi: soft_routing(x, phi).dispatch_weights,
                           jax.ShapeDtypeStruct((1, 196, 768), jnp.float32),
                           jax.ShapeDtypeStruct((768, 128 * 1), jnp.float32)).shape
    return 6 * int(np.prod(shape))


# 2. slot_inputs, the port fixed: tokens of different norms and drawn dispatch weights (every slot's column a
# Dirichlet draw over the tokens, summing to 1).
def _slots_cases(rng):
    cases = []
    for batch, tokens, width, slots in ((2, 7, 5, 3), (3, 4, 6, 6)):
        weights = rng.dirichlet(np.ones(tokens), size=(batch, slots)).transpose(0, 2, 1).astype(np.float32)
        cases.append((_tokens(rng, batch, tokens, width), weights))
    return cases


def _slots(x, dispatch):
    from moe_course.course.instructor.references import run_compiled
    from moe_course.routing import soft_slots

    return np.asarray(run_compiled(soft_slots, x, dispatch))


# 5. apply_experts: drawn expert trees and slots, one slot per expert and several.
def _experts_cases(rng):
    return [(_expert_tree(rng, e, w, h), _tokens(rng, b, e * p, w)) for w, h, e, p, b, _, _ in _SIZES]


def _apply_experts(experts, slots):
    from flax import nnx

    from moe_course.course.instructor.references import run_module
    from moe_course.layers import Experts

    count, width, hidden = experts["fc1_kernel"].shape
    batch, slot_count, _ = slots.shape
    buffers = slots.reshape(batch, count, slot_count // count, width)
    return np.asarray(run_module(lambda: Experts(count, width, hidden, rngs=nnx.Rngs(0)), experts,
                                 lambda module, b: module(b), buffers)).reshape(slots.shape)


# 6. soft_moe: the library's SoftMoE on the drawn tree.
def _layer(params, x):
    from moe_course.course.instructor.references import run_module

    return np.asarray(run_module(_soft_moe_maker(params), params, lambda layer, tokens: layer(tokens).output, x))


# 7. soft_moe_block: an EncoderBlock whose MLP is the drawn SoftMoE.
def _block_cases(rng):
    cases = []
    for w, h, e, p, b, t, heads in _SIZES:
        tree = {"norm1": _norm(rng, w), "attn": {n: _dense(rng, w, w) for n in ("query", "key", "value", "out")},
                "norm2": _norm(rng, w), "mlp": _soft_params(rng, w, h, e, p)}
        cases.append((tree, _tokens(rng, b, t, w), heads))
    return cases


def _block(params, x, heads):
    from flax import nnx

    from moe_course.course.instructor.references import run_module
    from moe_course.layers import EncoderBlock

    width, soft_moe = x.shape[-1], _soft_moe_maker(params["mlp"])
    make = lambda: EncoderBlock(width, heads, 4 * width, mlp=soft_moe(), rngs=nnx.Rngs(0))  # noqa: E731
    return np.asarray(run_module(make, params, lambda block, tokens: block(tokens)[0], x))


CHECKS = {
    "logits_tests": Check(_layer_cases, _logits, **_FLOAT),
    "weights_tests": Check(_weights_cases, _weights, rtol=1e-4, atol=1e-6),
    "dispatch_tests": Check(lambda rng: [()], _dispatch, exact=True, scalar=True),  # a prediction: no inputs
    "slots_tests": Check(_slots_cases, _slots, **_FLOAT),
    "experts_tests": Check(_experts_cases, _apply_experts, **_FLOAT),
    "layer_tests": Check(_layer_cases, _layer, **_FLOAT),
    "block_tests": Check(_block_cases, _block, **_FLOAT),
}
