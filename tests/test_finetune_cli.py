"""`moe-course train ... --init-checkpoint PATH --init-format vmoe|big_vision`: a released checkpoint (the small
fixtures of tests/fixtures/reference) fine-tuned on a new image folder at a new image size with a new head,
with the fine-tuning recipe (big_vision configs/transfer.py: SGD momentum 0.9, batch 512, short schedule)."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx
from PIL import Image

from moe_course.recipes import FINETUNE
from moe_course.reference.evaluate import load_reference
from moe_course.reference.finetune import finetune_start, with_new_head

pytestmark = pytest.mark.filterwarnings("ignore::moe_course.routing.CapacityRoundingWarning")  # vmoe's rounding

FIXTURES = Path(__file__).parent / "fixtures" / "reference"
CASES = {  # format[-variant] -> (checkpoint, extra flags, the checkpoint's classes)
    "big_vision": (FIXTURES / "bv_tok.npz", [], 7),
    "big_vision-sincos2d": (FIXTURES / "bv_sincos.npz", [], 6),  # no position embeddings in the checkpoint
    "vmoe": (FIXTURES / "vmoe_small_bpr", ["--init-model-config", str(FIXTURES / "vmoe_small_bpr.model.json"),
                                           "--init-group-size", "2"], 7),
}


def _folder(root: Path, classes: int = 3, per_class: int = 8) -> Path:
    """Three colours plus noise, 40 px JPEGs; val/ one image per class."""
    rng = np.random.default_rng(0)
    for split, count in (("train", per_class), ("val", 1)):
        for label in range(classes):
            folder = root / split / f"c{label}"
            folder.mkdir(parents=True)
            for i in range(count):
                pixels = np.clip([label * 120, 255 - label * 120, 60] + rng.integers(-30, 30, (40, 40, 3)), 0, 255)
                Image.fromarray(pixels.astype(np.uint8)).save(folder / f"{i}.jpg")
    return root


def test_the_recipe_is_big_vision_transfer():
    """big_vision configs/transfer.py: optax_name 'big_vision.momentum_hp' (momentum 0.9, bfloat16), batch 512,
    lr 0.01, wd None, grad_clip_norm 1.0, warmup 500 + cosine, total_steps 10,000 (its CIFAR tasks)."""
    assert (FINETUNE.optimizer, FINETUNE.momentum, FINETUNE.mu_dtype, FINETUNE.batch_size) == ("sgd", 0.9, "bfloat16", 512)
    assert (FINETUNE.learning_rate, FINETUNE.weight_decay, FINETUNE.grad_clip) == (0.01, 0.0, 1.0)
    assert (FINETUNE.warmup_steps, FINETUNE.decay, FINETUNE.end_lr_ratio, FINETUNE.steps) == (500, "cosine", 0.0, 10_000)


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_body_is_the_checkpoints_and_the_head_is_new(case):
    (path, flags, classes), fmt = CASES[case], case.split("-")[0]
    options = dict(zip(flags[::2], flags[1::2]))
    kwargs = {"model_config": options.get("--init-model-config"),
              "group_size": int(options["--init-group-size"]) if "--init-group-size" in options else None}
    checkpoint = load_reference(path, fmt, image_size=32, **kwargs)
    model = with_new_head(checkpoint, num_classes=3, seed=5, name="tuned")  # what finetune_start returns
    assert (model.config.num_classes, model.config.value_range, model.config.image_size) == (3, "signed", 32)
    assert model.head.kernel.shape[-1] == 3 and checkpoint.head.kernel.shape[-1] == classes
    assert not np.any(model.head.kernel[...]) and not np.any(model.head.bias[...])  # re-initialised: zeros
    body, original = nnx.state(model, nnx.Param), nnx.state(checkpoint, nnx.Param)
    del body["head"], original["head"]
    assert jax.tree.all(jax.tree.map(np.array_equal, body, original))  # position embeddings resized to 32 px too
    with pytest.raises(ValueError, match="num_classes=0"):
        finetune_start(path, fmt, num_classes=0, **kwargs)  # checked before the checkpoint is read


@pytest.mark.parametrize("case", sorted(CASES))
def test_fine_tuning_from_the_cli_lowers_the_loss(case, tmp_path, capsys):
    """8 steps of 8 images at 32 px (the checkpoints are 16 px, 6 or 7 classes): exit 0, and the loss falls -- the new
    head starts at zero, so the first step's loss is ln 3 exactly; the mean over the 8 steps (one record) and
    the loss on the folder's val/ end below it."""
    from moe_course.cli import main
    from moe_course.train.restore import load_run

    (path, flags, _), fmt = CASES[case], case.split("-")[0]
    family = "vit" if fmt == "big_vision" else "vmoe"
    argv = ["train", family, "--init-checkpoint", str(path), "--init-format", fmt, *flags, "--image-size", "32",
            "--dataset", "imagefolder", "--data-dir", str(_folder(tmp_path / "data")), "--steps", "8",
            "--batch-size", "8", "--warmup-steps", "2", "--workdir", str(tmp_path / "run"), "--no-progress",
            "--data-workers", "0"]
    assert main(argv) == 0
    summary = dict(line.split(": ", 1) for line in capsys.readouterr().out.splitlines() if ": " in line)
    assert float(summary["val_loss"]) < np.log(3), summary
    run = load_run(tmp_path / "run")
    assert run.train_config.recipe == FINETUNE.recipe and run.model_config.num_classes == 3
    assert [record["step"] for record in run.history] == [8] and run.history[0]["loss"] < np.log(3) - 0.02
    assert main(argv[:4] + ["--dataset", "imagefolder"]) == 2  # no --init-format
    assert "needs --init-format" in capsys.readouterr().err
