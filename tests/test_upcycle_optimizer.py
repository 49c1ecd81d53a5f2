"""The dense run's optimizer state carried through sparse upcycling (``upcycle(..., optimizer_state=...)``,
``train(..., init_opt_state=...)``; issue 63 item 1): Adam's moments tiled to the experts as the weights are, the
router's zero, counts copied; the first update of a carried run equals Adam written out by hand on that state;
a state that does not fit is refused with ``OptimizerStateMismatch`` before anything compiles."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from moe_course.configs.vit import ViTConfig
from moe_course.configs.vmoe import VMoEConfig
from moe_course.models import OptimizerStateMismatch, ViT, upcycle
from moe_course.train import TrainConfig, train
from moe_course.train.optim import learning_rate_schedule, make_optimizer, restart_schedule

pytestmark = pytest.mark.filterwarnings("ignore::moe_course.routing.CapacityRoundingWarning")

DENSE = ViTConfig(name="dense", image_size=16, patch_size=4, channels=1, width=32, depth=2, heads=2, mlp_dim=64,
                  num_classes=10, pool="gap")
E = 4
MLP = (("fc1", "kernel"), ("fc1", "bias"), ("fc2", "kernel"), ("fc2", "bias"))


def _moe(**settings) -> VMoEConfig:
    """DENSE's backbone with one MoE layer (block 1), 4 experts, groups of 2 images, top-1 after the softmax."""
    fields = {**DENSE.__dict__, "name": "upcycled", "num_experts": E, "placement": "every-2", "group_size": 2}
    return VMoEConfig(**{**fields, **settings})


def _stepped_state(dense: ViT, config: TrainConfig, steps: int = 3):
    """``make_optimizer(config)``'s state on ``dense``'s parameters after ``steps`` updates with random gradients,
    so every moment is non-zero and the counts are ``steps``."""
    tx = make_optimizer(config)
    params = nnx.state(dense, nnx.Param)
    state = tx.init(params)
    for step in range(steps):
        grads = jax.tree.map(lambda p, s=step: jax.random.normal(jax.random.key(s), p.shape, p.dtype), params)
        _, state = tx.update(grads, state, params)
    return state


def _part(state, kind):
    """The one node of ``state`` of optax type ``kind`` (ScaleByAdamState, ScaleByScheduleState, TraceState)."""
    found = [n for n in jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, kind)) if isinstance(n, kind)]
    assert len(found) == 1, found
    return found[0]


@pytest.mark.parametrize("train_config", [TrainConfig(), TrainConfig(optimizer="adam", mu_dtype="bfloat16")],
                         ids=["adamw", "adam-bf16-mu"])
def test_the_upcycled_adam_moments_are_the_dense_ones_tiled(train_config):
    """mu and nu of block 1's experts are E copies of the dense MLP's moments (exactly), the router's are zero in
    the moment's dtype, every other moment and every count is the dense run's, and the tree is the one the
    V-MoE's own optimizer keeps (``tx.init`` on the upcycled parameters: same structure, shapes, dtypes)."""
    dense = ViT(DENSE, rngs=nnx.Rngs(0))
    dense_state = _stepped_state(dense, train_config)
    moe, carried = upcycle(dense, _moe(), seed=1, optimizer_state=dense_state)
    fresh = make_optimizer(train_config).init(nnx.state(moe, nnx.Param))
    assert jax.tree.structure(carried) == jax.tree.structure(fresh)
    assert jax.tree.map(lambda a: (a.shape, a.dtype), carried) == jax.tree.map(lambda a: (a.shape, a.dtype), fresh)

    dense_adam, adam = _part(dense_state, optax.ScaleByAdamState), _part(carried, optax.ScaleByAdamState)
    assert int(adam.count) == int(dense_adam.count) == 3
    assert int(_part(carried, optax.ScaleByScheduleState).count) == 3
    for moment in ("mu", "nu"):
        dense_m, moe_m = getattr(dense_adam, moment), getattr(adam, moment)
        for layer, kind in MLP:
            tiled = np.asarray(moe_m["blocks"][1]["mlp"]["experts"][f"{layer}_{kind}"][...])
            source = np.asarray(dense_m["blocks"][1]["mlp"][layer][kind][...])
            assert tiled.shape == (E, *source.shape) and np.abs(source).min() > 0
            for expert in tiled:
                np.testing.assert_array_equal(expert, source)
            # block 0 stays a dense MLP: its moments are copied
            np.testing.assert_array_equal(moe_m["blocks"][0]["mlp"][layer][kind][...],
                                          dense_m["blocks"][0]["mlp"][layer][kind][...])
        router = moe_m["blocks"][1]["mlp"]["router"]["kernel"][...]
        assert router.shape == (DENSE.width, E) and router.dtype == dense_m["blocks"][1]["mlp"]["fc1"]["kernel"].dtype
        assert not np.any(np.asarray(router, np.float32))
        for path in (("patch_embed", "proj", "kernel"), ("blocks", 1, "attn", "query", "kernel"), ("head", "bias")):
            source, target = dense_m, moe_m
            for key in path:
                source, target = source[key], target[key]
            np.testing.assert_array_equal(target[...], source[...])
    if train_config.mu_dtype == "bfloat16":
        assert adam.mu["blocks"][1]["mlp"]["experts"]["fc1_kernel"].dtype == jnp.bfloat16
    assert int(_part(restart_schedule(carried), optax.ScaleByScheduleState).count) == 0
    assert int(_part(restart_schedule(carried), optax.ScaleByAdamState).count) == 3  # Adam's count stays


def _by_hand_adamw_step(params, grads, adam, lr: float, config: TrainConfig):
    """One optax.adamw step written out (optax defaults b1=0.9, b2=0.999, eps=1e-8; global-norm clipping first;
    decoupled decay lr x wd on the parameters named "...kernel", as big_vision's ``.*/kernel$``): the parameters
    after it. The trees are read leaf by leaf in ``params``' layout (on a mesh its Params carry sharding metadata
    the moments' do not)."""
    b1, b2, eps = 0.9, 0.999, 1e-8
    norm = jnp.sqrt(sum(jnp.sum(jnp.square(g)) for g in jax.tree.leaves(grads)))
    scale = jnp.minimum(1.0, config.grad_clip / norm)
    t = int(adam.count) + 1

    def step(path, p, g, m, v):
        decayed = str([k.key for k in path if isinstance(k, jax.tree_util.DictKey)][-1]).endswith("kernel")
        g = g * scale
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        u = (m / (1 - b1 ** t)) / (jnp.sqrt(v / (1 - b2 ** t)) + eps)
        return p - lr * (u + (config.weight_decay * p if decayed else 0.0))

    like = lambda tree: jax.tree.unflatten(jax.tree.structure(params), jax.tree.leaves(tree))  # noqa: E731
    return jax.tree_util.tree_map_with_path(step, params, like(grads), like(adam.mu), like(adam.nu))


@pytest.mark.parametrize("on_mesh", [False, True], ids=["one device", "mesh"])
def test_the_first_update_of_a_carried_run_is_adam_on_the_tiled_state(tmp_path, on_mesh):
    """A dense run of 3 steps (its checkpoint read back by ``load_run`` with its optimizer state), upcycled with
    that state; the carried run's first step (``train(..., init_opt_state=...)``) equals Adam written out by hand
    on the tiled moments with Adam's step 4 and the learning rate of the carried schedule step 3, for the
    gradient of the same batch and key. The same step from fresh moments differs from it, so the state is used.
    On a mesh too, where the run's Params carry sharding metadata the carried state's lack."""
    from moe_course import parallel
    from moe_course.data import load_dataset
    from moe_course.data.pipeline import TrainBatch
    from moe_course.train.objectives import objective_for
    from moe_course.train.restore import load_run
    from moe_course.train.steps import as_float_images

    dataset = load_dataset("digits", image_size=16, seed=0)
    config = TrainConfig(steps=6, batch_size=8, learning_rate=1e-3, warmup_steps=2, log_every=1, eval_every=0,
                         checkpoint_every=3, weight_decay=0.1)
    train(DENSE, dataset, config.replace(steps=3), workdir=tmp_path / "dense", progress=False)
    run = load_run(tmp_path / "dense")
    moe_config = _moe(k=1, capacity_ratio=2.0)
    moe, carried = upcycle(run.model, moe_config, seed=1, optimizer_state=run.opt_state)
    assert int(_part(carried, optax.ScaleByAdamState).count) == 3

    start = nnx.state(moe, nnx.Param)
    mesh = parallel.make_mesh(None, num_experts=moe_config.num_experts) if on_mesh else None
    result = train(moe_config, dataset, config, init_model=moe, init_opt_state=carried, progress=False, stop_after=1,
                   mesh=mesh)
    after = nnx.state(result.model, nnx.Param)

    graphdef, _, rest = nnx.split(moe, nnx.Param, ...)
    batch = as_float_images(jax.tree.map(jnp.asarray, TrainBatch(dataset, config.batch_size, config.seed)(0)))
    key = jax.random.fold_in(jax.random.key(config.seed), 1)  # the loop's key of step 1

    def loss(params):
        task, aux, _ = objective_for(moe_config).loss(nnx.merge(graphdef, params, rest), batch, nnx.Rngs(key))
        return task + aux

    grads = jax.grad(loss)(start)
    lr = float(learning_rate_schedule(config)(3))  # the schedule's step carried from the dense run
    expected = _by_hand_adamw_step(start, grads, _part(carried, optax.ScaleByAdamState), lr, config)
    fresh = make_optimizer(config).init(start)
    fresh_expected = _by_hand_adamw_step(start, grads, _part(fresh, optax.ScaleByAdamState), lr, config)
    difference = {path: float(jnp.abs(a[...] - b[...]).max())
                  for (path, a), (_, b) in zip(nnx.to_flat_state(after), nnx.to_flat_state(expected))}
    # An attention key bias has a gradient of 0 up to rounding (the softmax over keys ignores a shift shared by
    # all keys), which Adam normalises into steps of rounding noise: those are held to the size of their step.
    key_bias = {path for path in difference if path[-2:] == ("key", "bias")}
    rest = max(d for path, d in difference.items() if path not in key_bias)
    print(f"max |carried run - Adam by hand|: {rest:.2e}; attention key biases "
          f"{max(difference[path] for path in key_bias):.2e}")
    assert rest < 3e-7, rest  # about 2 float32 ulps of a parameter near 1
    assert max(difference[path] for path in key_bias) < 2e-6
    experts = ("blocks", 1, "mlp", "experts", "fc1_kernel")
    moved = [np.asarray(tree[experts[0]][experts[1]][experts[2]][experts[3]][experts[4]][...])
             for tree in (start, after, fresh_expected)]
    assert np.abs(moved[1] - moved[0]).max() > 1e-5  # it trained
    assert np.abs(moved[2] - moved[1]).max() > 1e-5  # and not as from fresh moments
    # the caller's carried state is not donated away
    assert np.isfinite(np.asarray(_part(carried, optax.ScaleByAdamState).mu["head"]["kernel"][...])).all()


def test_a_state_that_does_not_fit_is_refused_with_a_named_error():
    """upcycle: a state of another dense model (width 16) names the first moment that differs; train: a carried
    Adam state for an SGD run, a bfloat16 first moment for a float32 run, and a state without init_model."""
    from moe_course.data import load_dataset

    dense = ViT(DENSE, rngs=nnx.Rngs(0))
    other = ViT(DENSE.replace(width=16), rngs=nnx.Rngs(0))
    with pytest.raises(OptimizerStateMismatch, match=r"moment at blocks\.0\.attn\.key\.bias has shape \(16,\), the "
                                                     r"dense parameter \(32,\)"):
        upcycle(dense, _moe(), optimizer_state=make_optimizer(TrainConfig()).init(nnx.state(other, nnx.Param)))
    with pytest.raises(OptimizerStateMismatch, match="holds no part shaped like the dense model's parameters"):
        upcycle(dense, _moe(), optimizer_state=(optax.EmptyState(),))

    dataset = load_dataset("digits", image_size=16, seed=0)
    config = TrainConfig(steps=2, batch_size=8, warmup_steps=1)
    moe, carried = upcycle(dense, _moe(), optimizer_state=make_optimizer(config).init(nnx.state(dense, nnx.Param)))
    with pytest.raises(OptimizerStateMismatch, match="init_opt_state does not fit this run's optimizer"):
        train(_moe(), dataset, config.replace(optimizer="sgd"), init_model=moe, init_opt_state=carried,
              progress=False)
    bf16 = upcycle(dense, _moe(), optimizer_state=make_optimizer(config.replace(optimizer="adam", mu_dtype="bfloat16"))
                   .init(nnx.state(dense, nnx.Param)))[1]
    with pytest.raises(OptimizerStateMismatch, match=r"is bfloat16\[.*\] where this run's optimizer keeps float32"):
        train(_moe(), dataset, config.replace(optimizer="adam"), init_model=moe, init_opt_state=bf16, progress=False)
    with pytest.raises(ValueError, match="init_opt_state is given without init_model"):
        train(_moe(), dataset, config, init_opt_state=carried, progress=False)
