import jax
import numpy as np
import pytest
from flax import nnx

from moe_course.train import TrainConfig, TrainingDiverged, evaluate, train
from moe_course.train.checkpoint import WorkdirError
from moe_course.train.optim import learning_rate_schedule
from moe_course.train.restore import load_run

FAST = TrainConfig(steps=6, batch_size=16, learning_rate=3e-3, warmup_steps=2, log_every=2, eval_every=3,
                   checkpoint_every=3, eval_batch_size=16)


def _params(model):
    return jax.tree.leaves(nnx.state(model, nnx.Param))


def test_loss_goes_down_and_history_is_recorded(small_digits, tiny_vit_config):
    result = train(tiny_vit_config, small_digits, FAST.replace(steps=30, eval_every=10, log_every=10), progress=False)
    steps = [h["step"] for h in result.history]
    assert steps == [10, 20, 30]
    assert result.history[-1]["task_loss"] < result.history[0]["task_loss"]
    assert "val_accuracy" in result.history[-1]
    metrics = evaluate(result.model, small_digits, "test", batch_size=16)
    assert metrics["examples"] == small_digits.split_size("test") and 0 <= metrics["accuracy"] <= 1


def test_resume_reproduces_uninterrupted_run(small_digits, tiny_vit_config, tmp_path):
    straight = train(tiny_vit_config, small_digits, FAST, workdir=tmp_path / "a", progress=False)
    first = train(tiny_vit_config, small_digits, FAST, workdir=tmp_path / "b", progress=False, stop_after=4)
    assert first.resumed_from is None
    resumed = train(tiny_vit_config, small_digits, FAST, workdir=tmp_path / "b", progress=False)
    assert resumed.resumed_from == 3  # the newest complete checkpoint before the interruption
    for a, b in zip(_params(straight.model), _params(resumed.model)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert [h["step"] for h in resumed.history] == [h["step"] for h in straight.history]
    loaded = load_run(tmp_path / "b")
    assert loaded.step == 6
    for a, b in zip(_params(straight.model), _params(loaded.model)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_resume_refuses_a_different_run(small_digits, tiny_vit_config, tmp_path):
    train(tiny_vit_config, small_digits, FAST.replace(steps=2), workdir=tmp_path, progress=False)
    with pytest.raises(ValueError, match="model.width"):
        train(tiny_vit_config.replace(width=32, heads=2), small_digits, FAST, workdir=tmp_path, progress=False)


def test_resume_accepts_a_run_recorded_before_a_config_field_existed(small_digits, tiny_vit_config, tmp_path):
    import json

    train(tiny_vit_config, small_digits, FAST.replace(steps=2), workdir=tmp_path, progress=False)
    record = json.loads((tmp_path / "run.json").read_text())
    del record["model"]["dropout"], record["train"]["grad_clip"]  # as if written by an older library
    (tmp_path / "run.json").write_text(json.dumps(record))
    assert train(tiny_vit_config, small_digits, FAST.replace(steps=3), workdir=tmp_path, progress=False).resumed_from == 2
    with pytest.raises(ValueError, match=r"model.dropout: saved 0.0, now 0.5"):  # missing = the default, 0.0
        train(tiny_vit_config.replace(dropout=0.5), small_digits, FAST.replace(steps=3), workdir=tmp_path,
              progress=False)


def test_incompatible_data_is_caught_before_training(small_digits, tiny_vit_config):
    with pytest.raises(ValueError, match="image_size=32"):
        train(tiny_vit_config.replace(image_size=32), small_digits, FAST, progress=False)
    with pytest.raises(ValueError, match="num_classes=5"):
        train(tiny_vit_config.replace(num_classes=5), small_digits, FAST, progress=False)
    with pytest.raises(ValueError, match="batch_size=1000"):
        train(tiny_vit_config, small_digits, FAST.replace(batch_size=1000), progress=False)


@pytest.mark.parametrize("decay", ["cosine", "linear"])
def test_schedule_warms_up_then_decays(decay):
    cfg = TrainConfig(steps=100, learning_rate=1.0, warmup_steps=10, end_lr_ratio=0.0, decay=decay)
    lr = learning_rate_schedule(cfg)
    assert float(lr(0)) == 0.0 and float(lr(10)) == pytest.approx(1.0)
    assert float(lr(55)) < 1.0 and float(lr(100)) == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("changes, field", [({"steps": 0}, "steps"), ({"learning_rate": 0.0}, "learning_rate"),
                                            ({"decay": "step"}, "decay"), ({"log_every": -1}, "log_every")])
def test_bad_train_config(changes, field):
    with pytest.raises(ValueError, match=field):
        TrainConfig().replace(**changes)


def test_warmup_longer_than_the_run_is_refused():
    with pytest.raises(ValueError, match=r"^warmup_steps=11 is larger than steps=10: .*use warmup_steps <= 10$"):
        TrainConfig(steps=10, warmup_steps=11).validate()
    assert TrainConfig(steps=10, warmup_steps=10).validate().warmup_steps == 10


class NaNFromCall:
    """The digits, but every training batch from the ``first_bad``-th one on has NaN images."""

    def __init__(self, base, first_bad: int):
        self.base, self.first_bad, self.calls = base, first_bad, 0

    def __getattr__(self, name):
        return getattr(self.base, name)

    def get(self, split, indices, *, epoch=0):
        batch = self.base.get(split, indices, epoch=epoch)
        if split == "train":
            self.calls += 1
            if self.calls >= self.first_bad:
                batch = {**batch, "image": np.full_like(batch["image"], np.nan)}
        return batch


def test_divergence_stops_naming_the_step_and_never_checkpoints_nan(small_digits, tiny_vit_config, tmp_path):
    config = FAST.replace(steps=8, checkpoint_every=2, log_every=4, eval_every=0, keep_checkpoints=5)
    with pytest.raises(TrainingDiverged) as caught:
        train(tiny_vit_config, NaNFromCall(small_digits, first_bad=5), config, workdir=tmp_path, progress=False)
    err = caught.value
    assert (err.step, err.last_checkpoint) == (5, 4)
    assert "the loss became nan at step 5; the last good checkpoint is step 4" in str(err)
    assert [h["step"] for h in err.history] == [4]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["2", "4"]
    run = load_run(tmp_path)
    assert run.step == 4 and [h["step"] for h in run.history] == [4]
    assert all(np.isfinite(p).all() for p in _params(run.model))


def test_damaged_newest_checkpoint_falls_back_to_the_previous_one(small_digits, tiny_vit_config, tmp_path, capfd):
    config = FAST.replace(steps=6, checkpoint_every=2, eval_every=0)
    train(tiny_vit_config, small_digits, config, workdir=tmp_path / "b", progress=False, stop_after=4)
    data = sorted((tmp_path / "b/checkpoints/4").glob("state/d/*"), key=lambda p: p.stat().st_size)[-1]
    with open(data, "r+b") as f:  # what a full disk or a cut copy leaves
        f.truncate(data.stat().st_size // 3)
    capfd.readouterr()
    assert load_run(tmp_path / "b").step == 2
    err = capfd.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err
    assert err.startswith("the checkpoint of step 4 (") and err.endswith("is damaged; using the checkpoint of step 2")
    resumed = train(tiny_vit_config, small_digits, config, workdir=tmp_path / "b", progress=False)
    assert resumed.resumed_from == 2 and "moved to 4.damaged" in capfd.readouterr().err
    assert sorted(p.name for p in (tmp_path / "b/checkpoints").iterdir()) == ["4", "4.damaged", "6"]
    for step in ("4", "6"):  # truncate every checkpoint: nothing restores
        for data in (tmp_path / "b/checkpoints" / step).glob("state/d/*"):
            with open(data, "r+b") as f:
                f.truncate(1)
    with pytest.raises(WorkdirError, match=rf"^{tmp_path / 'b'}: none of the checkpoints restores \(step 6 "):
        load_run(tmp_path / "b")
    assert "Traceback" not in capfd.readouterr().err
