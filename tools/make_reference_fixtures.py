"""Make the reference fixtures of tests/test_reference_models.py from checkouts of the reference code.

Runs google-research/vmoe's ``VisionTransformerMoe`` (with its router, einsum dispatcher and vmapped expert
MLPs, float32 dispatch) and google-research/big_vision's ViT on random weights, and writes, per case, into
``--out`` (default tests/fixtures/reference):

* the checkpoint in the reference's own format -- big_vision: ``<case>.npz``, its parameters named by big_vision's
  own ``utils.tree_flatten_with_names`` and saved with ``np.savez``, as its released ``.npz`` checkpoints are, and
  read back by its ``utils.load_checkpoint_np`` to the same tree; vmoe: ``<case>.index`` +
  ``<case>.data-0000i-of-00002`` written by vmoe's own ``vmoe.checkpoints.partitioned.save_checkpoint``, and
  ``<case>.model.json``, the ``config.model`` dict the model was built from;
* ``<case>.outputs.npz``: the input images, the reference logits, ``logits_bfloat16`` (the same model on the
  same float32 weights in the reference's own bfloat16 mode: big_vision's ``dtype_mm="bfloat16"``, vmoe's
  ``encoder.dtype="bfloat16"``; the reference code's own bfloat16 error is its distance from ``logits``) and,
  for vmoe, per MoE block the routing
  decisions (``served_<block>``: (groups, tokens, experts) bool, the (token, expert) pairs that got a buffer
  slot; ``gates_<block>``: their combine weights; for Soft MoE ``dispatch_<block>`` and ``combine_<block>``,
  (groups, tokens, slots)). vmoe's Soft MoE router always dispatches in bfloat16; the script replaces that
  wrapper by the float32 dispatcher it wraps, to compare with our float32 model.

The paper-size case (V-MoE S/32, E = 32, every-2) has weights far above a fixture's size, so its weights
are generated from their names and shapes by ``moe_course.reference.seeded_parameters`` on both sides; only
the names/shapes (``<case>.shapes.json``), the images and the outputs are stored.

    python tools/make_reference_fixtures.py --vmoe PATH --vit-jax PATH --big-vision PATH [--out DIR] [--only CASE ...]

(PATHs: checkouts of google-research/vmoe, google-research/vision_transformer -- vmoe imports its
``vit_jax`` -- and google-research/big_vision.) Needs jax, flax, ml_collections, absl, einops. Without
TensorFlow, ``tensorflow.io.gfile`` (big_vision's ``utils`` and vmoe's checkpoint I/O) is replaced by the local
file system's.
"""

from __future__ import annotations

import argparse
import json
import sys
import types
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SMALL_VMOE = {  # vmoe's config.model: 4 blocks, MoE in 1 and 3, 4 experts, groups of 2 images
    "num_classes": 7, "patch_size": [4, 4], "hidden_size": 32, "classifier": "token", "representation_size": 24,
    "head_kernel_zero_init": False,
    "encoder": {"num_layers": 4, "mlp_dim": 64, "num_heads": 2, "dropout_rate": 0.0, "attention_dropout_rate": 0.0,
                "moe": {"layers": [1, 3], "num_experts": 4, "group_size": 2 * 17,
                        "router": {"num_selected_experts": 2, "noise_std": 1.0, "importance_loss_weight": 0.005,
                                   "load_loss_weight": 0.005,
                                   "dispatcher": {"name": "einsum", "bfloat16": False, "capacity_factor": 0.5,
                                                  "batch_priority": True}}}},
}


def vmoe_case(changes: dict, base: dict = SMALL_VMOE) -> dict:
    """A copy of the vmoe ``config.model`` ``base`` with ``changes`` ({dotted path: value}) made."""
    model = json.loads(json.dumps(base))
    for path, value in changes.items():
        tree = model
        *parents, last = path.split(".")
        for key in parents:
            tree = tree[key]
        tree[last] = value
    return model


VMOE_CASES = {  # name: (config.model, image size, images)
    "vmoe_small_bpr": (vmoe_case({}), 16, 4),
    "vmoe_small_vanilla_k1": (vmoe_case({"encoder.moe.router.num_selected_experts": 1,
                                         "encoder.moe.router.dispatcher.batch_priority": False,
                                         "encoder.moe.router.dispatcher.capacity_factor": 0.3,
                                         "encoder.moe.router.dispatcher.capacity_multiple_of": 1}), 16, 4),
    "vmoe_small_gap_round": (vmoe_case({"classifier": "gap", "representation_size": None,
                                        "encoder.moe.group_size": 2 * 16,
                                        "encoder.moe.router.dispatcher.capacity_ceil_or_round": "round",
                                        "encoder.moe.router.dispatcher.capacity_multiple_of": None}), 16, 4),
    # vmoe's Soft MoE router in the second half, one image per group, 4 experts x 2 slots
    "vmoe_small_soft": (vmoe_case({"classifier": "gap", "representation_size": None, "encoder.moe.layers": [2, 3],
                                   "encoder.moe.group_size": 16,
                                   "encoder.moe.router": {"name": "vmoe.projects.soft_moe.router.SoftRouter",
                                                          "num_slots": 2}}), 16, 3),
}
PAPER_CASES = {  # V-MoE S/32 (Table 7: 8 blocks, width 512, 8 heads, MLP 2048), E = 32, k = 2
    "vmoe_s32_every2": ([1, 3, 5, 7], True, 1.05),
    "vmoe_s32_last2": ([5, 7], False, 0.5),
}
BIG_VISION_CASES = {  # name: (model kwargs, image size, resized image size or None)
    "bv_tok": (dict(num_classes=7, patch_size=(4, 4), width=32, depth=2, mlp_dim=64, num_heads=2, pool_type="tok",
                    rep_size=24, head_zeroinit=False), 16, 24),
    "bv_gap_scan": (dict(num_classes=5, patch_size=(4, 4), width=32, depth=3, mlp_dim=48, num_heads=4,
                         pool_type="gap", scan=True, head_zeroinit=False), 16, None),
    # the i1k recipe's kind (vit_s16_i1k.py): fixed sincos2d position embeddings, none in the checkpoint
    "bv_sincos": (dict(num_classes=6, patch_size=(4, 4), width=32, depth=2, mlp_dim=64, num_heads=2, pool_type="gap",
                       posemb="sincos2d", rep_size=True, head_zeroinit=False), 16, 24),
}


def perturb(params, seed: int):
    """Random weights everywhere (the initialisers leave biases at ~0 and some heads at 0)."""
    import jax

    leaves, tree = jax.tree.flatten(params)
    rng = np.random.default_rng(seed)
    return jax.tree.unflatten(tree, [np.asarray(a) + 0.1 * rng.standard_normal(np.shape(a)).astype(np.float32)
                                     for a in leaves])


def images(seed: int, count: int, size: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, size=(count, size, size, 3)).astype(np.float32)


def bfloat16_error(outputs: dict) -> str:
    error = np.abs(outputs["logits_bfloat16"] - outputs["logits"])
    return f"bfloat16 |logit error| max {error.max():.4g}, median {np.median(error):.4g}"


def vmoe_outputs(model, params, x, soft: bool):
    """vmoe's logits and, per MoE block, its dispatcher's decisions (captured router outputs): the served
    (token, expert) pairs and their gates, or for Soft MoE the dispatch and combine weights."""
    import flax
    from vmoe.nn import routing
    from vmoe.projects.soft_moe import router as soft_router

    routers = (routing.NoisyTopExpertsPerItemRouter, soft_router.SoftRouter)
    is_router = lambda module, method: isinstance(module, routers)  # noqa: E731
    (logits, _), state = model.apply({"params": params}, x, capture_intermediates=is_router, mutable=["intermediates"])
    out = {"images": x, "logits": np.asarray(logits)}
    for name, found in flax.traverse_util.flatten_dict(state["intermediates"], sep="/").items():
        if not name.endswith("/__call__"):  # the Soft MoE router also sows its unit-norm mu
            continue
        block = int(name.split("/")[1].split("_")[1])  # Encoder/encoderblock_{i}/Moe/Router/__call__
        dispatcher = found[0][0]
        combine = np.asarray(dispatcher.combine_weights)  # (G, S, E, C); Soft MoE: (G, S, E, slots)
        if soft:  # soft weights, slot j of expert i at i * slots + j
            out[f"combine_{block}"] = combine.reshape(*combine.shape[:2], -1)
            out[f"dispatch_{block}"] = np.asarray(dispatcher.dispatch_weights).reshape(*combine.shape[:2], -1)
            continue
        out[f"served_{block}"] = (combine > 0).any(-1)
        out[f"gates_{block}"] = combine.sum(-1)
    return out


def local_gfile() -> None:
    """Without TensorFlow, ``tensorflow.io.gfile`` (big_vision's and vmoe's checkpoint file I/O) as the local file
    system."""
    try:
        import tensorflow  # noqa: F401
        return
    except ImportError:
        pass
    import glob
    import os
    import shutil

    gfile = types.ModuleType("tensorflow.io.gfile")
    gfile.GFile, gfile.exists, gfile.glob, gfile.remove = open, os.path.exists, glob.glob, os.remove
    gfile.makedirs = lambda path: os.makedirs(path, exist_ok=True)
    gfile.rename = lambda src, dst, overwrite=False: shutil.move(src, dst)
    gfile.stat = lambda path: types.SimpleNamespace(length=os.path.getsize(path))
    io = types.ModuleType("tensorflow.io")
    io.gfile = gfile
    sys.modules.update({"tensorflow": types.ModuleType("tensorflow"), "tensorflow.io": io,
                        "tensorflow.io.gfile": gfile})


def make_vmoe(name: str, model_config: dict, size: int, count: int, out: Path, *, seeded: bool = False) -> None:
    import jax
    from vmoe.checkpoints import partitioned
    from vmoe.nn.vit_moe import VisionTransformerMoe
    from vmoe.projects.soft_moe import router as soft_router

    soft_router.Bfloat16Dispatcher = lambda dispatcher: dispatcher  # float32 dispatch, as ours

    from moe_course.reference.names import flatten, seeded_parameters

    model = VisionTransformerMoe(deterministic=True, **model_config)
    x = images(len(name), count, size)
    shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), x))["params"]
    if seeded:  # paper size: weights from names, not stored
        shapes_flat = {k: list(s.shape) for k, s in flatten(shapes).items()}
        params = _unflat(seeded_parameters(shapes_flat, seed=0))
        (out / f"{name}.shapes.json").write_text(json.dumps(shapes_flat, indent=0, sort_keys=True))
    else:
        params = perturb(model.init(jax.random.key(1), x)["params"], seed=len(name))
        partitioned.save_checkpoint(str(out / name), jax.tree.map(jax.numpy.asarray, params), num_shards=2).wait()
    (out / f"{name}.model.json").write_text(json.dumps(model_config, indent=1, sort_keys=True))
    soft = "SoftRouter" in model_config["encoder"]["moe"]["router"].get("name", "")
    outputs = vmoe_outputs(model, params, x, soft)
    bfloat16 = VisionTransformerMoe(deterministic=True, **vmoe_case({"encoder.dtype": "bfloat16"}, model_config))
    outputs["logits_bfloat16"] = np.asarray(bfloat16.apply({"params": params}, x)[0], np.float32)
    np.savez_compressed(out / f"{name}.outputs.npz", **outputs)
    served = [v.sum(-1).mean() / model_config["encoder"]["moe"]["router"].get("num_selected_experts", 1)
              for k, v in outputs.items() if k.startswith("served_")]
    print(f"{name}: logits {outputs['logits'].shape}, served fraction of choices per MoE block {np.round(served, 3)}, "
          f"{bfloat16_error(outputs)}")


def _unflat(arrays: dict) -> dict:
    tree: dict = {}
    for name, array in arrays.items():
        *parents, last = name.split("/")
        node = tree
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = array
    return tree


def paper_config(layers: list[int], batch_priority: bool, capacity: float) -> dict:
    return {"num_classes": 1000, "patch_size": [32, 32], "hidden_size": 512, "classifier": "token",
            "representation_size": 512, "head_kernel_zero_init": False,
            "encoder": {"num_layers": 8, "mlp_dim": 2048, "num_heads": 8, "dropout_rate": 0.0,
                        "attention_dropout_rate": 0.0,
                        "moe": {"layers": layers, "num_experts": 32, "group_size": 2 * 50,
                                "router": {"num_selected_experts": 2, "noise_std": 1.0,
                                           "importance_loss_weight": 0.005, "load_loss_weight": 0.005,
                                           "dispatcher": {"name": "einsum", "bfloat16": False,
                                                          "capacity_factor": capacity,
                                                          "batch_priority": batch_priority}}}}}


def import_big_vision():
    """big_vision's ``models.vit`` and ``utils``. flax's checkpoint module is imported first, while TensorFlow is
    still absent (flax.io then uses the local file system), then the stand-in gfile goes in for big_vision."""
    import flax.training.checkpoints  # noqa: F401

    local_gfile()
    from big_vision import utils
    from big_vision.models import vit

    return vit, utils


def make_big_vision(name: str, kwargs: dict, size: int, resized: int | None, out: Path) -> None:
    import jax

    vit, utils = import_big_vision()
    model = vit.Model(**kwargs)
    x = images(len(name), 3, size)
    params = perturb(model.init(jax.random.key(2), x)["params"], seed=len(name))
    arrays = dict(utils.tree_flatten_with_names(jax.tree.map(np.asarray, params))[0])
    np.savez(out / f"{name}.npz", **arrays)
    loaded = utils.load_checkpoint_np(str(out / f"{name}.npz"))
    assert jax.tree.all(jax.tree.map(np.array_equal, loaded, jax.tree.map(np.asarray, params))), name
    logits, _ = model.apply({"params": params}, x)
    logits16, _ = vit.Model(**kwargs, dtype_mm="bfloat16").apply({"params": params}, x)
    outputs = {"images": x, "logits": np.asarray(logits), "logits_bfloat16": np.asarray(logits16, np.float32)}
    if resized:  # big_vision at another image size: resample_posemb (its fine-tuning path), or for sincos2d
        x2 = images(len(name) + 1, 3, resized)  # none: the model recomputes the table for the larger grid
        params2 = params
        if "pos_embedding" in params:
            new_shape = jax.eval_shape(lambda: model.init(jax.random.key(0), x2))["params"]["pos_embedding"]
            params2 = dict(params, pos_embedding=vit.resample_posemb(np.asarray(params["pos_embedding"]),
                                                                     np.zeros(new_shape.shape, np.float32)))
        outputs |= {"images_resized": x2, "logits_resized": np.asarray(model.apply({"params": params2}, x2)[0])}
    np.savez_compressed(out / f"{name}.outputs.npz", **outputs)
    print(f"{name}: {len(arrays)} arrays, logits {outputs['logits'].shape}, {bfloat16_error(outputs)}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vmoe", required=True, help="checkout of google-research/vmoe")
    parser.add_argument("--vit-jax", required=True, help="checkout of google-research/vision_transformer")
    parser.add_argument("--big-vision", required=True, help="checkout of google-research/big_vision")
    parser.add_argument("--out", default=str(ROOT / "tests" / "fixtures" / "reference"))
    parser.add_argument("--only", nargs="+", default=None, metavar="CASE", help="make only these cases")
    args = parser.parse_args(argv)
    wanted = lambda name: args.only is None or name in args.only  # noqa: E731
    sys.path[:0] = [args.vmoe, args.vit_jax, args.big_vision, str(ROOT)]  # ROOT: this checkout's moe_course
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, (kwargs, size, resized) in filter(lambda item: wanted(item[0]), BIG_VISION_CASES.items()):
        make_big_vision(name, kwargs, size, resized, out)
    local_gfile()  # (a second call changes nothing)
    for name, (model_config, size, count) in filter(lambda item: wanted(item[0]), VMOE_CASES.items()):
        make_vmoe(name, model_config, size, count, out)
    for name, (layers, bpr, capacity) in filter(lambda item: wanted(item[0]), PAPER_CASES.items()):
        make_vmoe(name, paper_config(layers, bpr, capacity), 224, 2, out, seeded=True)


if __name__ == "__main__":
    main()
