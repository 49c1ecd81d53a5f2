"""Default training recipe for each preset: what ``moe-course train`` runs when no flag overrides it.

CPU presets carry recipes measured on the embedded digits (see docs/results.md). Paper presets carry the V-MoE
upstream hyper-parameters (Riquelme et al. 2021, App. B.2, Table 5: Adam, linear decay, weight decay 0.1,
batch 4096, 10k warm-up steps) with the JFT-300M epochs of Table 7 expressed as steps; on another dataset
pass --steps.
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


def recipe_for(model_config) -> TrainConfig:
    """The TrainConfig a preset trains with by default (a plain TrainConfig for unnamed configs)."""
    name = model_config.name
    if name.startswith("mod-"):  # an MoD preset ("mod-<backbone>-c<C>") trains with its backbone's recipe
        return recipe_for(model_config.replace(name=name[len("mod-"):].rsplit("-c", 1)[0]))
    if name in _CPU_RECIPES:
        return _CPU_RECIPES[name]
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
