"""``--set SECTION.FIELD=VALUE`` (moe_course/configs/overrides.py): any model or train field from the command line,
typed by the field, refused in one line naming it, and recorded in the run's run.json."""

import pytest

from moe_course.cli import main
from moe_course.configs.overrides import parse_settings, typed_changes
from moe_course.configs.vmoe import VMoEConfig
from moe_course.train.config import TrainConfig


def test_each_field_type_is_read_as_written():
    train = typed_changes(TrainConfig, {"randaugment": "2, 10", "steps": "7", "mu_dtype": "bfloat16",
                                        "weight_decay": "0.1"}, "train")
    assert train == {"randaugment": (2, 10.0), "steps": 7, "mu_dtype": "bfloat16", "weight_decay": 0.1}
    assert typed_changes(TrainConfig, {"randaugment": "none"}, "train") == {"randaugment": None}
    model = typed_changes(VMoEConfig, {"check_finite": "False", "representation_size": "none", "noise_std": "0.5"},
                          "model")
    assert model == {"check_finite": False, "representation_size": None, "noise_std": 0.5}
    assert parse_settings(["model.k=1", "train.seed=3"]) == {"model": {"k": "1"}, "train": {"seed": "3"}}


@pytest.mark.parametrize("argv, expected", [
    (["--set", "model.num_expert=4"], "--set model.num_expert: VMoEConfig has no field 'num_expert'; its fields: "),
    (["--set", "train.learning_rate=fast"], "--set train.learning_rate='fast' is not allowed: the field takes a number"),
    (["--set", "model.group_size=2.5"], "--set model.group_size='2.5' is not allowed: the field takes an integer"),
    (["--set", "train.randaugment=2"], "the field takes 2 comma-separated values (int, float)"),
    (["--set", "model.k=0"], "k=0 is not allowed"),  # the config's own check
    (["--set", "train.mu_dtype=float16"], "mu_dtype='float16' is not allowed"),
    (["--set", "steps=3"], "--set 'steps=3' is not allowed; write SECTION.FIELD=VALUE"),
    (["--set", "data.size=3"], "section 'data' is not allowed; use one of ['model', 'train']"),
    (["--set", "train.seed=1", "--set", "train.seed=2"], "--set train.seed is given twice"),
    (["--set", "train.steps=4", "--steps", "5"], "--set train.steps and --steps both set steps; give one"),
    (["--set", "model.k=1", "--k", "2"], "--set model.k and --k both set k; give one"),
])
def test_a_bad_setting_is_one_line_naming_it(argv, expected, capsys):
    assert main(["train", "vmoe", "--preset", "digits-tiny-moe", "--steps", "2", "--warmup-steps", "1",
                 "--no-progress", *argv] if "--steps" not in argv else
                ["train", "vmoe", "--preset", "digits-tiny-moe", "--warmup-steps", "1", "--no-progress", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err and expected in err, err


def test_model_settings_do_not_apply_to_a_checkpoints_model(tmp_path, capsys):
    assert main(["train", "vmoe", "--upcycle-from", str(tmp_path / "dense.npz"), "--set", "model.k=1"]) == 2
    assert "--set model.k does not apply with --upcycle-from" in capsys.readouterr().err


def test_settings_reach_the_model_and_train_configs():
    """What ``train`` and ``plan`` build their run from (cli._preset_config, cli._train_overrides)."""
    from moe_course.cli import _parser, _preset_config, _train_overrides

    args = _parser().parse_args(["train", "vmoe", "--preset", "digits-tiny-moe", "--image-size", "16", "--steps", "2",
                                 "--warmup-steps", "1",
                                 "--set", "model.num_experts=4", "--set", "model.k=1", "--set", "train.weight_decay=0",
                                 "--set", "train.mu_dtype=bfloat16", "--set", "train.end_lr_ratio=0.5"])
    model, recipe, _ = _preset_config(args)
    assert (model.num_experts, model.k, model.image_size) == (4, 1, 16)
    train = recipe.replace(**_train_overrides(args))
    assert (train.steps, train.warmup_steps, train.weight_decay, train.mu_dtype, train.end_lr_ratio) == (2, 1, 0.0, "bfloat16", 0.5)
