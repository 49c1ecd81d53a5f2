"""Mixture-of-Depths routing and the MoD block (A-MoD, Gadhikar et al. 2024, Sec. 3)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from moe_course.layers import EncoderBlock, MoDBlock
from moe_course.routing import attention_router_scores, mod_capacity, mod_gate, mod_select, standard_router_scores

WIDTH, HEADS, MLP_DIM, TOKENS = 16, 2, 32, 12


def _x(batch=3, seed=0):
    return jax.random.normal(jax.random.key(seed), (batch, TOKENS, WIDTH))


def _attention(batch=3, seed=1):
    logits = jax.random.normal(jax.random.key(seed), (batch, HEADS, TOKENS, TOKENS)) * 2
    return jax.nn.softmax(logits, axis=-1)


def test_attention_scores_equal_a_literal_loop_over_heads_and_query_rows():
    attention = np.asarray(_attention())
    batch, heads, n, _ = attention.shape
    literal = np.zeros((batch, n))
    for b in range(batch):
        for i in range(n):  # token i's score: the attention it receives (Eq. 4)
            literal[b, i] = sum(attention[b, h, j, i] for h in range(heads) for j in range(n)) / (heads * n)
    np.testing.assert_allclose(attention_router_scores(jnp.asarray(attention)), literal, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(literal.sum(1), 1.0, rtol=1e-5)


def test_standard_scores_are_a_linear_map():
    x, w = _x(), jax.random.normal(jax.random.key(5), (WIDTH, 1))
    np.testing.assert_allclose(standard_router_scores(x, w), (x @ w)[..., 0], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="router_kernel has 8 inputs; x has width 16"):
        standard_router_scores(x, jnp.ones((8,)))


@pytest.mark.parametrize("capacity, kept", [(1.0, 12), (0.5, 6), (0.125, 2), (0.01, 1), (0.375, 4), (0.7, 8)])
def test_selection_keeps_round_c_times_p_top_tokens_in_token_order(capacity, kept):
    scores = jax.random.normal(jax.random.key(2), (4, TOKENS))
    selection = mod_select(scores, capacity)
    assert selection.index.shape == (4, kept) == (4, mod_capacity(TOKENS, capacity))
    assert (np.diff(np.asarray(selection.index), axis=1) > 0).all()
    for b in range(4):
        assert set(np.asarray(selection.index[b])) == set(np.argsort(-np.asarray(scores[b]), kind="stable")[:kept])
    assert (np.asarray(selection.processed).sum(1) == kept).all()


def test_selection_ties_go_to_the_earlier_token_and_the_class_token_can_be_kept():
    scores = jnp.zeros((1, TOKENS))
    assert mod_select(scores, 0.25).index.tolist() == [[0, 1, 2]]
    scores = jnp.arange(TOKENS, dtype=jnp.float32)[None]  # token 0 scores lowest
    assert mod_select(scores, 0.25, keep_first=True).index.tolist() == [[0, 10, 11]]
    assert mod_select(np.asarray(scores), 0.25, keep_first=True).index.tolist() == [[0, 10, 11]]  # NumPy in


@pytest.mark.parametrize("capacity", [0, 0.0, -0.5, 1.5, True, "0.5", float("nan")])
def test_capacity_outside_zero_one_is_refused(capacity):
    with pytest.raises(ValueError, match=r"capacity=.* is not allowed; use a number in \(0, 1\]"):
        mod_capacity(TOKENS, capacity)


def _blocks(router, capacity, seed=0):
    mod = MoDBlock(WIDTH, HEADS, MLP_DIM, capacity=capacity, router=router, keep_first=False, num_tokens=TOKENS,
                   rngs=nnx.Rngs(seed))
    dense = EncoderBlock(WIDTH, HEADS, MLP_DIM, rngs=nnx.Rngs(seed))
    nnx.update(dense, nnx.state(mod.block))
    return mod, dense


@pytest.mark.parametrize("router", ["standard", "attention"])
def test_skipped_tokens_are_bit_identical_and_processed_ones_see_only_each_other(router):
    mod, dense = _blocks(router, 0.5)
    x, attention = _x(), _attention()
    y, _, record = mod(x, previous_attention=attention)
    skipped = ~np.asarray(record.processed)
    assert skipped.sum() == 3 * (TOKENS - 6)
    assert (np.asarray(y)[skipped] == np.asarray(x)[skipped]).all()  # bitwise, not approximately
    for b in range(3):  # the processed tokens: the dense block run on them alone, its update times the gate
        index = np.asarray(record.index[b])
        alone, _, _ = dense(x[b:b + 1, index])
        gate = np.asarray(record.gate[b])[:, None]
        expected = np.asarray(x[b, index]) + gate * (np.asarray(alone[0]) - np.asarray(x[b, index]))
        np.testing.assert_allclose(np.asarray(y[b, index]), expected, rtol=1e-5, atol=1e-5)
    if router == "attention":
        assert (np.asarray(record.gate) == 1).all()


def test_attention_routing_at_capacity_one_equals_the_dense_block():
    mod, dense = _blocks("attention", 1.0)
    x = _x()
    y, maps, _ = mod(x, previous_attention=_attention(), return_attention=True)
    y_dense, maps_dense, _ = dense(x, return_attention=True)
    np.testing.assert_allclose(y, y_dense, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(maps, maps_dense, rtol=1e-6, atol=1e-7)


def test_standard_routing_gates_the_update_and_trains_the_router():
    mod, _ = _blocks("standard", 0.5)
    x = _x()

    def loss(model):
        y, _, _ = model(x)
        return jnp.sum(y**2)

    grads = nnx.grad(loss)(mod)
    router_grad = np.asarray(grads.router.kernel[...])
    assert np.abs(router_grad).sum() > 0, "no gradient reaches W_r"
    _, _, record = mod(x)
    np.testing.assert_allclose(record.gate, mod_gate(jnp.take_along_axis(record.scores, record.index, 1)))
    assert ((np.asarray(record.gate) > 0) & (np.asarray(record.gate) < 1)).all()


def test_returned_maps_are_full_size_with_zeros_for_skipped_tokens():
    mod, _ = _blocks("attention", 0.5)
    _, maps, record = mod(_x(), previous_attention=_attention(), return_attention=True)
    assert maps.shape == (3, HEADS, TOKENS, TOKENS)
    processed = np.asarray(record.processed)
    np.testing.assert_allclose(np.asarray(maps).sum(-1)[processed[:, None, :].repeat(HEADS, 1)], 1.0, rtol=1e-5)
    skipped = ~processed
    assert (np.asarray(maps).transpose(0, 2, 1, 3)[skipped] == 0).all()  # a skipped token attends to nothing
    assert (np.asarray(maps).transpose(0, 3, 1, 2)[skipped] == 0).all()  # and receives nothing


def test_attention_routing_needs_the_previous_maps_and_router_names_are_checked():
    mod, _ = _blocks("attention", 0.5)
    with pytest.raises(ValueError, match="previous_attention"):
        mod(_x())
    with pytest.raises(ValueError, match="router='learned' is not allowed; use one of 'standard', 'attention'"):
        MoDBlock(WIDTH, HEADS, MLP_DIM, capacity=0.5, router="learned", keep_first=False, num_tokens=TOKENS,
                 rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="capacity=2"):
        MoDBlock(WIDTH, HEADS, MLP_DIM, capacity=2, router="standard", keep_first=False, num_tokens=TOKENS,
                 rngs=nnx.Rngs(0))


def test_the_compiled_block_computes_less_at_lower_capacity():
    """XLA's own FLOP count of the compiled forward pass falls with C (the masked-after pitfall would not)."""
    x, attention = _x(8), _attention(8)
    flops = {}
    for capacity in (1.0, 0.5, 0.125):
        mod, _ = _blocks("attention", capacity)
        graphdef, state = nnx.split(mod)
        forward = jax.jit(lambda state, x, a: nnx.merge(graphdef, state)(x, previous_attention=a)[0])
        flops[capacity] = forward.lower(state, x, attention).compile().cost_analysis()["flops"]
    assert flops[0.5] < 0.6 * flops[1.0] and flops[0.125] < 0.25 * flops[1.0], flops


# --- the MoD ViT and its adaptation from a dense ViT -------------------------------------------------------

from moe_course.configs import MOD_PRESETS, get_preset  # noqa: E402
from moe_course.configs.mod import mod_config_from_vit  # noqa: E402
from moe_course.models import ViT, build_model, mod_from_vit, mod_param_count, vit_param_count  # noqa: E402

DENSE = get_preset("vit", "digits-small").replace(depth=4, width=32, mlp_dim=64, heads=2)  # 64 patch tokens


def _leaves(model):
    return {tuple(str(k) for k in path): np.asarray(v[...])
            for path, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}


@pytest.mark.parametrize("router", ["attention", "standard"])
def test_adapting_a_dense_vit_keeps_every_weight_bit_identical(router):
    dense = ViT(DENSE.replace(pool="cls"), rngs=nnx.Rngs(7))
    mod = mod_from_vit(dense, capacity=0.125, router=router)
    theirs = _leaves(mod)
    for path, value in _leaves(dense).items():
        moved = path[:2] + ("block",) + path[2:] if path[0] == "blocks" and int(path[1]) in (1, 3) else path
        assert np.array_equal(theirs.pop(moved), value), path
    assert all(p[2] == "router" for p in theirs) and (len(theirs) == 2) == (router == "standard"), theirs.keys()


def test_attention_routed_mod_at_capacity_one_equals_the_dense_vit_and_keeps_the_class_token():
    dense = ViT(DENSE.replace(pool="cls"), rngs=nnx.Rngs(1))
    images = jax.random.uniform(jax.random.key(0), (2, 32, 32, 1))
    full = mod_from_vit(dense, capacity=1.0, router="attention")(images)
    np.testing.assert_allclose(full.logits, dense(images).logits, rtol=1e-5, atol=1e-5)
    out = mod_from_vit(dense, capacity=0.125, router="attention")(images, return_attention=True)
    assert [r.index.shape for r in out.routing] == [(2, 8), (2, 8)]  # round(0.125 * 65) = 8, class token in
    assert all((np.asarray(r.index[:, 0]) == 0).all() for r in out.routing)
    assert len(out.attention) == 4 and out.attention[1].shape == (2, 2, 65, 65)


def test_mod_trains_through_the_one_loop(small_digits):
    from moe_course.train import TrainConfig, train

    config = mod_config_from_vit(DENSE.replace(image_size=16, patch_size=4), capacity=0.5, router="standard")
    run = TrainConfig(steps=4, batch_size=8, learning_rate=1e-3, warmup_steps=1, log_every=2, eval_every=0,
                      checkpoint_every=0, eval_batch_size=16)
    history = train(config, small_digits, run, progress=False).history
    assert all(np.isfinite(h["loss"]) for h in history)


def test_presets_are_the_papers_backbones_at_half_and_one_eighth_capacity():
    assert {(c.name.split("-c")[0], c.capacity) for c in MOD_PRESETS.values()} >= {
        ("mod-deit-s/16", 0.5), ("mod-deit-s/16", 0.125), ("mod-vit-b/16", 0.125), ("mod-deit-ti/16", 0.5)}
    config = MOD_PRESETS["mod-deit-ti/16-c0.125"]
    assert config.mod_blocks() == (1, 3, 5, 7, 9, 11) and config.router == "attention"
    assert mod_param_count(config) == vit_param_count(get_preset("vit", "deit-ti/16"))  # no router parameters
    standard = config.replace(router="standard")
    assert mod_param_count(standard) == mod_param_count(config) + 6 * config.width


@pytest.mark.parametrize("changes, message", [
    (dict(capacity=0.0), "capacity=0.0 is not allowed"), (dict(capacity=1.5), "capacity=1.5 is not allowed"),
    (dict(router="topk"), "router='topk' is not allowed"), (dict(mod_placement="first"), "mod_placement='first'"),
    (dict(mod_placement="last-n", mod_last_n=3), "mod_last_n=3 is not allowed for depth=4"),
    (dict(depth=1), "depth=1 is not allowed for a MoD ViT"),
])
def test_config_errors_name_the_field(changes, message):
    with pytest.raises(ValueError, match=message):
        mod_config_from_vit(DENSE, capacity=0.5).replace(**changes)


def test_only_a_dense_vit_can_be_adapted():
    from moe_course.configs import VMOE_PRESETS

    vmoe = build_model(VMOE_PRESETS["digits-tiny-moe"], rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="init model is a VMoE; MoD adapts a dense ViT"):
        mod_from_vit(vmoe, capacity=0.5)


# --- leave-one-out importance -------------------------------------------------------------------------------

from moe_course.analysis.importance import leave_one_out_importance, mean_rank_correlation  # noqa: E402


@pytest.mark.parametrize("pool", ["gap", "cls"])
def test_leave_one_out_importance_equals_removing_each_token_by_hand(pool):
    import optax

    model = ViT(DENSE.replace(image_size=16, pool=pool), rngs=nnx.Rngs(3))
    images = jax.random.uniform(jax.random.key(1), (2, 16, 16, 1))
    labels = jnp.array([3, 7])
    importance = leave_one_out_importance(model, images, labels)
    tokens = np.asarray(model.embed(images))
    first = 1 if pool == "cls" else 0
    assert importance.shape == (2, 16)

    def loss(x):
        for block in model.blocks:
            x, _, _ = block(jnp.asarray(x))
        return np.asarray(optax.softmax_cross_entropy_with_integer_labels(model.head(model.pool(model.norm(x))), labels))

    full = loss(tokens)
    for patch in (0, 5, 15):
        by_hand = loss(np.delete(tokens, first + patch, axis=1)) - full
        np.testing.assert_allclose(importance[:, patch], by_hand, rtol=1e-4, atol=1e-5)


def test_rank_correlation_is_spearman_per_image():
    a = np.array([[1.0, 2.0, 3.0, 4.0], [4.0, 3.0, 2.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    b = np.array([[10.0, 20.0, 30.0, 40.0], [1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0]])
    assert mean_rank_correlation(a, b) == pytest.approx(0.0)  # +1 and -1; the constant image is skipped
    assert mean_rank_correlation(a[:1], b[:1] ** 3) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="must both be"):
        mean_rank_correlation(a, b[:, :3])


def test_mod_flops_count_the_kept_tokens_only():
    from moe_course.analysis import attention_flops, flops_breakdown, mlp_flops

    dense = get_preset("vit", "deit-s/16")
    mod = MOD_PRESETS["mod-deit-s/16-c0.125"]
    kept, t, d, h = 25, 197, 384, 1536  # round(0.125 * 197) = 25 tokens in each of the 6 MoD blocks
    parts, dense_parts = flops_breakdown(mod), flops_breakdown(dense)
    assert parts["attention"] == 6 * attention_flops(t, d) + 6 * attention_flops(kept, d)
    assert parts["mlp"] == 6 * mlp_flops(t, d, h) + 6 * mlp_flops(kept, d, h)
    assert dense_parts["attention"] - parts["attention"] == 6 * (attention_flops(t, d) - attention_flops(kept, d))
    standard = flops_breakdown(mod.replace(router="standard"))
    assert standard["mlp"] - parts["mlp"] == 6 * 2 * t * d  # the linear routers


# --- the isoFLOP baseline: the dense ViT with fewer blocks ----------------------------------------------------

from moe_course.analysis import attention_flops, flops_per_image, isoflop_depth, mlp_flops  # noqa: E402
from moe_course.models import truncated_vit  # noqa: E402


def test_isoflop_depth_is_the_dense_depth_of_nearest_cost():
    dense = get_preset("vit", "digits-small")  # 64 tokens, width 96, MLP 192, 6 blocks
    block = attention_flops(64, 96) + mlp_flops(64, 96, 192)
    for capacity, kept, depth in ((0.5, 32, 4), (0.125, 8, 3)):
        mod = MOD_PRESETS[f"mod-digits-small-c{capacity}"]
        mod_block = attention_flops(kept, 96) + mlp_flops(kept, 96, 192)
        assert flops_per_image(mod) - flops_per_image(dense) == 3 * (mod_block - block)
        costs = [abs(flops_per_image(dense.replace(depth=d)) - flops_per_image(mod)) for d in range(1, 7)]
        assert isoflop_depth(mod) == depth == 1 + int(np.argmin(costs))
    # A-MoD Table 1's isoFLOP models (FLOPs there count a multiply-add once): 9 of 12 blocks at C = 0.5 for
    # DeiT-Ti/S and ViT-B, 18 of 24 for ViT-L; at C = 0.125, 7 (DeiT-Ti) and 13 (ViT-L). For DeiT-S and ViT-B at
    # C = 0.125 the paper keeps 6 blocks although 7 are nearer the MoD model's cost.
    depths = [isoflop_depth(MOD_PRESETS[f"mod-{m}-c{c}"]) for m in ("deit-ti/16", "deit-s/16", "vit-b/16", "vit-l/16")
              for c in (0.5, 0.125)]
    assert depths == [9, 7, 9, 7, 9, 7, 18, 13]
    assert isoflop_depth(dense) == 6 and isoflop_depth(dense.replace(depth=1)) == 1


@pytest.mark.parametrize("pool", ["gap", "cls"])
def test_truncated_vit_is_the_first_blocks_with_weights_bit_identical(pool):
    config = DENSE.replace(image_size=16, pool=pool)
    dense = ViT(config, rngs=nnx.Rngs(4))
    short = truncated_vit(dense, 2)
    assert short.config == config.replace(depth=2, name=f"{config.name}-depth2") and len(short.blocks) == 2
    theirs = _leaves(short)
    for path, value in _leaves(dense).items():
        if path[0] == "blocks" and int(path[1]) >= 2:
            continue
        assert np.array_equal(theirs.pop(path), value), path
    assert not theirs, theirs.keys()

    @nnx.jit
    def first_two_blocks(model, images):
        x = model.embed(images)
        for block in model.blocks[:2]:
            x, _, _ = block(x)
        return model.head(model.pool(model.norm(x)))

    logits = nnx.jit(lambda model, images: model(images).logits)
    images = jax.random.uniform(jax.random.key(0), (2, 16, 16, 1))
    np.testing.assert_allclose(logits(short, images), first_two_blocks(dense, images), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(logits(truncated_vit(dense, 4), images), logits(dense, images))


@pytest.mark.parametrize("depth", [0, 5, 2.0, True])
def test_truncation_outside_the_models_depth_is_refused(depth):
    message = rf"depth={depth!r} is not allowed; use an integer from 1 to the model's depth 4"
    with pytest.raises(ValueError, match=message):
        truncated_vit(ViT(DENSE, rngs=nnx.Rngs(0)), depth)


def test_only_a_dense_vit_is_truncated():
    mod = mod_from_vit(ViT(DENSE, rngs=nnx.Rngs(0)), capacity=0.5)
    with pytest.raises(ValueError, match="model is a MoDViT; only a dense ViT"):
        truncated_vit(mod, 2)
