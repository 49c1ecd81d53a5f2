"""Default training recipe for each preset: what ``moe-course train`` runs when no flag overrides it.

CPU presets carry recipes measured on the embedded digits (see docs/results.md). Paper presets carry the V-MoE
upstream hyper-parameters (Riquelme et al. 2021, App. B.2, Table 5: Adam, linear decay, weight decay 0.1,
batch 4096, 10k warm-up steps) with the JFT-300M epochs of Table 7 expressed as steps; on another dataset
pass --steps.

ImageNet-1k from scratch: ``vit-s/16-i1k`` carries big_vision's ``configs/vit_s16_i1k.py`` ("Better plain ViT
baselines", Beyer et al. 2022, arXiv 2205.01580; 76.5% top-1 after 90 epochs), number for number
(``I1K_SOURCE`` names the file and commit; tests/test_recipe_i1k.py pins every value), and its V-MoE and Soft
MoE variants (``configs.vmoe``, ``configs.soft_moe``: "-i1k" presets) train on the same recipe. The data side of
a recipe (RandAugment, evaluation crop, minival, epochs) is ``data_recipe_for``. Fine-tuning a released
checkpoint (``moe-course train ... --init-checkpoint``) uses ``FINETUNE`` (big_vision ``configs/transfer.py``).
"""

from __future__ import annotations

from moe_course.train.config import TrainConfig

_JFT_IMAGES = 300_000_000
_PAPER_LR_EPOCHS = {"s": (1e-3, 5), "b": (8e-4, 7), "l": (6e-4, 7), "h": (3e-4, 14)}

_CPU_RECIPES = {
    "digits-tiny": TrainConfig(steps=2500, batch_size=128, learning_rate=1e-3, warmup_steps=100,
                               checkpoint_every=500, log_every=50, eval_every=500),
    # Same recipe as the dense digits-tiny, so chapter 3 compares dense and MoE under one schedule.
    "digits-tiny-moe": TrainConfig(steps=2500, batch_size=128, learning_rate=1e-3, warmup_steps=100,
                                   checkpoint_every=500, log_every=50, eval_every=500),
    # Soft MoE on digits-tiny's backbone: the same schedule again, so dense, V-MoE and Soft MoE compare.
    "digits-tiny-soft": TrainConfig(steps=2500, batch_size=128, learning_rate=1e-3, warmup_steps=100,
                                    checkpoint_every=500, log_every=50, eval_every=500),
    # LIMoE, its Fig. 3 loss baselines and its dense one-tower baseline on the captioned digits: one schedule
    # for all (docs/results.md).
    **dict.fromkeys(("digits-limoe", "digits-limoe-classic", "digits-limoe-local", "digits-dense-one-tower"),
                    TrainConfig(steps=3000, batch_size=128, learning_rate=1e-3, warmup_steps=100,
                                checkpoint_every=500, log_every=50, eval_every=0)),
    # The digit-glyphs comparison (docs/results.md): one schedule for the four glyphs-tiny models; at
    # 800 classes every validation curve flattens by its end (benchmarks/README.md, "Where experts pay").
    **{name: TrainConfig(steps=8000, batch_size=128, learning_rate=2e-3, warmup_steps=100, checkpoint_every=1000,
                         log_every=100, eval_every=1000)
       for name in ("glyphs-tiny", "glyphs-tiny-moe", "glyphs-tiny-ec", "glyphs-tiny-soft")},
    # Chapter 6's pretrained backbone (benchmarks/mod_backbone.py records it in moe_course/results): long enough
    # to have learned (docs/results.md, "Mixture-of-Depths").
    "digits-24-p4": TrainConfig(steps=4000, batch_size=128, learning_rate=1e-3, warmup_steps=200,
                                checkpoint_every=1000, log_every=100, eval_every=1000),
    "digits-small": TrainConfig(steps=3000, batch_size=128, learning_rate=1e-3, warmup_steps=150,
                                checkpoint_every=500, log_every=50, eval_every=500),
}


# google-research/big_vision at this commit: configs/vit_s16_i1k.py (the recipe), big_vision/optax.py (how
# lr, wd and the schedule combine), big_vision/utils.py (get_mixup, create_learning_rate_schedule, steps).
I1K_SOURCE = ("google-research/big_vision", "0127fb6b337ee2a27bf4e54dea79cff176527356",
              "big_vision/configs/vit_s16_i1k.py")
I1K_TRAIN_IMAGES = 1_281_167  # ILSVRC-2012 train; the recipe trains on train[:99%] and holds out train[99%:]
I1K_EPOCHS = 90  # config.total_epochs
I1K_BATCH = 1024  # config.input.batch_size


def epochs_to_steps(epochs: float, train_images: int, batch_size: int) -> int:
    """Optimizer steps of ``epochs`` passes over ``train_images`` at ``batch_size``, rounded to the nearest step
    as big_vision's ``utils.steps`` does (90 epochs of ImageNet's train[:99%], 1,268,355 images: 111,477)."""
    return max(1, round(epochs * train_images / batch_size))


_I1K_RECIPE = TrainConfig(
    steps=epochs_to_steps(I1K_EPOCHS, round(0.99 * I1K_TRAIN_IMAGES), I1K_BATCH), batch_size=I1K_BATCH,
    learning_rate=1e-3, warmup_steps=10_000, decay="cosine", end_lr_ratio=0.0,  # config.lr, config.schedule
    weight_decay=1e-4, grad_clip=1.0,  # config.wd (big_vision/optax.py semantics), config.grad_clip_norm
    optimizer="adam", mu_dtype="bfloat16",  # config.optax_name = 'scale_by_adam', config.optax.mu_dtype
    mixup_p=0.2,  # config.mixup = dict(p=0.2)
    log_every=50, checkpoint_every=1000, eval_every=2500,  # log_training_steps, ckpt_steps, evals' log_steps
    recipe="vit-s/16-i1k",
)
# The data side: pp "decode_jpeg_and_inception_crop(224)|flip_lr|randaug(2,10)" (crop and flip are the image
# folders' training augmentation), pp_eval "resize_small(256)|central_crop(224)" (a crop of 224/256 of the
# shorter side), minival train[99%:], 90 epochs.
_I1K_DATA = {"randaugment": (2, 10), "eval_crop_fraction": 224 / 256, "minival_fraction": 0.01,
             "epochs": I1K_EPOCHS}
# The i1k recipe on a CPU (tests, benchmarks/accelerator.sh part i1k's dry run): every number but the length,
# the batch and the warm-up (and no epochs: --steps counts).
_I1K_TINY_RECIPE = _I1K_RECIPE.replace(steps=40, batch_size=32, warmup_steps=4, log_every=10, checkpoint_every=40,
                                       eval_every=0, eval_batch_size=64, recipe="vit-s/16-i1k (tiny)")
I1K_PRESETS = ("vit-s/16-i1k", "vmoe-s/16-i1k-every-2-k1", "vmoe-s/16-i1k-every-2-k2", "vmoe-s/16-i1k-last-2-k1",
               "vmoe-s/16-i1k-last-2-k2", "soft-moe-s/16-i1k")

# Fine-tuning a released checkpoint on a new folder: big_vision configs/transfer.py (get_config and _set_task):
# optax_name 'big_vision.momentum_hp' (SGD, momentum 0.9, bfloat16 accumulator), batch_size 512, lr 0.01,
# wd None, grad_clip_norm 1.0, mixup p 0, schedule warmup 500 + cosine, total_steps 10,000 (its CIFAR tasks;
# 500 for pets and flowers: pass --steps). V-MoE App. B fine-tunes with the same SGD momentum 0.9 and batch 512.
FINETUNE = TrainConfig(steps=10_000, batch_size=512, learning_rate=0.01, warmup_steps=500, decay="cosine",
                       end_lr_ratio=0.0, weight_decay=0.0, grad_clip=1.0, optimizer="sgd", momentum=0.9,
                       mu_dtype="bfloat16", log_every=10, checkpoint_every=1000, eval_every=100,
                       recipe="finetune (big_vision transfer.py)")
# Its data side (transfer.py, crop='inception_crop' with flip; eval resize_small(448)|central_crop(384):
# 384/448 of the shorter side; minival train[98%:] for CIFAR).
_FINETUNE_DATA = {"randaugment": None, "eval_crop_fraction": 384 / 448, "minival_fraction": 0.0, "epochs": None}


def data_recipe_for(model_config, *, finetune: bool = False) -> dict:
    """The data side of a preset's recipe, for image folders: {"randaugment": (N, M) or None,
    "eval_crop_fraction": central crop / resized shorter side (None: the whole shorter side),
    "minival_fraction": share of train held out as the validation split (0: use val/), "epochs": the length
    in epochs (None: the recipe's steps)}; ``finetune``: the fine-tuning recipe's. All None/0 for presets
    without one."""
    if finetune:
        return dict(_FINETUNE_DATA)
    if model_config.name in I1K_PRESETS:
        return dict(_I1K_DATA)
    if model_config.name == "i1k-tiny":
        return {**_I1K_DATA, "epochs": None}
    return {"randaugment": None, "eval_crop_fraction": None, "minival_fraction": 0.0, "epochs": None}


def recipe_for(model_config) -> TrainConfig:
    """The TrainConfig a preset trains with by default (a plain TrainConfig for unnamed configs)."""
    name = model_config.name
    if name.startswith("mod-"):  # an MoD preset ("mod-<backbone>-c<C>") trains with its backbone's recipe
        return recipe_for(model_config.replace(name=name[len("mod-"):].rsplit("-c", 1)[0]))
    if name in _CPU_RECIPES:
        return _CPU_RECIPES[name]
    if name in I1K_PRESETS:  # big_vision's vit_s16_i1k.py, the MoE variants on the same recipe
        return _I1K_RECIPE
    if name == "i1k-tiny":
        return _I1K_TINY_RECIPE
    if name.startswith(("vit-", "vmoe-")):  # V-MoE trains with its dense ViT's recipe (App. B.2)
        size, patch = name.split("-", 1)[1].split("-")[0].split("/")
        lr, epochs = _PAPER_LR_EPOCHS[size]
        if size == "l" and patch == "16":
            lr = 4e-4
        return TrainConfig(steps=epochs * _JFT_IMAGES // 4096, batch_size=4096, learning_rate=lr,
                           warmup_steps=10_000, decay="linear", end_lr_ratio=0.0, weight_decay=0.1,
                           checkpoint_every=5000, log_every=500, eval_every=10_000)
    if name.startswith("deit-"):  # DeiT (Touvron et al. 2021): AdamW, lr 5e-4 * batch/512, wd 0.05, cosine
        return TrainConfig(steps=300 * 1_281_167 // 1024, batch_size=1024, learning_rate=1e-3,
                           warmup_steps=5 * 1_281_167 // 1024, weight_decay=0.05, end_lr_ratio=0.0,
                           checkpoint_every=5000, log_every=500, eval_every=10_000)
    return TrainConfig()
