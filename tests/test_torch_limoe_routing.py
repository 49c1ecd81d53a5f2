"""LIMoE's routing additions in PyTorch (moe_course.torch.routing) equal their JAX originals (moe_course.routing).

Masked V-MoE losses and the router z-loss, the entropy losses (local, global with and without the threshold
tau, target and merged entropy for k > 1), -MI(experts; modality), the combined multimodal auxiliary loss,
pruned TOP_k routing in both modes, and token-masked allocations. Inputs: logits on a coarse grid (ties), a
(groups, tokens) mask with a partly kept group, a group with no kept token and a fully kept one, padding in
the modality array, one token whose probabilities underflow to exactly 0. Values within 1e-5, gradients
within 1e-4 (tests/torch_twins.py), decisions and indices exact, errors with the same message.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the PyTorch twins need torch (pip install 'moe-course[torch]')")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import moe_course.routing as jr  # noqa: E402
import moe_course.torch.routing as tr  # noqa: E402
from torch_twins import assert_same, assert_same_error, assert_same_grad, to_torch  # noqa: E402

G, T, E = 3, 10, 5


def tied_logits(seed: int) -> np.ndarray:
    """(G, T, E) logits on a grid of 0.5 (ties within tokens); token (2, 0) has probabilities that underflow
    to exactly 0 (the entropy's 0 log 0 and its gradient there)."""
    logits = (np.round(np.random.default_rng(seed).normal(size=(G, T, E)) * 2) / 2).astype(np.float32)
    logits[2, 0] = [0.0, -200.0, -200.0, 3.0, -200.0]
    return logits


def modality_ids(seed: int) -> np.ndarray:
    """(G, T) int32: group 0 mixes image (0), text (1) and padding (-1); group 1 is text only, with padding;
    group 2 mixes image and text without padding."""
    rng = np.random.default_rng(seed)
    modality = rng.integers(0, 2, size=(G, T)).astype(np.int32)
    modality[0, :3] = [0, 1, -1]
    modality[0, -2:] = -1
    modality[1] = 1
    modality[1, 7:] = -1
    modality[2, :2] = [0, 1]
    return modality


def token_mask(seed: int) -> np.ndarray:
    """(G, T) bool: group 0 partly kept, group 1 with no kept token, group 2 fully kept."""
    mask = np.random.default_rng(seed).random((G, T)) < 0.6
    mask[0, :2] = [True, False]
    mask[1] = False
    mask[2] = True
    return mask


def _compare(jax_fn, torch_fn, arrays, *, name: str, grad: bool = True):
    """Value (a scalar or an array) of both functions on the same float arrays; gradients of its sum."""
    def total(*args):
        value = jax_fn(*args)
        return jnp.sum(value), value

    if grad:
        (_, value), grads = jax.value_and_grad(total, argnums=tuple(range(len(arrays))), has_aux=True)(
            *map(jnp.asarray, arrays))
    else:
        value = jax_fn(*map(jnp.asarray, arrays))
    tensors = [to_torch(a).requires_grad_(grad) for a in arrays]
    twin = torch_fn(*tensors)
    assert_same(value, twin, name=name)
    if grad:
        twin.sum().backward()
        for i, (g, t) in enumerate(zip(grads, tensors)):
            assert_same_grad(g, t.grad, name=f"{name} d/darg{i}")
    return np.asarray(value)


@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("masked", [False, True])
def test_masked_vmoe_losses_and_z_loss(k, masked):
    logits = tied_logits(k)
    noisy = logits + 0.2 * np.asarray(jax.random.normal(jax.random.key(k), (G, T, E)), np.float32)
    jm, tm = (jnp.asarray(token_mask(k)), to_torch(token_mask(k))) if masked else (None, None)
    _compare(lambda a: jr.importance_per_expert(a, jm), lambda a: tr.importance_per_expert(a, tm), [logits],
             name="importance_per_expert")
    _compare(lambda a: jr.importance_loss(a, jm), lambda a: tr.importance_loss(a, tm), [logits], name="importance")
    _compare(lambda a, b: jr.load_per_expert(a, b, k, noise_std=0.3, mask=jm),
             lambda a, b: tr.load_per_expert(a, b, k, noise_std=0.3, mask=tm), [logits, noisy], name="load_per_expert")
    _compare(lambda a, b: jr.load_loss(a, b, k, mask=jm), lambda a, b: tr.load_loss(a, b, k, mask=tm),
             [logits, noisy], name="load")
    total = _compare(lambda a, b: jr.auxiliary_losses(a, b, k, mask=jm).total,
                     lambda a, b: tr.auxiliary_losses(a, b, k, mask=tm).total, [logits, noisy], name="aux total")
    z = _compare(lambda a: jr.router_z_loss(a, jm), lambda a: tr.router_z_loss(a, tm), [logits], name="z_loss")
    assert total > 0 and z > 0
    if masked:  # the empty group 1 drops out: the loss is the mean over groups 0 and 2 alone
        keep = np.array([0, 2])
        sub = tr.router_z_loss(to_torch(logits[keep]), to_torch(token_mask(k)[keep]))
        assert_same(tr.router_z_loss(to_torch(logits), tm), sub, name="z_loss without the empty group")


ENTROPY_LOSSES = [
    ("local", lambda m, a, mask: m.local_entropy_loss(a, mask)),
    ("global", lambda m, a, mask: m.global_entropy_loss(a, mask)),
    ("global tau=log E (on)", lambda m, a, mask: m.global_entropy_loss(a, mask, tau=math.log(E))),
    ("global tau=0.01 (off)", lambda m, a, mask: m.global_entropy_loss(a, mask, tau=0.01)),
    ("target k=2", lambda m, a, mask: m.target_entropy_loss(a, mask, k=2)),
    ("target k=3", lambda m, a, mask: m.target_entropy_loss(a, mask, k=3)),
    ("merged k=1", lambda m, a, mask: m.merged_entropy_loss(a, mask, k=1)),
    ("merged k=2", lambda m, a, mask: m.merged_entropy_loss(a, mask, k=2)),
    ("merged k=3", lambda m, a, mask: m.merged_entropy_loss(a, mask, k=3)),
]


@pytest.mark.parametrize("case", range(len(ENTROPY_LOSSES)), ids=[c[0] for c in ENTROPY_LOSSES])
@pytest.mark.parametrize("masked", [False, True])
def test_entropy_losses_values_and_gradients(case, masked):
    name, loss = ENTROPY_LOSSES[case]
    logits = tied_logits(40 + case)
    jm, tm = (jnp.asarray(token_mask(case)), to_torch(token_mask(case))) if masked else (None, None)
    value = _compare(lambda a: loss(jr, a, jm), lambda a: loss(tr, a, tm), [logits], name=name)
    if "off" in name:
        assert value == 0.0
    else:
        assert value != 0.0


@pytest.mark.parametrize("masked", [False, True])
def test_entropy_parts(masked):
    logits = tied_logits(7)
    jm, tm = (jnp.asarray(token_mask(7)), to_torch(token_mask(7))) if masked else (None, None)
    probs = np.asarray(jax.nn.softmax(jnp.asarray(logits)))
    assert (probs == 0).any(), "the test must reach 0 log 0"
    _compare(jr.entropy, tr.entropy, [probs], name="entropy")
    ours, twin = jr.marginal_probs(jnp.asarray(logits), jm), tr.marginal_probs(to_torch(logits), tm)
    assert_same(ours[0], twin[0], name="marginal")
    assert_same(ours[1], twin[1], exact=True, name="marginal present")
    ours, twin = jr.local_entropy(jnp.asarray(logits), jm), tr.local_entropy(to_torch(logits), tm)
    assert_same(ours[0], twin[0], name="local entropy")
    assert_same(ours[1], twin[1], exact=True, name="local present")
    assert bool(np.asarray(twin[1]).all()) != masked


@pytest.mark.parametrize("seed", [0, 1])
def test_mutual_information_values_and_gradients(seed):
    logits, modality = tied_logits(50 + seed), modality_ids(seed)
    value = _compare(lambda a: jr.mutual_information_loss(a, jnp.asarray(modality), 2),
                     lambda a: tr.mutual_information_loss(a, to_torch(modality), 2), [logits], name="-MI")
    assert -math.log(2) <= value < 0
    # Group 1 holds one modality only and has no loss: the value is the mean over groups 0 and 2.
    keep = np.array([0, 2])
    assert_same(value, tr.mutual_information_loss(to_torch(logits[keep]), to_torch(modality[keep]), 2))


MULTIMODAL = [
    ("paper's five", dict(losses={"text": ("local_entropy", "global_entropy"), "image": ("global_entropy",)},
                          joint=("importance", "load"), taus={"text": math.log(3), "image": math.log(4)}), 1),
    ("per-modality classic", dict(losses={"text": ("importance", "load", "local_entropy", "global_entropy"),
                                          "image": ("importance", "load", "global_entropy")},
                                  taus={"text": math.log(3), "image": math.log(4)}), 1),
    ("joint classic k=2 with z", dict(losses={}, joint=("importance", "load", "z_loss"), noise_std=0.3), 2),
    ("k=2 target, merged, z, MI", dict(losses={"text": ("target_entropy", "z_loss"),
                                               "image": ("merged_entropy", "global_entropy")},
                                       taus={"image": None}, joint=("mutual_information",), weight=0.5), 2),
    ("tau switches the global loss off", dict(losses={"text": ("global_entropy",), "image": ("global_entropy",)},
                                              taus={"text": 0.01, "image": 0.01}), 1),
    ("tau <= 0", dict(losses={"text": ("global_entropy",), "image": ("global_entropy", "z_loss")},
                      taus={"text": 0.0, "image": -1.0}), 1),
    ("nothing chosen", dict(losses={}), 1),
]


@pytest.mark.parametrize("case", range(len(MULTIMODAL)), ids=[c[0] for c in MULTIMODAL])
def test_multimodal_aux_losses(case):
    _, kwargs, k = MULTIMODAL[case]
    logits, modality = tied_logits(60 + case), modality_ids(case)
    noisy = logits + 0.2 * np.asarray(jax.random.normal(jax.random.key(case), (G, T, E)), np.float32)

    def jax_total(a, b):
        out = jr.multimodal_aux_losses(a, b, jnp.asarray(modality), k=k, **kwargs)
        return out.total, out

    (_, ours), grads = jax.value_and_grad(jax_total, argnums=(0, 1), has_aux=True)(jnp.asarray(logits),
                                                                                  jnp.asarray(noisy))
    lt, nt = to_torch(logits).requires_grad_(), to_torch(noisy).requires_grad_()
    twin = tr.multimodal_aux_losses(lt, nt, to_torch(modality), k=k, **kwargs)
    assert isinstance(twin, tr.MultimodalAuxLosses)
    assert sorted(twin.terms) == sorted(ours.terms)  # value_and_grad returns the aux dict with sorted keys
    for name in ours.terms:
        assert_same(ours.terms[name], twin.terms[name], name=name)
    assert_same(ours.total, twin.total, name="total")
    if not ours.terms:
        assert float(twin.total) == 0.0 and not twin.total.requires_grad
        return
    twin.total.backward()
    assert_same_grad(grads[0], lt.grad, name="d/dlogits")
    if nt.grad is None:  # no chosen term reads the noisy logits (only the load loss does): JAX's gradient is 0
        assert not np.any(np.asarray(grads[1])), "d/dnoisy_logits: JAX has a gradient, PyTorch none"
    else:
        assert_same_grad(grads[1], nt.grad, name="d/dnoisy_logits")


@pytest.mark.parametrize("mode", jr.PRUNING_MODES)
@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("noisy", [False, True])
def test_pruned_top_k_routing(mode, k, noisy):
    logits = tied_logits(70 + k)
    keep = np.array([True, False, True, True, False])
    z = np.asarray(jax.random.normal(jax.random.key(k), (G, T, E)), np.float32)
    ours = jr.pruned_top_k_routing(jnp.asarray(logits), k, keep, mode=mode, key=jax.random.key(k) if noisy else None)
    for keep_as in (keep, list(keep), torch.from_numpy(keep)):
        twin = tr.pruned_top_k_routing(to_torch(logits), k, keep_as, mode=mode, noise=to_torch(z) if noisy else None)
        assert_same(ours.expert_index, twin.expert_index, exact=True, name="expert_index")
        for field in ("gates", "probs", "noisy_logits"):
            assert_same(getattr(ours, field), getattr(twin, field), name=field)
    assert keep[twin.expert_index.numpy()].all()


def test_pure_python_helpers_are_shared_not_copied():
    for name in ("PRUNING_MODES", "pruning_order", "coverage_after_pruning", "check_tau", "check_loss_names",
                 "MODALITIES", "PADDING", "PER_MODALITY_LOSSES", "JOINT_LOSSES", "CLASSIC_LOSSES",
                 "ENTROPY_LOSSES", "LIMOE_AUX_WEIGHT"):
        assert getattr(tr, name) is getattr(jr, name), name


ALLOCATIONS = [("vanilla", None), ("bpr", None), ("skip_patch", 0.5)]


@pytest.mark.parametrize("method,keep", ALLOCATIONS)
@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("capacity", [1, 3])
def test_token_mask_allocation(method, keep, k, capacity):
    routed = jr.top_k_routing(jnp.asarray(tied_logits(80 + k)), k)
    index, gates = np.array(routed.expert_index), np.array(routed.gates)
    gates[0, 4] = np.nan  # non-finite and masked tokens both take no slot
    mask = token_mask(k)
    mask[1, :4] = True  # group 1 partly kept here, so its ranks show masked tokens sorted last
    ours = jr.allocate(jnp.asarray(index), jnp.asarray(gates), capacity, E, method=method, keep_fraction=keep,
                       token_mask=jnp.asarray(mask))
    twin = tr.allocate(to_torch(index), to_torch(gates), capacity, E, method=method, keep_fraction=keep,
                       token_mask=to_torch(mask))
    for field in ("expert_index", "slot", "priority_rank", "served", "expert_fill"):
        assert_same(getattr(ours, field), getattr(twin, field), exact=True, name=field)
    assert_same(ours.combine_weights, twin.combine_weights, name="combine_weights")
    served = twin.served.numpy()
    assert not served[~mask].any()
    if method != "vanilla":
        rank = twin.priority_rank.numpy()
        excluded = ~mask | np.isnan(gates).any(-1)
        for g in range(G):  # masked (and non-finite) tokens rank after every kept one
            assert rank[g][excluded[g]].min(initial=T) >= (~excluded[g]).sum()


def _bad_calls():
    """(name, call on a framework module, arguments in that framework's arrays) -- each must raise."""
    logits, modality = tied_logits(0), modality_ids(0)
    index = np.zeros((G, T, 1), np.int32)
    gates = np.ones((G, T, 1), np.float32)
    return [
        ("mask of other shape", lambda m, a: m.importance_loss(a(logits), a(np.ones((G, T + 1), bool)))),
        ("z-loss 2-d logits", lambda m, a: m.router_z_loss(a(logits[0]))),
        ("token_mask of other shape", lambda m, a: m.allocate(a(index), a(gates), 2, E, token_mask=a(np.ones(T, bool)))),
        ("tau inf", lambda m, a: m.global_entropy_loss(a(logits), tau=float("inf"))),
        ("tau nan", lambda m, a: m.global_entropy_loss(a(logits), tau=float("nan"))),
        ("target k > E", lambda m, a: m.target_entropy_loss(a(logits), k=E + 1)),
        ("merged k 0", lambda m, a: m.merged_entropy_loss(a(logits), k=0)),
        ("integer logits", lambda m, a: m.local_entropy_loss(a(index))),
        ("float modality", lambda m, a: m.mutual_information_loss(a(logits), a(logits[..., 0]), 2)),
        ("unknown modality", lambda m, a: m.multimodal_aux_losses(a(logits), a(logits), a(modality),
                                                                  losses={"audio": ("load",)})),
        ("unknown loss", lambda m, a: m.multimodal_aux_losses(a(logits), a(logits), a(modality),
                                                              losses={"text": ("entropy",)})),
        ("loss named twice", lambda m, a: m.multimodal_aux_losses(a(logits), a(logits), a(modality),
                                                                  losses={"text": ("load", "load")})),
        ("unknown joint loss", lambda m, a: m.multimodal_aux_losses(a(logits), a(logits), a(modality), losses={},
                                                                    joint=("local_entropy",))),
        ("bad tau by modality", lambda m, a: m.multimodal_aux_losses(a(logits), a(logits), a(modality),
                                                                     losses={}, taus={"image": float("nan")})),
        ("unknown pruning mode", lambda m, a: m.pruned_top_k_routing(a(logits), 1, [True] * E, mode="drop")),
        ("keep of other length", lambda m, a: m.pruned_top_k_routing(a(logits), 1, [True] * 3, mode="router_drop")),
        ("k above kept experts", lambda m, a: m.pruned_top_k_routing(a(logits), 3, [True, True, False, False, False],
                                                                      mode="router_pred")),
    ]


@pytest.mark.parametrize("case", range(len(_bad_calls())), ids=[c[0] for c in _bad_calls()])
def test_same_errors(case):
    assert_same_error(_bad_calls()[case][1], jr, tr)
