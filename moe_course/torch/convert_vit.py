"""Weight conversion between Hugging Face transformers' ViT and the course's Flax NNX ViT.

The two models compute the same function (pre-LN encoder, exact erf GELU, class-token pooling, one linear
head) once the weights are laid out for each side:

=====================  ==============================================  =====================================
weight                 transformers (PyTorch)                          ours (Flax NNX)
=====================  ==============================================  =====================================
patch embedding conv   ``projection.weight`` (width, C, p, p)  OIHW    ``patch_embed.proj.kernel`` (p, p, C,
                                                                       width)  HWIO
linear layers          ``weight`` (out, in); ``bias`` (out,)           ``kernel`` (in, out); ``bias`` (out,)
LayerNorm              ``weight`` (width,), ``bias``                   ``scale`` (width,), ``bias``
class token            ``embeddings.cls_token`` (1, 1, width)          ``cls_token`` (1, 1, width)
position embeddings    ``embeddings.position_embeddings``              ``pos_embed`` (1, tokens, width)
                       (1, tokens, width), class token first
=====================  ==============================================  =====================================

State-dict keys come in two layouts, both accepted by :func:`load_hf_state_dict`:

* ``"legacy"``: transformers 4.x module names, and the names inside checkpoint files on disk / on the Hub
  (``vit.encoder.layer.{i}.attention.attention.{query,key,value}``, ``attention.output.dense``,
  ``intermediate.dense``, ``output.dense``, ``layernorm_before``, ``layernorm_after``).
* ``"modular"``: transformers 5.x module names, i.e. what ``ViTForImageClassification.state_dict()``
  returns there (``vit.layers.{i}.attention.{q,k,v,o}_proj``, ``mlp.fc1``, ``mlp.fc2``,
  ``layernorm_before``, ``layernorm_after``). transformers 5 renames legacy files to this on
  ``from_pretrained``.

The embeddings, ``vit.layernorm`` and ``classifier`` keys are the same in both. Keys may carry the
``vit.`` prefix (``ViTForImageClassification``) or not (``ViTModel``, which has no classifier).

Inputs differ too, and this module does not convert them: our model takes images NHWC float32
(batch, H, W, C); transformers takes ``pixel_values`` NCHW (batch, C, H, W), i.e.
``images.transpose(0, 3, 1, 2)``. Pixel normalisation (``ViTImageProcessor``'s resize, rescale to [0, 1]
and per-channel mean/std, 0.5/0.5 for the Google checkpoints) is a data-pipeline concern: apply the
checkpoint's normalisation to the images before calling either model.

Differences that remain after conversion: our LayerNorm epsilon is fixed at ``LAYER_NORM_EPS`` = 1e-6,
while Hub ViT configs often say ``layer_norm_eps=1e-12``; :func:`vit_config_from_hf` accepts any epsilon
<= 1e-5 and the outputs then differ by about ``eps_difference / (2 * feature variance)`` relative, far
below fp32 tolerances for real activations. Dropout is a training setting and is not carried across
(transformers' hidden dropout also acts on the embeddings, ours does not).

torch is imported only inside the functions that make or read torch tensors, and transformers only inside
those that make or read a transformers config or model, so :func:`load_hf_state_dict` works on a mapping
of NumPy arrays (e.g. ``safetensors.numpy.load_file("model.safetensors")``) without either installed.

Typical use::

    from transformers.models.vit import ViTForImageClassification
    hf = ViTForImageClassification.from_pretrained("/path/to/local/checkpoint")
    model = vit_from_hf(hf)                     # ours, same logits on the same (normalised) images
    hf2 = vit_to_hf(model)                      # and back, e.g. to save_pretrained a model trained here
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import jax
import numpy as np
from flax import nnx

from moe_course.configs.vit import ViTConfig
from moe_course.layers.block import LAYER_NORM_EPS
from moe_course.models.vit import ViT
from moe_course.torch.convert import (
    KIND_PARAMS,
    as_numpy,
    format_keys,
    param_at,
    to_nnx_layout,
    to_torch_layout,
    torch_layout_shape,
)

if TYPE_CHECKING:  # pragma: no cover
    import torch
    import transformers

LAYOUTS = ("modular", "legacy")
MAX_LAYER_NORM_EPS = 1e-5  # largest transformers layer_norm_eps accepted for our fixed LAYER_NORM_EPS
_IGNORED_PREFIXES = ("pooler.",)  # ViTModel's pooler: ViTForImageClassification does not use it

# Per encoder block: (our module path inside the block, transformers name per layout, kind).
_BLOCK_MODULES = (
    ("norm1", {"modular": "layernorm_before", "legacy": "layernorm_before"}, "norm"),
    ("attn.query", {"modular": "attention.q_proj", "legacy": "attention.attention.query"}, "linear"),
    ("attn.key", {"modular": "attention.k_proj", "legacy": "attention.attention.key"}, "linear"),
    ("attn.value", {"modular": "attention.v_proj", "legacy": "attention.attention.value"}, "linear"),
    ("attn.out", {"modular": "attention.o_proj", "legacy": "attention.output.dense"}, "linear"),
    ("norm2", {"modular": "layernorm_after", "legacy": "layernorm_after"}, "norm"),
    ("mlp.fc1", {"modular": "mlp.fc1", "legacy": "intermediate.dense"}, "linear"),
    ("mlp.fc2", {"modular": "mlp.fc2", "legacy": "output.dense"}, "linear"),
)
# The order each transformers layout lists a block's modules in (indices into _BLOCK_MODULES), so that
# exported state dicts list their keys as transformers' own state_dict() does.
_BLOCK_ORDER = {"modular": (1, 2, 3, 4, 0, 5, 6, 7), "legacy": (1, 2, 3, 4, 6, 7, 0, 5)}
# our ViTConfig.gelu -> transformers hidden_act
HF_GELU = {"exact": "gelu", "tanh": "gelu_pytorch_tanh"}
_BLOCK_PREFIX = {"modular": "layers.{i}.", "legacy": "encoder.layer.{i}."}


# ------------------------------------------------------------------------------------------------ configs


def _check_expressible(config: ViTConfig) -> None:
    """Raise ValueError (naming the field) if transformers' ViT cannot express ``config``; no transformers needed."""
    config.validate()
    if config.pool != "cls":
        raise ValueError(
            f"pool={config.pool!r} cannot be expressed by transformers' ViT, which always pools the class "
            f"token; use pool='cls'"
        )
    if config.representation_size is not None:
        raise ValueError(
            f"representation_size={config.representation_size} cannot be expressed by transformers' "
            f"ViTForImageClassification (no pre-logits layer before its classifier); use representation_size=None"
        )


def hf_config_from_vit(config: ViTConfig) -> "transformers.ViTConfig":
    """The transformers ``ViTConfig`` describing the same architecture as ``config``.

    hidden_size=width, num_hidden_layers=depth, num_attention_heads=heads, intermediate_size=mlp_dim,
    image_size, patch_size, num_channels=channels, num_labels=num_classes, hidden_act "gelu" (exact erf
    GELU) or "gelu_pytorch_tanh" by ``config.gelu``, layer_norm_eps=1e-6 (our LAYER_NORM_EPS), qkv_bias=True, both dropout probabilities 0
    (the export is for inference; ``config.dropout`` is not carried across).
    Raises ValueError (naming the field) for an invalid config or one transformers' ViT cannot express:
    pool other than "cls" (it always pools the class token), representation_size set (its classifier sits
    directly on the final LayerNorm; ViTModel's pooler is not used by ViTForImageClassification).
    Needs transformers.
    """
    _check_expressible(config)
    from transformers.models.vit.configuration_vit import ViTConfig as HFViTConfig

    return HFViTConfig(
        hidden_size=config.width,
        num_hidden_layers=config.depth,
        num_attention_heads=config.heads,
        intermediate_size=config.mlp_dim,
        hidden_act=HF_GELU[config.gelu],
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        layer_norm_eps=LAYER_NORM_EPS,
        image_size=config.image_size,
        patch_size=config.patch_size,
        num_channels=config.channels,
        qkv_bias=True,
        num_labels=config.num_classes,
    )


def _square(hf_config: Any, field: str) -> int:
    value = getattr(hf_config, field)
    if isinstance(value, (list, tuple)):
        if len(value) != 2 or value[0] != value[1]:
            raise ValueError(f"{field}={value!r} is not square; our ViT supports square {field} only")
        value = value[0]
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{field}={value!r} is not allowed; use a positive integer")
    return value


def vit_config_from_hf(hf_config: Any, *, name: str | None = None, dropout: float = 0.0) -> ViTConfig:
    """Our ViTConfig for a transformers ViT config (the inverse of :func:`hf_config_from_vit`).

    name: the ViTConfig name; default the config's ``name_or_path`` (set by ``from_pretrained``) or
    "custom". dropout: our training dropout (transformers' dropout probabilities are not carried across).
    Pool is "cls" and representation_size None, as in ViTForImageClassification.
    Raises ValueError naming the field for what our ViT cannot express: model_type other than "vit",
    hidden_act other than "gelu" / "gelu_pytorch_tanh", non-square image_size or patch_size, qkv_bias=False, a head_dim other
    than hidden_size // num_attention_heads, layer_norm_eps above 1e-5 (ours is fixed at 1e-6), and for
    whatever ViTConfig.validate rejects (e.g. patch_size not dividing image_size, num_labels < 1).
    Does not import transformers: any object with those attributes works.
    """
    model_type = getattr(hf_config, "model_type", "vit")
    if model_type != "vit":
        raise ValueError(f"model_type={model_type!r} is not supported; only transformers' 'vit' converts")
    act = getattr(hf_config, "hidden_act", "gelu")
    gelu = {theirs: ours for ours, theirs in HF_GELU.items()}.get(act)
    if gelu is None:
        raise ValueError(f"hidden_act={act!r} is not supported; use one of {sorted(HF_GELU.values())} "
                         f"(our ViT's exact erf GELU or its tanh approximation)")
    if not getattr(hf_config, "qkv_bias", True):
        raise ValueError("qkv_bias=False is not supported; our attention projections always have biases")
    width, heads = hf_config.hidden_size, hf_config.num_attention_heads
    head_dim = getattr(hf_config, "head_dim", None)
    if head_dim is not None and isinstance(width, int) and isinstance(heads, int) and head_dim * heads != width:
        raise ValueError(
            f"head_dim={head_dim} with num_attention_heads={heads} does not make hidden_size={width}; "
            f"our ViT needs head_dim = hidden_size // num_attention_heads"
        )
    eps = getattr(hf_config, "layer_norm_eps", LAYER_NORM_EPS)
    if not 0 <= eps <= MAX_LAYER_NORM_EPS:
        raise ValueError(
            f"layer_norm_eps={eps} is not supported; our LayerNorm epsilon is fixed at {LAYER_NORM_EPS}, "
            f"so only layer_norm_eps <= {MAX_LAYER_NORM_EPS} converts (within fp32 tolerance)"
        )
    if name is None:
        name = getattr(hf_config, "name_or_path", "") or "custom"
    return ViTConfig(
        name=name,
        image_size=_square(hf_config, "image_size"),
        patch_size=_square(hf_config, "patch_size"),
        channels=hf_config.num_channels,
        width=width,
        depth=hf_config.num_hidden_layers,
        heads=heads,
        mlp_dim=hf_config.intermediate_size,
        num_classes=hf_config.num_labels,
        pool="cls",
        representation_size=None,
        dropout=dropout,
        gelu=gelu,
    ).validate()


# ------------------------------------------------------------------------------------------- key mapping


def _entries(depth: int, layout: str) -> list[tuple[str, str, str]]:
    """(our parameter path, transformers key without the ``vit.`` prefix, transform) for the backbone."""
    out = [
        ("cls_token", "embeddings.cls_token", "plain"),
        ("pos_embed", "embeddings.position_embeddings", "plain"),
    ]
    out += [(f"patch_embed.proj.{ours}", f"embeddings.patch_embeddings.projection.{theirs}", kind)
            for ours, theirs, kind in KIND_PARAMS["conv"]]
    for i in range(depth):
        prefix = _BLOCK_PREFIX[layout].format(i=i)
        for module, names, kind in (_BLOCK_MODULES[j] for j in _BLOCK_ORDER[layout]):
            out += [(f"blocks.{i}.{module}.{ours}", f"{prefix}{names[layout]}.{theirs}", how)
                    for ours, theirs, how in KIND_PARAMS[kind]]
    out += [(f"norm.{ours}", f"layernorm.{theirs}", how) for ours, theirs, how in KIND_PARAMS["norm"]]
    return out


_HEAD_ENTRIES = [(f"head.{ours}", f"classifier.{theirs}", how) for ours, theirs, how in KIND_PARAMS["linear"]]


def _detect_layout(body_keys: list[str]) -> str:
    legacy = any(k.startswith("encoder.layer.") for k in body_keys)
    modular = any(k.startswith("layers.") for k in body_keys)
    if legacy and modular:
        raise ValueError(
            "the state dict mixes the legacy ('encoder.layer.{i}.') and modular ('layers.{i}.') transformers "
            "key layouts; pass keys in one layout"
        )
    return "legacy" if legacy else "modular"


@functools.lru_cache(maxsize=None)
def installed_layout() -> str:
    """The key layout of the installed transformers' ViT modules ("modular" for 5.x, "legacy" for 4.x).

    "legacy" when transformers is not installed: it is the checkpoint-file layout every version loads
    through ``from_pretrained``. Builds a one-block ViTModel on torch's meta device (no memory).
    """
    try:
        import torch
        from transformers.models.vit.configuration_vit import ViTConfig as HFViTConfig
        from transformers.models.vit.modeling_vit import ViTModel
    except ImportError:
        return "legacy"
    tiny = HFViTConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8,
                       image_size=4, patch_size=2)
    with torch.device("meta"):
        keys = set(ViTModel(tiny, add_pooling_layer=False).state_dict())
    for layout in LAYOUTS:
        if {key for _, key, _ in _entries(1, layout)} == keys:
            return layout
    raise RuntimeError(  # pragma: no cover - a transformers release with yet another layout
        f"the installed transformers' ViTModel has keys {sorted(keys)}, in neither known layout {LAYOUTS}"
    )


# ------------------------------------------------------------------------------------------ load / export


def load_hf_state_dict(model: ViT, state_dict: Mapping[str, "torch.Tensor | np.ndarray"], *,
                       head: bool = True) -> None:
    """Copy the weights of a transformers ViT state dict into ``model`` in place.

    state_dict: ``ViTForImageClassification.state_dict()`` (keys ``vit.*`` and ``classifier.*``) or
    ``ViTModel.state_dict()`` (keys without the ``vit.`` prefix), in the legacy or the modular layout (see
    the module docstring), values torch tensors (any device, float32/float16/bfloat16) or NumPy arrays in
    transformers' layouts: conv weight OIHW, Linear weight (out, in), cls_token (1, 1, width),
    position_embeddings (1, tokens, width). Each value is converted to our layout (HWIO kernel, (in, out)
    kernels) and cast to the dtype of the parameter it replaces (float32 for our ViT).
    head: copy ``classifier.weight``/``classifier.bias`` into ``model.head`` (required then). With
    ``head=False`` any classifier keys are ignored and ``model.head`` stays as initialised, e.g. to fine-tune
    a pretrained backbone on a new number of classes. ``pooler.*`` keys (ViTModel's pooler, unused by
    ViTForImageClassification) are ignored.
    Raises ValueError, before changing anything: if ``model.config`` cannot be expressed by transformers
    (pool other than "cls", representation_size set); listing the missing keys and the unexpected keys; for
    keys in both layouts at once; naming each key whose shape differs from what ``model`` needs, with the
    expected and the found shape (in transformers' layout).
    """
    _check_expressible(model.config)
    keys = list(state_dict)
    prefix = "vit." if any(k.startswith("vit.") for k in keys) else ""
    body = [k[len(prefix):] for k in keys if k.startswith(prefix) and not k.startswith("classifier.")]
    layout = _detect_layout(body)
    entries = [(ours, prefix + theirs, how) for ours, theirs, how in _entries(model.config.depth, layout)]
    if head:
        entries += _HEAD_ENTRIES
    expected = {theirs for _, theirs, _ in entries}
    ignored = tuple(prefix + p for p in _IGNORED_PREFIXES) + (() if head else ("classifier.",))
    missing = [theirs for _, theirs, _ in entries if theirs not in state_dict]
    unexpected = [k for k in keys if k not in expected and not k.startswith(ignored)]
    if missing or unexpected:
        problems = []
        if missing:
            problems.append(f"missing keys: {format_keys(missing)}")
        if unexpected:
            problems.append(f"unexpected keys: {format_keys(unexpected)}")
        hint = (" (a ViTModel state dict has no classifier: pass head=False to keep our head as initialised)"
                if head and any(k.startswith("classifier.") for k in missing) else "")
        raise ValueError(
            f"state dict does not match ViT config {model.config.name!r} (depth {model.config.depth}, "
            f"{layout} layout, key prefix {prefix!r}): " + "; ".join(problems) + hint
        )
    arrays, mismatched = [], []
    for ours, theirs, how in entries:
        param = param_at(model, ours)
        want = torch_layout_shape(tuple(param.shape), how)
        array = as_numpy(theirs, state_dict[theirs])
        if tuple(array.shape) != want:
            mismatched.append(f"{theirs!r}: expected shape {want}, found {tuple(array.shape)}")
        else:
            arrays.append((param, to_nnx_layout(array, how)))
    if mismatched:
        raise ValueError(
            f"shape mismatch between the state dict and ViT config {model.config.name!r}: " + "; ".join(mismatched)
        )
    for param, array in arrays:
        param.set_value(jax.numpy.asarray(array, dtype=param.dtype))


def to_hf_state_dict(model: ViT, *, layout: str = "auto") -> dict[str, "torch.Tensor"]:
    """The state dict of the transformers ``ViTForImageClassification`` equal to ``model`` (inverse of
    :func:`load_hf_state_dict`).

    Keys ``vit.*`` and ``classifier.*`` (no pooler), in ``layout``: "modular" (transformers 5.x modules),
    "legacy" (transformers 4.x modules and checkpoint files), or "auto" = the installed transformers'
    layout (:func:`installed_layout`), so the result loads with
    ``hf_model.load_state_dict(..., strict=True)``. Values are CPU torch tensors in transformers' layouts (conv weight OIHW, Linear weight
    (out, in)), in the parameters' dtype (float32), copies not sharing memory with ``model``.
    Raises ValueError for an unknown layout or a config transformers cannot express (pool other than
    "cls", representation_size set). Needs torch.
    """
    import torch

    _check_expressible(model.config)
    if layout == "auto":
        layout = installed_layout()
    if layout not in LAYOUTS:
        raise ValueError(f"layout={layout!r} is not allowed; use 'auto' or one of {', '.join(LAYOUTS)}")
    entries = [(ours, "vit." + theirs, how) for ours, theirs, how in _entries(model.config.depth, layout)]
    out = {}
    for ours, theirs, how in entries + _HEAD_ENTRIES:
        array = np.array(param_at(model, ours)[...])
        out[theirs] = torch.from_numpy(np.ascontiguousarray(to_torch_layout(array, how)))
    return out


def vit_from_hf(hf_model: Any, *, head: bool = True, rngs: nnx.Rngs | None = None) -> ViT:
    """Our ViT equal to a transformers ``ViTForImageClassification`` (or ``ViTModel`` with ``head=False``).

    Builds ``ViT(vit_config_from_hf(hf_model.config))`` and loads ``hf_model.state_dict()`` into it (see
    :func:`load_hf_state_dict`). With ``head=True`` every parameter comes from the state dict, so the
    model is built abstractly (``nnx.eval_shape``: no initialisation compute, no second copy in memory)
    and then filled. rngs seeds the parameters that are not copied (the head when ``head=False``);
    default ``nnx.Rngs(0)``. The public entry point for a pretrained checkpoint on disk::

        hf = ViTForImageClassification.from_pretrained("/path/to/checkpoint")
        model = vit_from_hf(hf)   # images NHWC, normalised as hf's image processor would

    Raises ValueError from :func:`vit_config_from_hf` or :func:`load_hf_state_dict`.
    """
    config = vit_config_from_hf(hf_model.config)
    state_dict = hf_model.state_dict()
    build = lambda: ViT(config, rngs=rngs if rngs is not None else nnx.Rngs(0))  # noqa: E731
    if head:
        # Every parameter is replaced: build the model abstractly (shapes only, no init compute or memory)
        # and let the load fill it. Anything left abstract (a variable the state dict does not cover)
        # means the slow path: a real build, then the same load.
        model = nnx.eval_shape(build)
        load_hf_state_dict(model, state_dict, head=True)
        if all(isinstance(leaf, jax.Array) for leaf in jax.tree.leaves(nnx.state(model))):
            return model
    model = build()
    load_hf_state_dict(model, state_dict, head=head)
    return model


def vit_to_hf(model: ViT, *, attn_implementation: str | None = None) -> "transformers.ViTForImageClassification":
    """A transformers ``ViTForImageClassification`` (eval mode, float32, CPU) equal to ``model``, e.g. to
    ``save_pretrained`` a model trained here. attn_implementation: e.g. "eager" to get attention maps
    with ``output_attentions=True``; default transformers' choice. Raises ValueError as
    :func:`hf_config_from_vit`. Needs torch and transformers.
    """
    from transformers.models.vit.modeling_vit import ViTForImageClassification

    hf_config = hf_config_from_vit(model.config)
    if attn_implementation is not None:
        hf_config._attn_implementation = attn_implementation
    hf_model = ViTForImageClassification(hf_config)
    hf_model.load_state_dict(to_hf_state_dict(model, layout="auto"), strict=True)
    return hf_model.eval()


__all__ = [
    "LAYOUTS",
    "hf_config_from_vit",
    "installed_layout",
    "load_hf_state_dict",
    "to_hf_state_dict",
    "vit_config_from_hf",
    "vit_from_hf",
    "vit_to_hf",
]
