"""The PyTorch routing functions (moe_course.torch.routing) equal their JAX originals (moe_course.routing).

Random inputs with fixed seeds; logits rounded to a coarse grid so that many probabilities and priority
scores tie (the tie rules must agree); capacities small enough to drop choices; k = 1..3; both router orders;
the same standard-normal noise fed to both. Decisions (expert indices, slots, ranks, selections) must be
identical, values within 1e-5, gradients within 1e-4. Errors must carry the same message.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the PyTorch twins need torch (pip install 'moe-course[torch]')")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import moe_course.routing as jr  # noqa: E402
import moe_course.torch.routing as tr  # noqa: E402
from torch_twins import assert_same, assert_same_error, assert_same_grad, to_torch  # noqa: E402

G, T, E = 2, 12, 5


def tied_logits(seed: int, shape=(G, T, E)) -> np.ndarray:
    """Logits on a grid of 0.5: many equal entries within a token and equal scores across tokens."""
    return (np.round(np.random.default_rng(seed).normal(size=shape) * 2) / 2).astype(np.float32)


def unit_noise(seed: int, shape=(G, T, E)) -> np.ndarray:
    return np.asarray(jax.random.normal(jax.random.key(seed), shape, jnp.float32))


def test_names_are_one_to_one():
    assert set(jr.__all__) <= set(tr.__all__)
    assert set(tr.__all__) - set(jr.__all__) == {"top_k"}


def test_top_k_breaks_ties_by_lower_index():
    values = to_torch(np.array([[1.0, 3.0, 3.0, 2.0, 3.0]], np.float32))
    expected = jax.lax.top_k(jnp.asarray(values.numpy()), 4)
    got = tr.top_k(values, 4)
    assert_same(expected[0], got[0], exact=True)
    assert_same(expected[1], got[1], exact=True)


@pytest.mark.parametrize("order", jr.ORDERS)
@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("noisy", [False, True])
def test_top_k_routing(order, k, noisy):
    logits = tied_logits(k)
    logits[0, 3, 1] = np.nan  # a non-finite token: NaN gates and probabilities in both
    z = unit_noise(k)
    key = jax.random.key(k) if noisy else None
    ours = jr.top_k_routing(jnp.asarray(logits), k, key, order=order)
    twin = tr.top_k_routing(to_torch(logits), k, noise=to_torch(z) if noisy else None, order=order)
    finite = ~np.isnan(logits).any(-1)
    assert_same(np.asarray(ours.expert_index)[finite], twin.expert_index.numpy()[finite], exact=True,
                name="expert_index")
    for field in ("gates", "probs", "noisy_logits"):
        assert_same(getattr(ours, field), getattr(twin, field), name=field)


def test_router_noise_from_generator_is_reproducible_and_scaled():
    logits = torch.zeros(4, 64, 8)
    a = tr.add_router_noise(logits, torch.Generator().manual_seed(3))
    b = tr.add_router_noise(logits, torch.Generator().manual_seed(3))
    assert torch.equal(a, b)
    assert abs(float(a.std()) - 1 / 8) < 0.01  # 1 / E by default
    assert torch.equal(tr.add_router_noise(logits, torch.Generator().manual_seed(3), noise_std=0.0), logits)
    assert torch.equal(tr.add_router_noise(logits), logits)  # no generator and no noise: evaluation
    probs = tr.router_probabilities(logits, noise=torch.ones(4, 64, 8))
    assert_same(jr.router_probabilities(jnp.zeros((4, 64, 8))), probs)


def routed(k: int, seed: int = 0):
    """Router decisions with ties, shared by both frameworks (computed once in JAX, handed over)."""
    out = jr.top_k_routing(jnp.asarray(tied_logits(seed)), k)
    return np.array(out.expert_index), np.array(out.gates), np.array(out.probs)


ALLOCATIONS = [("vanilla", "max", None), ("bpr", "max", None), ("bpr", "sum", None), ("skip_patch", "max", 0.5)]


@pytest.mark.parametrize("method,score,keep", ALLOCATIONS)
@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("capacity", [1, 3, 8])
def test_allocation(method, score, keep, k, capacity):
    index, gates, _ = routed(k, seed=10 + k)
    gates[1, 5] = np.nan  # a token with non-finite gates takes no slot in either
    ours = jr.allocate(jnp.asarray(index), jnp.asarray(gates), capacity, E, method=method, score=score,
                       keep_fraction=keep)
    twin = tr.allocate(to_torch(index), to_torch(gates), capacity, E, method=method, score=score,
                       keep_fraction=keep)
    if capacity == 1:
        assert not bool(np.asarray(ours.served).all()), "the test must drop choices"
    for field in ("expert_index", "slot", "priority_rank", "served", "expert_fill"):
        assert_same(getattr(ours, field), getattr(twin, field), exact=True, name=field)
    assert_same(ours.combine_weights, twin.combine_weights, name="combine_weights")
    assert (twin.capacity, twin.num_experts) == (ours.capacity, ours.num_experts)


@pytest.mark.parametrize("combine_weights", jr.COMBINE_WEIGHTS)
@pytest.mark.parametrize("capacity", [1, 4, T])
def test_experts_choice(capacity, combine_weights):
    _, _, probs = routed(1, seed=capacity)
    probs[0, 2] = np.nan
    ours = jr.experts_choice_allocation(jnp.asarray(probs), capacity, combine_weights=combine_weights)
    twin = tr.experts_choice_allocation(to_torch(probs), capacity, combine_weights=combine_weights)
    assert_same(ours.token_index, twin.token_index, exact=True, name="token_index")
    assert_same(ours.weights, twin.weights, name="weights")
    ours_alloc, twin_alloc = jr.experts_choice_as_allocation(ours, T), tr.experts_choice_as_allocation(twin, T)
    assert twin_alloc.priority_rank is None
    for field in ("expert_index", "slot", "expert_fill"):
        assert_same(getattr(ours_alloc, field), getattr(twin_alloc, field), exact=True, name=field)
    assert_same(ours_alloc.gates, twin_alloc.gates, name="gates")


def _allocations(k: int, capacity: int):
    index, gates, _ = routed(k, seed=20 + k)
    ours = jr.batch_prioritized_allocation(jnp.asarray(index), jnp.asarray(gates), capacity, E)
    return ours, index, gates


@pytest.mark.parametrize("implementation", jr.IMPLEMENTATIONS)
@pytest.mark.parametrize("k", [1, 2, 3])
def test_dispatch_combine_values_and_gradients(implementation, k):
    capacity, dim = 3, 6
    ours, index, gates = _allocations(k, capacity)
    rng = np.random.default_rng(k)
    x = rng.normal(size=(G, T, dim)).astype(np.float32)
    y = rng.normal(size=(G, E, capacity, dim)).astype(np.float32)
    w_in = rng.normal(size=(G, E, capacity, dim)).astype(np.float32)  # cotangents
    w_out = rng.normal(size=(G, T, dim)).astype(np.float32)
    assert_same(jr.buffer_token_index(ours), tr.buffer_token_index(
        tr.batch_prioritized_allocation(to_torch(index), to_torch(gates), capacity, E)), exact=True)
    assert_same(jr.dispatch_tensor(ours), tr.dispatch_tensor(
        tr.batch_prioritized_allocation(to_torch(index), to_torch(gates), capacity, E)), exact=True)

    def jax_loss(x, gates, y):
        alloc = jr.batch_prioritized_allocation(jnp.asarray(index), gates, capacity, E)
        into = jr.dispatch(x, alloc, implementation=implementation)
        out = jr.combine(y, alloc, implementation=implementation)
        return jnp.sum(into * w_in) + jnp.sum(out * w_out), (into, out)

    (_, (into, out)), grads = jax.value_and_grad(jax_loss, argnums=(0, 1, 2), has_aux=True)(
        jnp.asarray(x), jnp.asarray(gates), jnp.asarray(y))
    xt, gt, yt = (to_torch(a).requires_grad_() for a in (x, gates, y))
    alloc = tr.batch_prioritized_allocation(to_torch(index), gt, capacity, E)
    into_t = tr.dispatch(xt, alloc, implementation=implementation)
    out_t = tr.combine(yt, alloc, implementation=implementation)
    ((into_t * to_torch(w_in)).sum() + (out_t * to_torch(w_out)).sum()).backward()
    assert_same(into, into_t, name="dispatch")
    assert_same(out, out_t, name="combine")
    for name, g, t in zip(("x", "gates", "expert_outputs"), grads, (xt, gt, yt)):
        assert_same_grad(g, t.grad, name=f"d/d{name}")


def test_apply_experts_and_nonfinite_tokens():
    capacity, dim = 4, 3
    ours, index, gates = _allocations(2, capacity)
    x = np.random.default_rng(0).normal(size=(G, T, dim)).astype(np.float32)
    x[0, 1, 2] = np.inf  # goes where its token goes, as NaN, and nowhere else
    scale = np.arange(1, E + 1, dtype=np.float32)[None, :, None, None]
    twin = tr.batch_prioritized_allocation(to_torch(index), to_torch(gates), capacity, E)
    for implementation in jr.IMPLEMENTATIONS:
        expected = jr.apply_experts(jnp.asarray(x), ours, lambda b: jnp.tanh(b) * scale, implementation=implementation)
        got = tr.apply_experts(to_torch(x), twin, lambda b: torch.tanh(b) * to_torch(scale),
                               implementation=implementation)
        assert_same(expected, got, name=implementation)


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("noise_std", [None, 0.3])
def test_auxiliary_losses_values_and_gradients(k, noise_std):
    logits = tied_logits(30 + k)
    noisy = logits + 0.2 * unit_noise(k)

    def jax_total(logits, noisy):
        losses = jr.auxiliary_losses(logits, noisy, k, noise_std=noise_std)
        return losses.total, losses

    (_, losses), grads = jax.value_and_grad(jax_total, argnums=(0, 1), has_aux=True)(
        jnp.asarray(logits), jnp.asarray(noisy))
    lt, nt = to_torch(logits).requires_grad_(), to_torch(noisy).requires_grad_()
    twin = tr.auxiliary_losses(lt, nt, k, noise_std=noise_std)
    twin.total.backward()
    for field in ("importance", "load", "total"):
        assert_same(getattr(losses, field), getattr(twin, field), name=field)
    assert_same_grad(grads[0], lt.grad, name="d/dlogits")
    assert_same_grad(grads[1], nt.grad, name="d/dnoisy_logits")
    assert_same(jr.importance_per_expert(jnp.asarray(logits)), tr.importance_per_expert(to_torch(logits)))
    assert_same(jr.selection_probability(jnp.asarray(logits), jnp.asarray(noisy), k),
                tr.selection_probability(to_torch(logits), to_torch(noisy), k))


@pytest.mark.parametrize("slots_per_expert", [1, 2])
def test_soft_routing_values_and_gradients(slots_per_expert):
    dim, experts = 6, 3
    slots = experts * slots_per_expert
    rng = np.random.default_rng(slots_per_expert)
    x = rng.normal(size=(G, T, dim)).astype(np.float32)
    x[1, 4] = 0.0  # a zero token: normalisation must keep it finite in both
    phi = rng.normal(size=(dim, slots)).astype(np.float32)
    weight = rng.normal(size=(experts, dim, dim)).astype(np.float32) / 3
    cotangent = rng.normal(size=(G, T, dim)).astype(np.float32)

    def jax_loss(x, phi, scale):
        routing = jr.soft_routing(x, phi, scale)
        y = jr.apply_soft_experts(x, routing, lambda s: jnp.tanh(jnp.einsum("gesd,edh->gesh", s, weight)), experts)
        return jnp.sum(y * cotangent), (routing, y)

    (_, (routing, y)), grads = jax.value_and_grad(jax_loss, argnums=(0, 1, 2), has_aux=True)(
        jnp.asarray(x), jnp.asarray(phi), jnp.asarray(1.7))
    xt, pt, st = to_torch(x).requires_grad_(), to_torch(phi).requires_grad_(), torch.tensor(1.7, requires_grad=True)
    twin = tr.soft_routing(xt, pt, st)
    yt = tr.apply_soft_experts(xt, twin, lambda s: torch.tanh(torch.einsum("gesd,edh->gesh", s, to_torch(weight))),
                               experts)
    (yt * to_torch(cotangent)).sum().backward()
    for field in SOFT_FIELDS:
        assert_same(getattr(routing, field), getattr(twin, field), name=field)
    assert_same(y, yt, name="output")
    for name, g, t in zip(("x", "phi", "scale"), grads, (xt, pt, st)):
        assert_same_grad(g, t.grad, name=f"d/d{name}")
    slots_in = jr.soft_slots(jnp.asarray(x), routing.dispatch_weights)
    assert_same(slots_in, tr.soft_slots(to_torch(x), twin.dispatch_weights.detach()))
    assert_same(jr.l2_normalize(jnp.asarray(x)), tr.l2_normalize(to_torch(x)))


SOFT_FIELDS = ("logits", "dispatch_weights", "combine_weights")


@pytest.mark.parametrize("capacity", [0.125, 0.5, 1.0])
@pytest.mark.parametrize("keep_first", [False, True])
def test_mod_selection_and_scatter(capacity, keep_first):
    batch, tokens, width, heads = 3, 16, 4, 2
    rng = np.random.default_rng(int(capacity * 8))
    x = rng.normal(size=(batch, tokens, width)).astype(np.float32)
    kernel = rng.normal(size=(width, 1)).astype(np.float32)
    scores = np.round(rng.normal(size=(batch, tokens)), 0).astype(np.float32)  # many ties
    logits = rng.normal(size=(batch, heads, tokens, tokens)).astype(np.float32)
    attention = np.asarray(jax.nn.softmax(jnp.asarray(logits), axis=-1))
    assert_same(jr.standard_router_scores(jnp.asarray(x), jnp.asarray(kernel)),
                tr.standard_router_scores(to_torch(x), to_torch(kernel)))
    assert_same(jr.attention_router_scores(jnp.asarray(attention)), tr.attention_router_scores(to_torch(attention)))
    ours = jr.mod_select(jnp.asarray(scores), capacity, keep_first=keep_first)
    twin = tr.mod_select(to_torch(scores), capacity, keep_first=keep_first)
    for field in ("index", "processed", "scores"):
        assert_same(getattr(ours, field), getattr(twin, field), exact=True, name=field)
    selected = ours.index.shape[1]
    update = rng.normal(size=(batch, selected, width)).astype(np.float32)
    assert_same(jr.gather_tokens(jnp.asarray(x), ours.index), tr.gather_tokens(to_torch(x), twin.index), exact=True)
    assert_same(jr.scatter_update(jnp.asarray(x), ours.index, jnp.asarray(update)),
                tr.scatter_update(to_torch(x), twin.index, to_torch(update)))
    small = attention[:, :, :selected, :selected]
    assert_same(jr.scatter_attention(jnp.asarray(small), ours.index, tokens),
                tr.scatter_attention(to_torch(small), twin.index, tokens), exact=True)
    assert_same(jr.mod_gate(jnp.asarray(scores)), tr.mod_gate(to_torch(scores)))


def _bad_calls():
    """(name, call on a framework module, arguments in that framework's arrays) -- each must raise."""
    logits = tied_logits(0)
    index, gates, probs = routed(2)
    x = np.zeros((G, T, 4), np.float32)
    return [
        ("k too large", lambda m, a: m.top_k_routing(a(logits), E + 1)),
        ("unknown order", lambda m, a: m.top_k_routing(a(logits), 1, order="sorted")),
        ("integer logits", lambda m, a: m.top_k_routing(a(index), 1)),
        ("negative noise", lambda m, a: m.add_router_noise(a(logits), noise_std=-1.0)),
        ("unknown method", lambda m, a: m.allocate(a(index), a(gates), 2, E, method="fifo")),
        ("keep_fraction without skip_patch", lambda m, a: m.allocate(a(index), a(gates), 2, E, keep_fraction=0.5)),
        ("float expert_index", lambda m, a: m.vanilla_allocation(a(gates), a(gates), 2, E)),
        ("gates of other shape", lambda m, a: m.vanilla_allocation(a(index), a(gates[:, :3]), 2, E)),
        ("zero capacity", lambda m, a: m.batch_prioritized_allocation(a(index), a(gates), 0, E)),
        ("keep_fraction 0", lambda m, a: m.skip_patch_allocation(a(index), a(gates), 2, E, keep_fraction=0.0)),
        ("unknown score", lambda m, a: m.priority_scores(a(gates), score="mean")),
        ("experts choice capacity", lambda m, a: m.experts_choice_allocation(a(probs), T + 1)),
        ("unknown implementation", lambda m, a: m.dispatch(a(x), m.vanilla_allocation(a(index), a(gates), 2, E),
                                                           implementation="loop")),
        ("x of other groups", lambda m, a: m.gather_dispatch(a(x[:1]), m.vanilla_allocation(a(index), a(gates), 2, E))),
        ("buffers of other capacity", lambda m, a: m.gather_combine(
            a(np.zeros((G, E, 3, 4), np.float32)), m.vanilla_allocation(a(index), a(gates), 2, E))),
        ("load loss without noise", lambda m, a: m.load_loss(a(logits), a(logits), 1, noise_std=0)),
        ("noisy logits of other shape", lambda m, a: m.load_loss(a(logits), a(logits[:1]), 1)),
        ("2-d logits for the losses", lambda m, a: m.importance_loss(a(logits[0]))),
        ("phi width", lambda m, a: m.soft_logits(a(x), a(np.ones((5, 3), np.float32)))),
        ("experts not dividing slots", lambda m, a: m.apply_soft_experts(
            a(x), m.soft_routing(a(x), a(np.ones((4, 6), np.float32))), lambda s: s, 4)),
        ("MoD capacity 0", lambda m, a: m.mod_select(a(logits[0]), 0.0)),
        ("MoD router width", lambda m, a: m.standard_router_scores(a(x), a(np.ones(3, np.float32)))),
        ("MoD attention axes", lambda m, a: m.attention_router_scores(a(x))),
    ]


@pytest.mark.parametrize("case", range(len(_bad_calls())), ids=[c[0] for c in _bad_calls()])
def test_same_errors(case):
    assert_same_error(_bad_calls()[case][1], jr, tr)
