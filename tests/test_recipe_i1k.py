"""The ImageNet-1k recipe ``vit-s/16-i1k`` against big_vision's ``configs/vit_s16_i1k.py``, number for number,
the knobs it needed (sincos2d position embeddings, value range, big_vision's Adam and weight decay, bfloat16
first moment, evaluation crop, minival), its MoE variants at equal FLOPs, and a tiny run on a CPU."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from PIL import Image

from moe_course.analysis.flops import flops_per_image
from moe_course.configs import get_preset
from moe_course.models import build_model
from moe_course.models.vit import fixed_position_embeddings, sincos2d_position_embeddings, vit_param_count
from moe_course.recipes import I1K_PRESETS, I1K_SOURCE, data_recipe_for, recipe_for
from moe_course.train.config import TrainConfig
from moe_course.train.optim import kernel_mask, make_optimizer

# (what, ours, big_vision's value, the line of big_vision/configs/vit_s16_i1k.py at I1K_SOURCE's commit it is from)
RECIPE = recipe_for(get_preset("vit", "vit-s/16-i1k"))
MODEL = get_preset("vit", "vit-s/16-i1k")
DATA = data_recipe_for(MODEL)
TABLE = [
    ("batch size", RECIPE.batch_size, 1024, "config.input.batch_size = 1024"),
    ("epochs", DATA["epochs"], 90, "config.total_epochs = 90"),
    ("steps (90 epochs of train[:99%])", RECIPE.steps, round(90 * round(0.99 * 1_281_167) / 1024),
     "config.total_epochs = 90; split='train[:99%]'"),
    ("RandAugment (N, M)", DATA["randaugment"], (2, 10), "'...|flip_lr|randaug(2,10)'"),
    ("value range", MODEL.value_range, "signed", "'|value_range(-1, 1)'"),
    ("eval crop / resize", DATA["eval_crop_fraction"], 224 / 256, "'decode|resize_small(256)|central_crop(224)'"),
    ("minival share of train", DATA["minival_fraction"], 0.01, "config.evals.minival = get_eval('train[99%:]')"),
    ("mixup p", RECIPE.mixup_p, 0.2, "config.mixup = dict(p=0.2, fold_in=None)"),
    ("pool", MODEL.pool, "gap", "pool_type='gap'"),
    ("position embedding", MODEL.posemb, "sincos2d", "posemb='sincos2d'"),
    ("pre-logits width", MODEL.representation_size, 384, "rep_size=True (the width of variant S/16)"),
    ("width, depth, heads, MLP, patch", (MODEL.width, MODEL.depth, MODEL.heads, MODEL.mlp_dim, MODEL.patch_size),
     (384, 12, 6, 1536, 16), "variant='S/16' (big_vision/models/vit.py)"),
    ("classes", MODEL.num_classes, 1000, "config.num_classes = 1000"),
    ("parameters", vit_param_count(MODEL), 22_122_472,
     "vit.Model(1000, variant='S/16', posemb='sincos2d', rep_size=True, pool_type='gap'): its init's leaves, counted "
     "(jax.eval_shape); the fixed table is no parameter"),
    ("image size", MODEL.image_size, 224, "'decode_jpeg_and_inception_crop(224)'"),
    ("loss", "softmax_xent", "softmax_xent", "config.loss = 'softmax_xent' (train.objectives.soft_cross_entropy)"),
    ("optimizer", RECIPE.optimizer, "adam", "config.optax_name = 'scale_by_adam'"),
    ("first moment dtype", RECIPE.mu_dtype, "bfloat16", "config.optax = dict(mu_dtype='bfloat16')"),
    ("learning rate", RECIPE.learning_rate, 1e-3, "config.lr = 0.001"),
    ("weight decay", RECIPE.weight_decay, 1e-4, "config.wd = 0.0001"),
    ("grad clip", RECIPE.grad_clip, 1.0, "config.grad_clip_norm = 1.0"),
    ("warm-up steps", RECIPE.warmup_steps, 10_000, "config.schedule = dict(warmup_steps=10_000, ...)"),
    ("decay", (RECIPE.decay, RECIPE.end_lr_ratio), ("cosine", 0.0), "decay_type='cosine' (to 0, utils.py)"),
    ("seed", RECIPE.seed, 0, "config.seed = 0"),
    ("log / checkpoint steps", (RECIPE.log_every, RECIPE.checkpoint_every), (50, 1000),
     "config.log_training_steps = 50; config.ckpt_steps = 1000"),
    ("gelu", MODEL.gelu, "tanh", "flax.linen.gelu's default approximate=True (big_vision/models/vit.py)"),
]


def test_source_is_named():
    assert I1K_SOURCE == ("google-research/big_vision", "0127fb6b337ee2a27bf4e54dea79cff176527356",
                          "big_vision/configs/vit_s16_i1k.py")


@pytest.mark.parametrize("what, ours, theirs, line", TABLE, ids=[row[0] for row in TABLE])
def test_recipe_equals_big_vision(what, ours, theirs, line):
    assert ours == theirs, f"{what}: ours {ours!r}, big_vision {theirs!r} ({line})"


def test_the_moe_variants_train_on_the_same_recipe_at_the_dense_models_flops():
    """Every variant: the same TrainConfig, the same backbone, forward FLOPs within 0.1% of the dense model's."""
    dense = flops_per_image(MODEL)
    for name in I1K_PRESETS:
        family = "vit" if name.startswith("vit") else "vmoe" if name.startswith("vmoe") else "soft-moe"
        config = get_preset(family, name)
        assert recipe_for(config) == RECIPE and data_recipe_for(config) == DATA
        assert (config.width, config.depth, config.posemb, config.value_range) == (384, 12, "sincos2d", "signed")
        assert abs(flops_per_image(config) / dense - 1) < 1e-3, name
    assert get_preset("vmoe", "vmoe-s/16-i1k-every-2-k2").capacity_ratio == 0.5


def test_sincos2d_is_big_vision_posemb_sincos_2d():
    """A 2x2 grid at width 8: columns sin(x w), cos(x w), sin(y w), cos(y w), w = (1, 1/10000)."""
    table = sincos2d_position_embeddings(2, 8)
    omega = np.array([1.0, 1e-4])
    rows = []
    for y in range(2):
        for x in range(2):
            rows.append(np.concatenate([np.sin(x * omega), np.cos(x * omega), np.sin(y * omega), np.cos(y * omega)]))
    np.testing.assert_allclose(table[0], np.array(rows), rtol=1e-6)
    with pytest.raises(ValueError, match="width=6"):
        get_preset("vit", "i1k-tiny").replace(width=6, heads=2)


def _tiny_model():
    """i1k-tiny at 32 px, one block, its head drawn at random (not the zero init, so the logits differ)."""
    model = build_model(get_preset("vit", "i1k-tiny").replace(image_size=32, depth=1), rngs=nnx.Rngs(0))
    model.head.kernel[...] = jax.random.normal(jax.random.key(3), model.head.kernel.shape)
    return model


def test_signed_value_range_and_fixed_position_embeddings_under_training():
    model = _tiny_model()
    images = jax.random.uniform(jax.random.key(1), (4, 32, 32, 3))
    unit = build_model(model.config.replace(value_range="unit"), rngs=nnx.Rngs(0))
    nnx.update(unit, nnx.state(model))
    logits = model(images).logits
    assert np.abs(logits).max() > 0.1 and not np.allclose(logits, unit(images).logits, atol=1e-3)
    np.testing.assert_allclose(logits, unit(images * 2 - 1).logits, rtol=1e-5, atol=1e-6)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    tx = make_optimizer(RECIPE.replace(steps=10, warmup_steps=1))
    opt_state = tx.init(params)
    labels = jnp.arange(4)

    def loss(p):
        out = nnx.merge(graphdef, p, rest)(images)
        return optax.softmax_cross_entropy_with_integer_labels(out.logits, labels).mean()

    @jax.jit
    def step(params, opt_state):
        updates, opt_state = tx.update(jax.grad(loss)(params), opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    for _ in range(3):
        params, opt_state = step(params, opt_state)
    assert model.pos_embed is None and "pos_embed" not in params  # sincos2d: a constant, never trained or decayed
    assert not np.array_equal(params["patch_embed"]["proj"]["kernel"][...], model.patch_embed.proj.kernel[...])
    mu = [leaf for leaf in jax.tree.leaves(opt_state) if hasattr(leaf, "dtype") and leaf.ndim >= 2]
    assert {str(leaf.dtype) for leaf in mu} == {"bfloat16", "float32"}  # mu bfloat16, nu float32


def test_the_pytorch_twin_computes_the_same_logits():
    """sincos2d and the signed value range in the twin (moe_course.torch.models.ViT): equal logits."""
    torch = pytest.importorskip("torch")
    from moe_course.torch.convert import to_torch

    model = _tiny_model()
    images = np.random.default_rng(0).uniform(size=(2, 32, 32, 3)).astype(np.float32)
    twin = to_torch(model)
    assert "pos_embed" not in twin.state_dict() and "pos_embed" not in dict(twin.named_parameters())
    np.testing.assert_array_equal(twin.pos_embed.numpy(), fixed_position_embeddings(model.config))
    with torch.no_grad():
        logits = twin(torch.from_numpy(images).permute(0, 3, 1, 2)).logits.numpy()
    want = np.asarray(model(jnp.asarray(images)).logits)
    assert np.abs(want).max() > 0.1
    np.testing.assert_allclose(logits, want, rtol=1e-4, atol=1e-5)


def test_weight_decay_is_scaled_by_the_schedule_not_by_the_learning_rate():
    """big_vision/optax.py: update = -m(t) (lr * adam(g) + wd * p) on kernels only. With zero gradients Adam's
    direction is 0, so a kernel moves by -m(t) wd p and a bias not at all; the fifth update is step 4 of a
    10-step warm-up, m = 0.4. optax.adamw would move it by lr(t) wd p, 1000 times less here."""
    config = TrainConfig(steps=100, warmup_steps=10, learning_rate=1e-3, weight_decay=0.1, grad_clip=0.0,
                         optimizer="adam", end_lr_ratio=0.0)
    params = {"dense": {"kernel": jnp.full((2, 2), 2.0), "bias": jnp.full((2,), 2.0)}}
    assert kernel_mask(params) == {"dense": {"kernel": True, "bias": False}}
    tx = make_optimizer(config)
    state = tx.init(params)
    zeros = jax.tree.map(jnp.zeros_like, params)
    for _ in range(5):
        updates, state = tx.update(zeros, state, params)
    np.testing.assert_allclose(updates["dense"]["kernel"], -0.4 * 0.1 * 2.0, rtol=1e-6)
    np.testing.assert_allclose(updates["dense"]["bias"], 0.0)



def test_adamw_decays_the_kernels_only_as_big_vision():
    """big_vision's default ``wd_mults`` is ``.*/kernel$``: with zero gradients, AdamW moves a ViT's kernels by
    -lr wd p and leaves its position embedding, class token, biases and LayerNorms where they are (issue 63:
    the decay mask was every array of ndim >= 2, position embedding and class token included)."""
    from flax import nnx

    from moe_course.configs.vit import ViTConfig
    from moe_course.models import ViT

    model = ViT(ViTConfig(image_size=8, patch_size=4, channels=3, width=8, depth=1, heads=2, mlp_dim=16,
                          num_classes=3, pool="cls"), rngs=nnx.Rngs(0))
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    config = TrainConfig(steps=10, warmup_steps=0, learning_rate=1e-2, weight_decay=0.5, grad_clip=0.0,
                         decay="linear", end_lr_ratio=1.0)
    tx = make_optimizer(config)
    updates, _ = tx.update(jax.tree.map(jnp.zeros_like, params), tx.init(params), params)
    moved = {jax.tree_util.keystr(path): float(np.abs(u).max())
             for path, u in jax.tree_util.tree_leaves_with_path(updates)}
    still = {name for name, size in moved.items() if size == 0.0}
    assert {"['pos_embed']", "['cls_token']", "['head']['bias']", "['norm']['scale']"} <= still, still
    assert all(name.endswith("['kernel']") for name in set(moved) - still), set(moved) - still
    kernel = params["head"]["kernel"]
    np.testing.assert_allclose(updates["head"]["kernel"], -1e-2 * 0.5 * kernel, rtol=1e-5)


PALETTE = np.array([(255, 0, 0), (0, 255, 0), (0, 0, 255), (255, 255, 0), (255, 0, 255), (0, 255, 255),
                    (255, 255, 255), (0, 0, 0), (128, 128, 128), (255, 128, 0)])


def _folder(root: Path, size: int, classes: int, per_class: int, val: int = 1) -> Path:
    """A JPEG class folder: class c's images are PALETTE[c] plus noise, every other one 8 px taller."""
    rng = np.random.default_rng(0)
    for split, count in (("train", per_class), ("val", val)):
        for label in range(classes):
            folder = root / split / f"class{label}"
            folder.mkdir(parents=True)
            colour = PALETTE[label]
            for i in range(count):
                noise = rng.integers(-20, 20, (size + 8 * (i % 2), size, 3))
                pixels = np.clip(colour + noise, 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(folder / f"{i}.jpg", quality=90)
    return root


def test_evaluation_crop_and_minival(tmp_path):
    from moe_course.data.folders import ImageFolder
    from moe_course.data.resize import resize_area, resize_small_size

    root = _folder(tmp_path / "data", 40, classes=2, per_class=50)
    folder = ImageFolder(root, image_size=28, eval_crop_fraction=224 / 256, minival_fraction=0.01)
    assert (folder.resize_small, folder.split_size("train"), folder.split_size("val")) == (32, 99, 1)
    assert folder.files("test") == ImageFolder(root).files("val")  # the folder's val/ is now the test split
    assert not set(folder.files("val")) & set(folder.files("train"))
    path = folder.files("val")[0]
    with Image.open(path) as image:  # resize_small(32) | central_crop(28) done by hand
        pixels = np.asarray(image.convert("RGB"))
    resized = resize_area(pixels, *resize_small_size(*pixels.shape[:2], 32))
    top, left = (resized.shape[0] - 28) // 2, (resized.shape[1] - 28) // 2
    expected = resized[top:top + 28, left:left + 28]
    np.testing.assert_array_equal(folder.get_uint8("val", np.array([0]))["image"][0], expected)
    with pytest.raises(ValueError, match="eval_crop_fraction=1.5"):
        ImageFolder(root, eval_crop_fraction=1.5)


def test_the_i1k_recipe_trains_on_a_cpu(tmp_path, capsys):
    """`moe-course train vit --preset i1k-tiny` (the recipe at 64 px, 10 classes) on a generated JPEG folder:
    RandAugment(2, 10) on the device (no kornia needed), mixup 0.2, big_vision's Adam, at lr 3e-3 so that 30
    steps suffice. The head starts at zero, so every loss starts at ln(10) = 2.303; the training loss falls, the
    test loss (the folder's val/, the held-out minival being 1 image) ends well below it, and run.json names the
    recipe."""
    from moe_course.cli import main
    from moe_course.train.restore import load_run

    root = _folder(tmp_path / "data", 64, classes=10, per_class=10)
    argv = ["train", "vit", "--preset", "i1k-tiny", "--dataset", "imagefolder", "--data-dir", str(root),
            "--workdir", str(tmp_path / "run"), "--steps", "30", "--batch-size", "16", "--warmup-steps", "2", "--learning-rate", "0.003",
            "--no-progress", "--data-workers", "0"]
    assert main(argv) == 0
    summary = dict(line.split(": ", 1) for line in capsys.readouterr().out.splitlines() if ": " in line)
    assert float(summary["test_loss"]) < np.log(10) - 0.3, summary
    record = json.loads((tmp_path / "run" / "run.json").read_text())
    assert record["train"]["recipe"] == "vit-s/16-i1k (tiny)" and record["train"]["randaugment"] == [2, 10]
    assert record["data"]["randaugment"] is None  # on the device (the default), not in the input workers
    history = load_run(tmp_path / "run").history
    assert [r["step"] for r in history] == [10, 20, 30]
    assert history[-1]["loss"] < history[0]["loss"] - 0.05, [r["loss"] for r in history]
