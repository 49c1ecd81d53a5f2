"""V-MoE models: placement, Table 7 parameter counts, routing changes on a trained model, training and CLI."""


import jax
import numpy as np
import pytest
from flax import nnx

from moe_course.cli import main
from moe_course.configs import get_preset
from moe_course.configs.vmoe import VMOE_TABLE_7_PARAMS, VMoEConfig
from moe_course.models import VMoE, build_model, temporary_routing, vmoe_param_count, with_routing
from moe_course.train import TrainConfig, evaluate, train

pytestmark = pytest.mark.filterwarnings("ignore::moe_course.routing.CapacityRoundingWarning")

TINY = VMoEConfig(name="test-moe", image_size=16, patch_size=4, channels=1, width=16, depth=4, heads=2, mlp_dim=32,
                  num_classes=10, pool="gap", num_experts=4, k=2, capacity_ratio=1.0, placement="every-2",
                  group_size=2)


@pytest.mark.parametrize("name", sorted(VMOE_TABLE_7_PARAMS))
def test_table_7_parameter_counts(name):
    count = vmoe_param_count(get_preset("vmoe", name))
    assert abs(count / (VMOE_TABLE_7_PARAMS[name] * 1e6) - 1) < 0.005, (name, count)


def test_placement():
    assert TINY.moe_blocks() == (1, 3)
    assert TINY.replace(placement="last-n", moe_last_n=1).moe_blocks() == (3,)
    assert get_preset("vmoe", "vmoe-h/14-last-5").moe_blocks() == (23, 25, 27, 29, 31)
    model = build_model(TINY, rngs=nnx.Rngs(0))
    assert isinstance(model, VMoE) and len(model.moe_layers()) == 2


@pytest.mark.parametrize("changes, field", [
    (dict(k=5), "k=5"), (dict(capacity_ratio=0.0), "capacity_ratio"), (dict(allocation="greedy"), "allocation"),
    (dict(placement="last-n", moe_last_n=3), "moe_last_n=3"), (dict(group_size=0), "group_size"),
])
def test_config_errors_name_the_field(changes, field):
    with pytest.raises(ValueError, match=field):
        TINY.replace(**changes)


def test_vmoe_round_capacity_of_zero_is_refused_by_the_config():
    assert TINY.replace(capacity_rounding="vmoe_round").capacity_rounding == "vmoe_round"
    with pytest.raises(ValueError, match="capacity_ratio=0.01 gives an expert capacity of 0"):
        TINY.replace(capacity_rounding="vmoe_round", capacity_ratio=0.01)


def test_aux_loss_reduction_mean_or_sum_over_the_moe_layers():
    """google-research/vmoe sums the layers' aux losses (vmoe/nn/vit_moe.py, EncoderMoe); the default averages."""
    images = jax.random.uniform(jax.random.key(0), (4, 16, 16, 1))
    model = build_model(TINY, rngs=nnx.Rngs(0))
    mean = model(images, deterministic=False, rngs=nnx.Rngs(1))
    model.config = TINY.replace(aux_loss_reduction="sum")  # the same weights and router noise
    summed = model(images, deterministic=False, rngs=nnx.Rngs(1))
    assert TINY.aux_loss_reduction == "mean" and len(TINY.moe_blocks()) == 2
    np.testing.assert_allclose(float(summed.aux_loss), 2 * float(mean.aux_loss), rtol=1e-6)
    assert float(mean.aux_loss) > 0
    with pytest.raises(ValueError, match="aux_loss_reduction='max'"):
        TINY.replace(aux_loss_reduction="max")


def test_einsum_and_gather_models_agree_and_routing_changes_in_place():
    images = jax.random.uniform(jax.random.key(0), (4, 16, 16, 1))
    model = build_model(TINY.replace(capacity_ratio=0.5), rngs=nnx.Rngs(0))
    gather = model(images)
    einsum = with_routing(model, dispatch="einsum")(images)
    np.testing.assert_allclose(gather.logits, einsum.logits, rtol=1e-5, atol=1e-6)
    assert len(gather.routing) == 2
    served = lambda out: float(np.mean([np.asarray(r.served).mean() for r in out.routing]))
    low = with_routing(model, allocation="bpr", capacity_ratio=0.1)(images)
    assert served(low) < served(gather) and model.config.allocation == "bpr"
    one = with_routing(model, k=1)(images)
    assert one.routing[0].expert_index.shape[-1] == 1
    with pytest.raises(ValueError, match="noise_std"):
        with_routing(model, noise_std=1.0)
    with pytest.raises(ValueError, match="capacity_ratio"):
        with_routing(model, capacity_ratio=-1.0)
    assert model.config.capacity_ratio == 0.1


def test_temporary_routing_restores_the_previous_settings_even_after_an_error():
    model = build_model(TINY, rngs=nnx.Rngs(0))
    with temporary_routing(model, allocation="bpr", capacity_ratio=0.25) as routed:
        assert routed is model and model.config.capacity_ratio == 0.25
        assert all(layer.allocation == "bpr" for layer in model.moe_layers())
    assert (model.config.allocation, model.config.capacity_ratio) == (TINY.allocation, TINY.capacity_ratio)
    assert all(layer.capacity_ratio == TINY.capacity_ratio for layer in model.moe_layers())
    with pytest.raises(RuntimeError), temporary_routing(model, k=1):
        raise RuntimeError("inside the block")
    assert model.config.k == TINY.k and all(layer.k == TINY.k for layer in model.moe_layers())
    with pytest.raises(ValueError, match="capacity_ratio"), temporary_routing(model, capacity_ratio=-1.0):
        pass
    assert model.config.capacity_ratio == TINY.capacity_ratio


@pytest.mark.slow
def test_training_records_aux_loss_and_resumes(small_digits, tmp_path):
    config = TrainConfig(steps=6, batch_size=16, learning_rate=3e-3, warmup_steps=2, log_every=2, eval_every=3,
                         checkpoint_every=3, eval_batch_size=16)
    straight = train(TINY, small_digits, config, workdir=tmp_path / "a", progress=False)
    assert all(h["aux_loss"] > 0 for h in straight.history)
    train(TINY, small_digits, config, workdir=tmp_path / "b", progress=False, stop_after=4)
    resumed = train(TINY, small_digits, config, workdir=tmp_path / "b", progress=False)
    for a, b in zip(jax.tree.leaves(nnx.state(straight.model, nnx.Param)), jax.tree.leaves(nnx.state(resumed.model, nnx.Param))):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert 0 <= evaluate(resumed.model, small_digits, "test", batch_size=16)["accuracy"] <= 1


def test_batch_size_must_fit_the_routing_group(small_digits):
    with pytest.raises(ValueError, match="eval_batch_size=15 is not a multiple of the model's group_size=2"):
        train(TINY, small_digits, TrainConfig(steps=2, batch_size=16, warmup_steps=1, eval_batch_size=15), progress=False)


def test_cli_trains_vmoe_and_evaluates_with_other_routing(tmp_path, capsys):
    workdir = str(tmp_path / "run")
    common = ["--image-size", "16", "--batch-size", "16", "--warmup-steps", "1", "--workdir", workdir, "--no-progress"]
    assert main(["train", "vmoe", "--preset", "digits-tiny-moe", "--steps", "4", *common]) == 0
    capsys.readouterr()
    assert main(["evaluate", "--workdir", workdir, "--allocation", "bpr", "--capacity-ratio", "0.2", "--k", "1"]) == 0
    out = capsys.readouterr().out
    assert "allocation: bpr" in out and "capacity_ratio: 0.2" in out and "test_accuracy:" in out
    assert main(["evaluate", "--workdir", workdir, "--capacity-ratio", "0"]) == 2
    assert "capacity_ratio=0.0 is not allowed" in capsys.readouterr().err


def test_cli_trains_vmoe_with_other_routing_and_refuses_it_for_dense(tmp_path, capsys):
    from moe_course.train.restore import load_run

    workdir = str(tmp_path / "bpr")
    common = ["--image-size", "16", "--batch-size", "16", "--steps", "2", "--warmup-steps", "1", "--no-progress"]
    assert main(["train", "vmoe", "--preset", "digits-tiny-moe", "--allocation", "bpr", "--capacity-ratio", "0.25",
                 "--workdir", workdir, *common]) == 0
    config = load_run(workdir).model_config
    assert (config.allocation, config.capacity_ratio) == ("bpr", 0.25)
    capsys.readouterr()
    assert main(["train", "vit", "--preset", "digits-tiny", "--allocation", "bpr", "--workdir", str(tmp_path / "vit"),
                 *common]) == 2
    assert "--allocation applies to V-MoE models; this is a ViT" in capsys.readouterr().err
    assert main(["train", "vmoe", "--preset", "digits-tiny-moe", "--k", "9", "--workdir", str(tmp_path / "k9"),
                 *common]) == 2
    assert "k=9" in capsys.readouterr().err
