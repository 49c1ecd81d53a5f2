"""big_vision's ViT checkpoints (``.npz``, google-research/big_vision ``models/vit.py``) -> ``moe_course.models.ViT``.

big_vision saves a ViT's parameters as one ``.npz`` whose keys are the '/'-joined Flax module paths:

===================================================  =========================================  ===============
big_vision                                           ours                                       change
===================================================  =========================================  ===============
``embedding/{kernel,bias}``  (p, p, C, width)         ``patch_embed.proj.{kernel,bias}``         --
``pos_embedding`` (1, patches, width); none for     ``pos_embed`` (1, [1 +] patches, width);   see below
``posemb="sincos2d"``                                a constant (``posemb="sincos2d"``)
``cls`` (1, 1, width)                                ``cls_token``                              --
``Transformer/encoderblock_{i}/LayerNorm_0``         ``blocks.{i}.norm1``                       --
``.../MultiHeadDotProductAttention_0/{query,key,``   ``blocks.{i}.attn.{query,key,value,out}``  heads merged
``value,out}``
``.../LayerNorm_1``, ``.../MlpBlock_0/Dense_{0,1}``  ``blocks.{i}.norm2``, ``blocks.{i}.mlp.``  --
                                                     ``fc{1,2}``
``Transformer/encoder_norm``, ``pre_logits``,        ``norm``, ``pre_logits``, ``head``         --
``head``
===================================================  =========================================  ===============

Checkpoints of the scanned encoder (``Transformer/encoderblock/...`` with a leading depth axis) are unstacked
first, as big_vision's ``scan_to_pyloop``. big_vision adds the position embeddings *before* it puts the class
token in front, so the class token has none: our ``pos_embed`` gets a zero entry there (the same sum). Older
checkpoints whose position embeddings include a class-token entry (``Transformer/posembed_input/pos_embedding``
or ``Transformer/pos_embedding``, 1 + a square) keep that entry. When ``image_size`` differs from the
checkpoint's, the grid of position embeddings is resized by bilinear interpolation and the class-token entry
kept (``resize_position_embeddings``; big_vision's ``resample_posemb``). A checkpoint without position
embeddings is a ``posemb="sincos2d"`` model (big_vision ``models/vit.py`` ``get_posemb``: the fixed table is
recomputed from the patch grid in every call, never saved; its ``vit_s16_i1k`` checkpoints are such); our config
gets ``posemb="sincos2d"``, whose table is a constant of the model (``models.vit.fixed_position_embeddings``), not
a parameter, so the parameter count is the checkpoint's. Nothing in the file records the image size:
``image_size`` must be given (any multiple of the patch size; the table is recomputed for its grid).

The model computes big_vision's function: ``flax.linen.gelu`` is the tanh approximation, so the config has
``gelu="tanh"``; LayerNorm epsilon 1e-6 as ours. Pools: big_vision's "tok" -> "cls" (a ``cls`` parameter is
present), "gap" -> "gap"; "map" (``MAPHead_0``) and "0" are not expressible and raise. Images go in as the
checkpoint was trained (big_vision's pipelines scale pixels to [-1, 1]), NHWC.
"""

from __future__ import annotations

import math
import os
import re
import zipfile
from collections.abc import Mapping

import numpy as np
from flax import nnx

from moe_course.configs.vit import ViTConfig
from moe_course.models.vit import ViT
from moe_course.reference.names import (
    Plan, encoder_block_plan, grid_side, heads_of, keep, module_plan, resize_position_embeddings, fill,
)

POSEMB_NAMES = ("pos_embedding", "Transformer/pos_embedding", "Transformer/posembed_input/pos_embedding")
_SCANNED = "Transformer/encoderblock/"


def read_npz(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The arrays of a big_vision ``.npz`` by their '/'-joined names. Raises FileNotFoundError, and ValueError
    naming the file when it is not a readable ``.npz`` (empty, truncated, pickled objects)."""
    try:
        with np.load(path, allow_pickle=False) as data:
            return {name: data[name] for name in data.files}
    except (EOFError, zipfile.BadZipFile, ValueError) as err:
        raise ValueError(f"{os.fspath(path)}: not a readable .npz checkpoint ({type(err).__name__}: {err})") from err


def unscan(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A scanned encoder's ``Transformer/encoderblock/...`` (leading axis = depth) -> one
    ``Transformer/encoderblock_{i}/...`` per block; other names unchanged."""
    out = {}
    for name, array in arrays.items():
        if name.startswith(_SCANNED):
            rest = name[len(_SCANNED):]
            out.update({f"Transformer/encoderblock_{i}/{rest}": array[i] for i in range(array.shape[0])})
        else:
            out[name] = array
    return out


def _posemb_name(arrays: Mapping[str, np.ndarray]) -> str | None:
    """The name of the checkpoint's learned position embeddings, or None (a sincos2d checkpoint)."""
    return next((name for name in POSEMB_NAMES if name in arrays), None)


def vit_config_from_big_vision(arrays: Mapping[str, np.ndarray], *, image_size: int | None = None,
                               name: str = "big_vision-vit") -> ViTConfig:
    """Our ViTConfig for a big_vision ViT, read from its parameters' names and shapes: patch_size, channels
    and width from the patch embedding, depth from the blocks, heads from the query kernel (width, heads,
    head_dim), mlp_dim, num_classes, representation_size (pre_logits), pool ("cls" with a ``cls``
    parameter, else "gap"), gelu="tanh", posemb "learned", or "sincos2d" when the checkpoint has no position
    embeddings. image_size: default the checkpoint's (grid side x patch size); another size resizes learned
    position embeddings; required for a sincos2d checkpoint. Raises ValueError for a MAP head, a checkpoint
    without head, a sincos2d one without image_size, or an image_size the patch size does not divide.
    """
    arrays = unscan(arrays)
    if any(name_.startswith("MAPHead_0/") for name_ in arrays):
        raise ValueError("pool 'map' (MAPHead_0) is not supported; our ViT pools by class token or average")
    for needed in ("embedding/kernel", "head/kernel", "Transformer/encoderblock_0/MlpBlock_0/Dense_0/kernel"):
        if needed not in arrays:
            raise ValueError(f"parameter {needed!r} is missing: not a big_vision ViT classifier checkpoint")
    patch, _, channels, width = np.shape(arrays["embedding/kernel"])
    depth = len({m.group(1) for n in arrays if (m := re.match(r"Transformer/encoderblock_(\d+)/", n))})
    posemb_name = _posemb_name(arrays)
    if posemb_name is None and image_size is None:
        raise ValueError(f"the checkpoint has no position embeddings (none of {', '.join(POSEMB_NAMES)}): big_vision "
                         f"computed them (posemb='sincos2d'), and the file does not record the image size; pass "
                         f"image_size (e.g. 224 for its vit_s16_i1k checkpoints)")
    side = 0
    if posemb_name is not None:
        posemb = np.shape(arrays[posemb_name])[1]
        patches = posemb if math.isqrt(posemb) ** 2 == posemb else posemb - 1
        side = grid_side(patches, "the checkpoint's position embeddings")
    rep = arrays.get("pre_logits/kernel")
    return ViTConfig(
        name=name, image_size=image_size or side * int(patch), patch_size=int(patch), channels=int(channels),
        width=int(width), depth=depth,
        heads=heads_of(arrays, "Transformer/encoderblock_0/MultiHeadDotProductAttention_0/query/kernel"),
        mlp_dim=int(np.shape(arrays["Transformer/encoderblock_0/MlpBlock_0/Dense_0/kernel"])[1]),
        num_classes=int(np.shape(arrays["head/kernel"])[1]), pool="cls" if "cls" in arrays else "gap",
        representation_size=None if rep is None else int(np.shape(rep)[1]), gelu="tanh",
        posemb="learned" if posemb_name else "sincos2d",
    ).validate()


def big_vision_plan(config: ViTConfig, arrays: Mapping[str, np.ndarray]) -> Plan:
    """(our parameter, big_vision name, layout change) for every parameter of ``ViT(config)``."""
    plan = module_plan("patch_embed.proj", "embedding", "conv")
    if config.posemb == "learned":
        resize = lambda a: resize_position_embeddings(a, config.num_patches, config.pool == "cls")  # noqa: E731
        plan.append(("pos_embed", _posemb_name(arrays), resize))
    if config.pool == "cls":
        plan.append(("cls_token", "cls", keep))
    for block in range(config.depth):
        plan += encoder_block_plan(block, f"Transformer/encoderblock_{block}",
                                   attention="MultiHeadDotProductAttention_0", mlp="MlpBlock_0")
    plan += module_plan("norm", "Transformer/encoder_norm", "norm")
    if config.representation_size:
        plan += module_plan("pre_logits", "pre_logits", "linear")
    return plan + module_plan("head", "head", "linear")


def vit_from_big_vision(checkpoint: str | os.PathLike | Mapping[str, np.ndarray], *, image_size: int | None = None,
                        name: str = "big_vision-vit") -> ViT:
    """A big_vision ViT checkpoint (path of its ``.npz``, or its arrays by name) as our ``ViT`` (float32).

    The config comes from ``vit_config_from_big_vision`` (image_size: see there); every parameter is mapped
    by name (module docstring), and the first that does not fit -- missing, of another shape, or unexpected
    -- raises ValueError naming it, before anything is copied. The model computes the checkpoint's logits
    (tests/test_reference_models.py compares them with big_vision's own model code).
    On to PyTorch: ``moe_course.torch.convert.to_torch(vit_from_big_vision(path))``.
    """
    source = os.fspath(checkpoint) if isinstance(checkpoint, (str, os.PathLike)) else "big_vision checkpoint"
    arrays = unscan(read_npz(checkpoint) if isinstance(checkpoint, (str, os.PathLike)) else checkpoint)
    config = vit_config_from_big_vision(arrays, image_size=image_size, name=name)
    model = nnx.eval_shape(lambda: ViT(config, rngs=nnx.Rngs(0)))
    return fill(model, arrays, big_vision_plan(config, arrays), source=source)
