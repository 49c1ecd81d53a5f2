"""Checks of assignment 01: the inputs each answer is called on, and the course library's reference.

Runs in two places: in the grading sandbox (only ``cases`` and ``call``: the inputs, drawn from the grading
seed, with NumPy alone) and in the grader (``reference``, with the library: ``moe_course.models.vit`` for the
patches, the embedding and the whole forward; ``moe_course.layers`` for the LayerNorm (``nnx.LayerNorm`` with
``block.LAYER_NORM_EPS``), the attention and the encoder block; the attention maps of the debug task from
``moe_course.layers.attention``). Parameter trees are drawn here as plain nested dicts of NumPy arrays with the
paths and shapes of ``nnx.to_pure_dict(nnx.state(ViT(config), nnx.Param))``, and the references load them into
the library's modules, each case one compiled computation (``references.run_module``). The sandbox gets this
file without the references (``moe_course.course.limits.inputs``). See ``moe_course.course.inside.answers``.
"""

import numpy as np

from moe_course.course.inside.answers import Check


def _normal(rng, *shape):
    return rng.normal(size=shape).astype(np.float32)


def _dense(rng, fan_in, fan_out):
    """A Linear layer's {"kernel": (fan_in, fan_out), "bias": (fan_out,)}, scaled as LeCun normal, nonzero bias."""
    return {"kernel": _normal(rng, fan_in, fan_out) / np.float32(np.sqrt(fan_in)), "bias": 0.1 * _normal(rng, fan_out)}


def _norm(rng, width):
    """A LayerNorm's {"scale", "bias"} (width,), away from the initial ones and zeros."""
    return {"scale": 1 + 0.2 * _normal(rng, width), "bias": 0.2 * _normal(rng, width)}


def _attention_params(rng, width):
    return {name: _dense(rng, width, width) for name in ("query", "key", "value", "out")}


def _block_params(rng, width, mlp_dim):
    return {"norm1": _norm(rng, width), "attn": _attention_params(rng, width), "norm2": _norm(rng, width),
            "mlp": {"fc1": _dense(rng, width, mlp_dim), "fc2": _dense(rng, mlp_dim, width)}}


# The small ViTs the embedding and forward checks use: (image_size, patch_size, channels, width, depth, heads,
# mlp_dim, num_classes, pool, batch). A class token and average pooling; p = 1 (a token per pixel) too.
_VITS = ((12, 4, 3, 16, 2, 2, 32, 5, "cls", 2), (8, 2, 1, 12, 1, 3, 24, 4, "gap", 3), (6, 1, 2, 8, 2, 1, 16, 3, "cls", 1))


def _vit_params(rng, image_size, patch_size, channels, width, depth, mlp_dim, num_classes, pool):
    """A ViT's parameter tree (learned position embeddings, no pre-logits layer), every leaf drawn."""
    tokens = (image_size // patch_size) ** 2 + (pool == "cls")
    proj = _dense(rng, patch_size * patch_size * channels, width)
    tree = {"patch_embed": {"proj": {"kernel": proj["kernel"].reshape(patch_size, patch_size, channels, width),
                                     "bias": proj["bias"]}},
            "pos_embed": 0.5 * _normal(rng, 1, tokens, width),
            "blocks": {i: _block_params(rng, width, mlp_dim) for i in range(depth)},
            "norm": _norm(rng, width), "head": _dense(rng, width, num_classes)}
    if pool == "cls":
        tree["cls_token"] = 0.5 * _normal(rng, 1, 1, width)
    return tree


def _vit_cases(rng, with_heads):
    cases = []
    for size, p, channels, width, depth, heads, mlp, classes, pool, batch in _VITS:
        params = _vit_params(rng, size, p, channels, width, depth, mlp, classes, pool)
        images = rng.random((batch, size, size, channels)).astype(np.float32)
        cases.append((params, images, heads) if with_heads else (params, images))
    return cases


def _config(params, images, heads=1):
    """The library's ViTConfig of a drawn tree (its shapes say everything but the heads)."""
    from moe_course.configs.vit import ViTConfig

    p, _, channels, width = params["patch_embed"]["proj"]["kernel"].shape
    return ViTConfig(image_size=images.shape[1], patch_size=p, channels=channels, width=width,
                     depth=len(params["blocks"]), heads=heads,
                     mlp_dim=params["blocks"][0]["mlp"]["fc1"]["kernel"].shape[1] if params["blocks"] else 4 * width,
                     num_classes=params["head"]["kernel"].shape[1], pool="cls" if "cls_token" in params else "gap")


def _library_vit(params, images, heads, function):
    """``function(vit)`` for the library's ViT of the drawn tree ``params`` and ``images`` (one jax.jit
    computation: ``references.run_module``)."""
    from flax import nnx

    from moe_course.course.instructor.references import run_module
    from moe_course.models.vit import ViT

    config = _config(params, images, heads)
    return np.asarray(run_module(lambda: ViT(config, rngs=nnx.Rngs(0)), params, function, images))


# 1. patchify: square and non-square images, one and several channels, p = 1 (every pixel a patch).
# Cutting and reordering changes no value, so the patches must equal the library's exactly.
def _patchify_cases(rng):
    return [(_normal(rng, 3, 12, 12, 2), 4), (_normal(rng, 1, 6, 9, 1), 3), (_normal(rng, 2, 4, 4, 3), 1)]


def _patchify(images, patch_size):
    from moe_course.course.instructor.references import run_compiled
    from moe_course.models.vit import patchify

    return np.asarray(run_compiled(patchify, images, patch_size=patch_size))


# 2. embed: the library's ViT.embed (strided nnx.Conv patch embedding, class token, position embeddings) on the
# drawn trees.
def _embed(params, images):
    return _library_vit(params, images, 1, lambda vit, x: vit.embed(x))


# 3. attention_weights (the debug task): queries and keys of several batch sizes, token counts, heads and head
# widths, scaled up so that a missing 1/sqrt(d) changes every map; the reference is the library's
# attention_weights (moe_course.layers.attention), the maps MultiHeadAttention returns.
def _attention_cases(rng):
    return [(3 * _normal(rng, b, t, h, d), 3 * _normal(rng, b, t, h, d)) for b, t, h, d in ((2, 5, 2, 4), (1, 7, 3, 8),
                                                                                          (3, 3, 1, 16))]


def _attention(q, k):
    from moe_course.course.instructor.references import run_compiled
    from moe_course.layers.attention import attention_weights

    return np.asarray(run_compiled(attention_weights, q, k))


# 4. the predicted number of attention weights one image makes ViT-B/16 (V-MoE Table 7's B at 224 x 224, class
# token) compute over all its blocks: no inputs (the question is fixed); the reference counts the maps the
# library's model returns with return_attention=True, from shapes only (jax.eval_shape: nothing is allocated).
def _weights(*_):
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from moe_course.configs.vit import VIT_PRESETS
    from moe_course.models.vit import ViT

    config = VIT_PRESETS["vit-b/16"]
    graph, state = nnx.split(nnx.eval_shape(lambda: ViT(config, rngs=nnx.Rngs(0))))
    image = jax.ShapeDtypeStruct((1, config.image_size, config.image_size, config.channels), jnp.float32)
    maps = jax.eval_shape(lambda s, x: nnx.merge(graph, s)(x, return_attention=True).attention, state, image)
    return int(sum(np.prod(m.shape) for m in maps))


# 5. layer_norm: widths 8 and 16 at unit scale, and tokens whose variance (1e-6) is as small as the epsilon, where
# leaving it out changes every value; the reference is nnx.LayerNorm(epsilon=LAYER_NORM_EPS) with the drawn scale
# and bias, as every block and the final norm of the library's ViT.
def _layer_norm_cases(rng):
    cases = []
    for shape, spread in (((2, 5, 8), 1.0), ((3, 16), 2.0), ((2, 4, 16), 1e-3)):
        width = shape[-1]
        norm = _norm(rng, width)
        cases.append((spread * _normal(rng, *shape) + 0.01 * _normal(rng, width), norm["scale"], norm["bias"]))
    return cases


def _layer_norm(x, scale, bias):
    from flax import nnx

    from moe_course.course.instructor.references import run_module
    from moe_course.layers.block import LAYER_NORM_EPS

    make = lambda: nnx.LayerNorm(x.shape[-1], epsilon=LAYER_NORM_EPS, rngs=nnx.Rngs(0))  # noqa: E731
    return np.asarray(run_module(make, {"scale": scale, "bias": bias}, lambda norm, tokens: norm(tokens), x))


# 6. self_attention: (batch, tokens, width, heads) with one head, several, and a head width of 1; the reference is
# the library's MultiHeadAttention with the drawn projections: its output and maps (return_attention=True).
_ATTENTION = ((2, 5, 8, 2), (1, 7, 12, 3), (3, 4, 4, 4))


def _self_attention_cases(rng):
    return [(_attention_params(rng, w), _normal(rng, b, t, w), h) for b, t, w, h in _ATTENTION]


def _self_attention(params, x, heads):
    from flax import nnx

    from moe_course.course.instructor.references import run_module
    from moe_course.layers.attention import MultiHeadAttention

    output, maps = run_module(lambda: MultiHeadAttention(x.shape[-1], heads, rngs=nnx.Rngs(0)), params,
                              lambda layer, tokens: layer(tokens, return_attention=True), x)
    return np.asarray(output), np.asarray(maps)


# 7. encoder_block: the drawn block parameters of two widths and MLP sizes; the reference is the library's
# EncoderBlock (pre-LN, exact GELU), deterministic.
def _block_cases(rng):
    return [(_block_params(rng, w, m), _normal(rng, b, t, w), h) for b, t, w, h, m in ((2, 5, 8, 2, 16),
                                                                                    (1, 6, 12, 3, 48))]


def _block(params, x, heads):
    from flax import nnx

    from moe_course.course.instructor.references import run_module
    from moe_course.layers.block import EncoderBlock

    width, mlp_dim = params["mlp"]["fc1"]["kernel"].shape
    return np.asarray(run_module(lambda: EncoderBlock(width, heads, mlp_dim, rngs=nnx.Rngs(0)), params,
                                 lambda block, tokens: block(tokens)[0], x))


# 8. vit_forward: the logits of the library's ViT(config)(images, deterministic=True) on the drawn trees.
def _forward(params, images, heads):
    return _library_vit(params, images, heads, lambda vit, x: vit(x, deterministic=True).logits)


_FLOAT = {"rtol": 1e-4, "atol": 1e-5}
CHECKS = {
    "patchify_tests": Check(_patchify_cases, _patchify, exact=True),
    "embed_tests": Check(lambda rng: _vit_cases(rng, False), _embed, **_FLOAT),
    "attention_tests": Check(_attention_cases, _attention, rtol=1e-4, atol=1e-6),
    "weights_tests": Check(lambda rng: [()], _weights, exact=True, scalar=True),
    "layer_norm_tests": Check(_layer_norm_cases, _layer_norm, **_FLOAT),
    "self_attention_tests": Check(_self_attention_cases, _self_attention, **_FLOAT),
    "block_tests": Check(_block_cases, _block, **_FLOAT),
    "forward_tests": Check(lambda rng: _vit_cases(rng, True), _forward, **_FLOAT),
}
