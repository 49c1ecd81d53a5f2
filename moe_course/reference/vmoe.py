"""google-research/vmoe's V-MoE checkpoints -> ``moe_course.models.VMoE`` (its Soft MoE ones -> ``SoftMoEViT``).

vmoe's model (``vmoe/nn/vit_moe.py``, ``VisionTransformerMoe``) is a ViT whose MLP in the blocks listed in
``encoder.moe.layers`` is an ``MlpMoeBlock``: a router (``NoisyTopExpertsPerItemRouter``, a bias-free Dense
``Router/dense``) and E expert MLPs vmapped over a leading expert axis (``Mlp/Dense_{0,1}``). Names:

============================================================  ==========================================
vmoe                                                          ours
============================================================  ==========================================
``embedding``, ``cls``, ``Encoder/posembed_input/pos_embedding``  ``patch_embed.proj``, ``cls_token``,
(1, 1 + patches, width)                                       ``pos_embed`` (resized, class entry kept)
``Encoder/encoderblock_{i}/LayerNorm_0``, ``SelfAttention``,  ``blocks.{i}.norm1``, ``attn`` (heads
``LayerNorm_1``, ``Mlp/Dense_{0,1}``                          merged), ``norm2``, ``mlp.fc{1,2}``
``.../Moe/Router/dense/kernel`` (width, E)                    ``blocks.{i}.mlp.router.kernel``
``.../Moe/Mlp/Dense_0/{kernel,bias}`` (E, width, hidden),      ``blocks.{i}.mlp.experts.fc1_{kernel,bias}``,
``Dense_1`` (E, hidden, width)                                ``fc2_{kernel,bias}``
``Encoder/encoder_norm``, ``pre_logits``, ``head``            ``norm``, ``pre_logits``, ``head``
============================================================  ==========================================

The checkpoint holds only arrays; the routing settings live in the experiment's config (``config.model`` of
a vmoe config file). ``vmoe_config_from_checkpoint`` takes that dict and carries over what our V-MoE can
express: k (``router.num_selected_experts``, vmoe's default 1), the dispatcher's capacity factor (C),
``batch_priority`` (BPR or vanilla), vmoe's capacity rounding (``capacity_ceil_or_round``, default "ceil",
and ``capacity_multiple_of``, default 4), the router noise (vmoe's ``noise_std`` is in units of 1/E), the
aux loss weights (vmoe sums its MoE layers' losses) and ``group_size`` -- vmoe counts tokens per routing
group, we count images, so it must be a whole number of images. Everything else (architecture, experts,
which blocks are MoE) is read from the arrays' names and shapes. vmoe's ``bfloat16`` dispatch option is not
carried: ours dispatches in float32. Checkpoints with QK-norm (``key_ln`` / ``query_ln`` in the attention, the
default of vmoe's Soft MoE configs) are refused: our attention has no QK-norm. Experts are the tanh-GELU MLPs
of ``flax.linen.gelu``: ``gelu="tanh"``. Images go in as vmoe's input pipeline gives them (pixels scaled to [-1, 1]), NHWC.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping

import numpy as np
from flax import nnx

from moe_course.configs.vit import ViTConfig
from moe_course.configs.vmoe import VMoEConfig
from moe_course.configs.soft_moe import SoftMoEConfig
from moe_course.models import build_model
from moe_course.models.vmoe import VMoE
from moe_course.reference.names import (
    Plan, encoder_block_plan, fill, heads_of, keep, module_plan, resize_position_embeddings,
)
from moe_course.reference.vmoe_format import read_vmoe_checkpoint

POSEMB = "Encoder/posembed_input/pos_embedding"
ROUTER = "NoisyTopExpertsPerItemRouter"
SOFT_ROUTER = "vmoe.projects.soft_moe.router.SoftRouter"


def model_params(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The model's parameters out of what a vmoe checkpoint saved: the arrays under ``params/`` (a training
    state), else under ``target/`` (an old flax optimizer), else all of them (a parameter tree)."""
    for prefix in ("params/", "target/"):
        inside = {name[len(prefix):]: a for name, a in arrays.items() if name.startswith(prefix)}
        if inside:
            return inside
    return dict(arrays)


def _get(tree: Mapping, path: str, default=None):
    for key in path.split("."):
        if not isinstance(tree, Mapping) or key not in tree:
            return default
        tree = tree[key]
    return tree


def _placement(moe_blocks: list[int], depth: int) -> dict:
    """Our placement fields for vmoe's MoE block list; ValueError when none of ours gives that list."""
    candidates = list(range(1, depth, 2))
    if moe_blocks == candidates:
        return {"placement": "every-2", "moe_last_n": 1}
    if moe_blocks and moe_blocks == candidates[len(candidates) - len(moe_blocks):]:
        return {"placement": "last-n", "moe_last_n": len(moe_blocks)}
    if moe_blocks == list(range(depth // 2, depth)):
        return {"placement": "second-half", "moe_last_n": 1}
    raise ValueError(f"encoder.moe.layers={tuple(moe_blocks)} cannot be expressed: our placements are every odd "
                     f"block {tuple(candidates)}, the last n of those, or the second half")


def _soft_routing(moe: Mapping, tokens_per_image: int) -> dict:
    """Soft MoE (vmoe's SoftRouter): one routing group per image, as ours; the slots come from ``mu``."""
    group_tokens = moe.get("group_size", tokens_per_image)
    if group_tokens != tokens_per_image:
        raise ValueError(f"encoder.moe.group_size={group_tokens}: our Soft MoE routes each image alone, so only "
                         f"a group of one image ({tokens_per_image} tokens) converts")
    return {"router": "soft", "group_size": 1}


def _routing(model: Mapping | None, num_experts: int, tokens_per_image: int, group_size: int | None = None) -> dict:
    """Our routing fields from vmoe's ``config.model`` (see the module docstring); ``group_size`` (images per
    routing group) replaces the config's token count, which is then not checked."""
    moe = _get(model or {}, "encoder.moe", {})
    router = dict(moe.get("router", {}))
    name = router.get("name", ROUTER)
    if name in (SOFT_ROUTER, "SoftRouter"):
        return _soft_routing(moe, tokens_per_image)
    if name != ROUTER:
        raise ValueError(f"encoder.moe.router.name={name!r} is not supported; vmoe's {ROUTER} (token choice) "
                         f"and {SOFT_ROUTER} convert")
    dispatcher = dict(router.get("dispatcher", {}))
    for field in ("capacity_factor", "batch_priority"):  # vmoe's dispatcher has no default for these
        if field not in dispatcher:
            raise ValueError(f"encoder.moe.router.dispatcher.{field} is missing from the model config; vmoe "
                             f"needs it, and so does the conversion (the checkpoint's arrays do not record it)")
    if "capacity" in dispatcher and dispatcher["capacity"] is not None:
        raise ValueError("encoder.moe.router.dispatcher.capacity (a fixed buffer size) is not supported; give "
                         "capacity_factor instead")
    rounding = dispatcher.get("capacity_ceil_or_round", "ceil")
    if rounding not in ("ceil", "round"):
        raise ValueError(f"encoder.moe.router.dispatcher.capacity_ceil_or_round={rounding!r}: vmoe allows "
                         f"'ceil' or 'round'")
    importance, load = router.get("importance_loss_weight", 1.0), router.get("load_loss_weight", 1.0)
    if importance != load or router.get("gshard_loss_weight", 0.0):
        raise ValueError(f"encoder.moe.router: importance_loss_weight={importance}, load_loss_weight={load}, "
                         f"gshard_loss_weight={router.get('gshard_loss_weight', 0.0)}; our aux loss weighs "
                         f"importance and load equally and has no GShard term")
    group_tokens = moe.get("group_size")
    settings = dict(
        k=int(router.get("num_selected_experts", 1)), capacity_ratio=float(dispatcher["capacity_factor"]),
        allocation="bpr" if dispatcher["batch_priority"] else "vanilla", priority="max",
        capacity_rounding="ceil" if rounding == "ceil" else "vmoe_round",
        capacity_multiple_of=dispatcher.get("capacity_multiple_of", 4) or None,
        noise_std=float(router.get("noise_std", 1.0)) / num_experts, aux_loss_weight=2.0 * float(importance),
        aux_loss_reduction="sum", dispatch="einsum" if dispatcher.get("name", "einsum") == "einsum" else "gather",
    )
    if group_size is not None:
        settings["group_size"] = group_size
    elif group_tokens is not None:
        if group_tokens % tokens_per_image:
            raise ValueError(f"encoder.moe.group_size={group_tokens} tokens is not a whole number of images of "
                             f"{tokens_per_image} tokens; pass group_size (images per routing group)")
        settings["group_size"] = group_tokens // tokens_per_image
    return settings


def vmoe_config_from_checkpoint(arrays: Mapping[str, np.ndarray], model: Mapping | None = None, *,
                                image_size: int | None = None, group_size: int | None = None,
                                name: str = "vmoe") -> VMoEConfig:
    """Our VMoEConfig for a vmoe checkpoint's parameters (names -> arrays, see ``model_params``) and its
    experiment's ``config.model`` dict ``model`` (routing, see the module docstring; None: vmoe's defaults,
    which need the dispatcher's capacity_factor and batch_priority, so then it raises).

    image_size: default the checkpoint's (from its position embeddings); another size resizes them.
    group_size: images per routing group, overriding the config's token count (needed when that is not a
    whole number of images, e.g. at another image size). Raises ValueError naming what cannot be expressed.
    """
    qk_norm = sorted(n for n in arrays if re.search(r"(^|/)(key_ln|query_ln)/", n))
    if qk_norm:
        raise ValueError(f"parameter {qk_norm[0]!r}: this checkpoint normalises queries and keys (QK-norm, vmoe's "
                         f"key_ln / query_ln, the default of its Soft MoE configs); our attention has no QK-norm, so "
                         f"QK-norm checkpoints are not supported")
    depth = len({m.group(1) for n in arrays if (m := re.match(r"Encoder/encoderblock_(\d+)/", n))})
    moe_blocks = sorted({int(m.group(1)) for n in arrays if (m := re.match(r"Encoder/encoderblock_(\d+)/Moe/", n))})
    if not moe_blocks:
        raise ValueError("the checkpoint has no MoE blocks (Encoder/encoderblock_*/Moe); use a dense ViT")
    for needed in ("embedding/kernel", POSEMB, "head/kernel"):
        if needed not in arrays:
            raise ValueError(f"parameter {needed!r} is missing: not a vmoe VisionTransformerMoe classifier")
    patch, _, channels, width = np.shape(arrays["embedding/kernel"])
    block = f"Encoder/encoderblock_{moe_blocks[0]}/Moe"
    soft = f"{block}/Router/mu" in arrays  # Soft MoE: mu (width, experts, slots per expert)
    router_shape = np.shape(arrays[f"{block}/Router/mu" if soft else f"{block}/Router/dense/kernel"])
    num_experts = int(router_shape[1])
    mlp_dim = int(np.shape(arrays[f"{block}/Mlp/Dense_0/kernel"])[2])
    pool = "cls" if "cls" in arrays else "gap"
    classifier = (model or {}).get("classifier", "token")
    if (classifier == "token") != (pool == "cls") or classifier not in ("token", "gap"):
        raise ValueError(f"classifier={classifier!r} is not supported with this checkpoint "
                         f"({'a' if pool == 'cls' else 'no'} cls parameter); use 'token' or 'gap'")
    posemb = int(np.shape(arrays[POSEMB])[1])
    side = math.isqrt(posemb) if math.isqrt(posemb) ** 2 == posemb else math.isqrt(posemb - 1)
    rep = arrays.get("pre_logits/kernel")
    backbone = ViTConfig(
        name=name, image_size=image_size or side * int(patch), patch_size=int(patch), channels=int(channels),
        width=int(width), depth=depth, heads=heads_of(arrays, "Encoder/encoderblock_0/SelfAttention/query/kernel"),
        mlp_dim=mlp_dim, num_classes=int(np.shape(arrays["head/kernel"])[1]), pool=pool,
        representation_size=None if rep is None else int(np.shape(rep)[1]), gelu="tanh",
    ).validate()
    routing = _routing(model, num_experts, backbone.num_tokens, group_size)
    if soft != (routing.get("router") == "soft"):
        raise ValueError(f"the checkpoint's router ({'mu' if soft else 'dense'}) does not match "
                         f"encoder.moe.router.name={_get(model or {}, 'encoder.moe.router.name', ROUTER)!r}")
    if soft:
        return SoftMoEConfig(**backbone.__dict__, num_experts=num_experts, slots_per_expert=int(router_shape[2]),
                             **_placement(moe_blocks, depth), **routing).validate()
    return VMoEConfig(**backbone.__dict__, num_experts=num_experts, **_placement(moe_blocks, depth),
                      **routing).validate()


def merge_slots(mu: np.ndarray) -> np.ndarray:
    """vmoe's Soft MoE ``mu`` (width, experts, slots per expert) -> our ``phi`` (width, experts * slots),
    expert-major: slot j of expert i is column i * slots + j, as ``apply_soft_experts`` reads them."""
    return mu.reshape(mu.shape[0], -1)


def vmoe_plan(config: VMoEConfig) -> Plan:
    """(our parameter, vmoe name, layout change) for every parameter of ``VMoE(config)``."""
    resize = lambda a: resize_position_embeddings(a, config.num_patches, config.pool == "cls")  # noqa: E731
    plan = module_plan("patch_embed.proj", "embedding", "conv") + [("pos_embed", POSEMB, resize)]
    if config.pool == "cls":
        plan.append(("cls_token", "cls", keep))
    moe_blocks = config.moe_blocks()
    for block in range(config.depth):
        theirs = f"Encoder/encoderblock_{block}"
        plan += encoder_block_plan(block, theirs, attention="SelfAttention",
                                   mlp=None if block in moe_blocks else "Mlp")
        if block in moe_blocks:
            ours = f"blocks.{block}.mlp"
            if getattr(config, "router", "sparse") == "soft":
                plan += [(f"{ours}.phi", f"{theirs}/Moe/Router/mu", merge_slots),
                         (f"{ours}.scale", f"{theirs}/Moe/Router/scale", keep)]
            else:
                plan.append((f"{ours}.router.kernel", f"{theirs}/Moe/Router/dense/kernel", keep))
            for layer, dense in (("fc1", "Dense_0"), ("fc2", "Dense_1")):
                plan += [(f"{ours}.experts.{layer}_kernel", f"{theirs}/Moe/Mlp/{dense}/kernel", keep),
                         (f"{ours}.experts.{layer}_bias", f"{theirs}/Moe/Mlp/{dense}/bias", keep)]
    plan += module_plan("norm", "Encoder/encoder_norm", "norm")
    if config.representation_size:
        plan += module_plan("pre_logits", "pre_logits", "linear")
    return plan + module_plan("head", "head", "linear")


def vmoe_from_checkpoint(checkpoint: str | os.PathLike | Mapping[str, np.ndarray], model: Mapping | None = None,
                         *, image_size: int | None = None, group_size: int | None = None,
                         name: str = "vmoe") -> VMoE:
    """A vmoe V-MoE checkpoint (its prefix on disk, read by ``read_vmoe_checkpoint``, or its arrays by name)
    as our ``VMoE`` (float32) -- or, for vmoe's Soft MoE (``router.name`` its ``SoftRouter``; ``Router/mu``
    (width, experts, slots) -> ``phi``, ``Router/scale`` -> ``scale``), our ``SoftMoEViT`` -- with the routing of ``model`` (vmoe's ``config.model`` dict; see
    ``vmoe_config_from_checkpoint`` for it, image_size and group_size).

    Every parameter is mapped by name (module docstring); the first that does not fit -- missing, of another
    shape, or unexpected -- raises ValueError naming it, before anything is copied. On identical weights the
    model's logits and routing equal vmoe's own ``VisionTransformerMoe`` (tests/test_reference_models.py).
    Change the routing afterwards with ``moe_course.models.with_routing`` (e.g. BPR at a smaller C); on to
    PyTorch with ``moe_course.torch.convert.to_torch``.
    """
    source = os.fspath(checkpoint) if isinstance(checkpoint, (str, os.PathLike)) else "vmoe checkpoint"
    stored = read_vmoe_checkpoint(checkpoint) if isinstance(checkpoint, (str, os.PathLike)) else checkpoint
    arrays = model_params(stored)
    config = vmoe_config_from_checkpoint(arrays, model, image_size=image_size, group_size=group_size, name=name)
    vmoe = nnx.eval_shape(lambda: build_model(config, rngs=nnx.Rngs(0)))
    return fill(vmoe, {n: np.asarray(a, np.float32) for n, a in arrays.items()}, vmoe_plan(config), source=source)
