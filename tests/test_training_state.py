"""The training state as the loop holds it: donated to the step, and created sharded on the devices."""

import jax
import numpy as np
import pytest
from flax import nnx

from moe_course.configs import get_preset
from moe_course.models import build_model
from moe_course.parallel import (
    abstract_training_state, init_training_state, make_mesh, shard_batch, shard_training_state,
)
from moe_course.parallel import sharding as sharding_module
from moe_course.train import TrainConfig, train
from moe_course.train.optim import make_optimizer
from moe_course.train.steps import make_train_step

TINY = get_preset("vmoe", "digits-tiny-moe")


def _batch(config, n=16):
    rng = np.random.default_rng(0)
    return {"image": rng.integers(0, 256, (n, config.image_size, config.image_size, config.channels), np.uint8),
            "label": rng.integers(0, config.num_classes, n).astype(np.int32)}


def test_donated_step_writes_the_new_state_into_the_old_buffers():
    model = build_model(TINY, rngs=nnx.Rngs(0))
    tx = make_optimizer(TrainConfig())
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    opt_state = tx.init(params)
    batch, key = jax.device_put(_batch(TINY)), jax.random.key(0)
    step = make_train_step(graphdef, tx, donate=True)
    compiled = step.lower(params, rest, opt_state, batch, key).compile()
    state_bytes = sum(leaf.nbytes for leaf in jax.tree.leaves((params, opt_state)))
    assert compiled.memory_analysis().alias_size_in_bytes >= 0.9 * state_bytes  # (the step counter may be apart)
    new_params, new_opt, _ = step(params, rest, opt_state, batch, key)
    assert all(leaf.is_deleted() for leaf in jax.tree.leaves((params, opt_state)))
    assert not any(leaf.is_deleted() for leaf in jax.tree.leaves((new_params, new_opt, rest)))
    kept = make_train_step(graphdef, tx).lower(new_params, rest, new_opt, batch, key).compile()
    assert kept.memory_analysis().alias_size_in_bytes == 0  # the default step donates nothing


def test_training_from_init_model_leaves_the_callers_model_usable(small_digits, tiny_vit_config):
    model = build_model(tiny_vit_config, rngs=nnx.Rngs(0))
    before = [np.asarray(leaf) for leaf in jax.tree.leaves(nnx.state(model, nnx.Param))]
    config = TrainConfig(steps=2, batch_size=16, warmup_steps=1, log_every=1, eval_every=0)
    trained = train(tiny_vit_config, small_digits, config, init_model=model, progress=False).model
    after = jax.tree.leaves(nnx.state(model, nnx.Param))
    assert all(np.array_equal(a, b) for a, b in zip(before, after))  # not deleted, not changed
    assert not all(np.array_equal(a, np.asarray(b)) for a, b in
                   zip(before, jax.tree.leaves(nnx.state(trained, nnx.Param))))


def test_state_created_on_the_devices_equals_the_host_path_and_never_builds_it_on_the_host(monkeypatch):
    mesh = make_mesh("data=1")
    tx = make_optimizer(TrainConfig())
    expected = shard_training_state(build_model(TINY, rngs=nnx.Rngs(3)), mesh, tx)

    def refuse(*args, **kwargs):
        raise AssertionError("the state went through the host (sharding.put / make_array_from_callback)")

    monkeypatch.setattr(sharding_module, "put", refuse)
    monkeypatch.setattr(jax, "make_array_from_callback", refuse)
    monkeypatch.setattr(jax, "device_put", refuse)
    graphdef, params, rest, opt_state, (param_sh, opt_sh) = init_training_state(TINY, mesh, tx, seed=3)
    leaves = jax.tree.leaves((params, rest, opt_state))
    assert all(isinstance(leaf, jax.Array) for leaf in leaves)  # never a host numpy array
    monkeypatch.undo()

    assert graphdef == expected[0]
    for got, want in zip(jax.tree.leaves((params, opt_state)), jax.tree.leaves((expected[1], expected[3]))):
        assert got.sharding == want.sharding and got.dtype == want.dtype
        # jit fuses the initialisers: equal up to float rounding (the position embedding differs by ~4e-9)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-7)
    for got, want in zip(jax.tree.leaves(rest), jax.tree.leaves(expected[2])):
        np.testing.assert_array_equal(jax.random.key_data(got) if jax.dtypes.issubdtype(got.dtype,
                                      jax.dtypes.prng_key) else got,
                                      jax.random.key_data(want) if jax.dtypes.issubdtype(want.dtype,
                                      jax.dtypes.prng_key) else want)
    step = make_train_step(graphdef, tx, shardings=(param_sh, opt_sh), donate=True)
    _, _, metrics = step(params, rest, opt_state, shard_batch(_batch(TINY), mesh), jax.random.key(0))
    assert np.isfinite(float(metrics["loss"]))


def test_abstract_state_allocates_nothing_and_carries_the_shardings():
    mesh = make_mesh("data=1")
    tx = make_optimizer(TrainConfig())
    paper = get_preset("vmoe", "vmoe-h/14-every-2")  # 7.2 B parameters: only shapes can be built here
    graphdef, params, rest, opt_state, (param_sh, opt_sh) = abstract_training_state(paper, mesh, tx)
    leaves = jax.tree.leaves((params, rest, opt_state))
    assert all(isinstance(leaf, jax.ShapeDtypeStruct) and leaf.sharding is not None for leaf in leaves)
    assert sum(np.prod(leaf.shape) for leaf in jax.tree.leaves(params)) > 7e9
    assert jax.tree.structure(opt_sh) == jax.tree.structure(jax.tree.map(lambda leaf: leaf.sharding, opt_state))

