import jax
import numpy as np
import pytest
from flax import nnx

from moe_course.configs import VMoEConfig
from moe_course.models import build_model, temporary_routing
from moe_course.train import TrainConfig, evaluate, evaluate_routings, train, train_side_by_side

RUN = TrainConfig(steps=4, batch_size=16, learning_rate=3e-3, warmup_steps=1, log_every=2, eval_every=0,
                  checkpoint_every=4, eval_batch_size=16)


def _leaves(model):
    return jax.tree.leaves(nnx.state(model, nnx.Param))


@pytest.mark.slow
def test_side_by_side_runs_equal_the_same_runs_one_after_another(small_digits, tiny_vit_config, tmp_path):
    wide = tiny_vit_config.replace(name="test-wide", mlp_dim=48)
    configs = {"a/narrow": RUN, "wide": RUN.replace(batch_size=8, checkpoint_every=2)}
    together = train_side_by_side({"a/narrow": tiny_vit_config, "wide": wide}, small_digits, configs,
                                  workdir=tmp_path, progress=False)
    assert list(together) == ["a/narrow", "wide"]
    assert (tmp_path / "a-narrow" / "checkpoints").is_dir() and (tmp_path / "wide" / "checkpoints").is_dir()
    for name, config in (("a/narrow", tiny_vit_config), ("wide", wide)):
        alone = train(config, small_digits, configs[name], progress=False)
        for a, b in zip(_leaves(together[name].model), _leaves(alone.model)):
            np.testing.assert_array_equal(a, b)


def test_side_by_side_refuses_a_run_without_a_train_config(small_digits, tiny_vit_config):
    with pytest.raises(ValueError, match=r"config has no TrainConfig for run\(s\) \['b'\]"):
        train_side_by_side({"a": tiny_vit_config, "b": tiny_vit_config}, small_digits, {"a": RUN})


@pytest.mark.slow
def test_evaluate_routings_equals_evaluating_each_routing_in_turn_and_leaves_the_model(small_digits, tiny_vit_config):
    config = VMoEConfig(**{**tiny_vit_config.__dict__, "name": "test-moe", "num_experts": 4, "k": 2,
                           "group_size": 2, "moe_last_n": 1})
    model = build_model(config, rngs=nnx.Rngs(0))
    model = train(config, small_digits, RUN, progress=False, init_model=model).model
    settings = [{"allocation": "vanilla", "capacity_ratio": 0.25}, {"allocation": "bpr", "capacity_ratio": 0.25},
                {"k": 1}]
    results = evaluate_routings(model, small_digits, settings, "test")
    for routing, result in zip(settings, results):
        with temporary_routing(model, **routing):
            assert result == evaluate(model, small_digits, "test")
    assert model.config == config
    with pytest.raises(ValueError, match="cannot be changed"):
        evaluate_routings(model, small_digits, [{"width": 8}])
