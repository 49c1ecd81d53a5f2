"""The V-MoE auxiliary loss against google-research/vmoe's own computation (issue 63, item 4).

``_vmoe_router_aux`` below re-implements, line for line, what vmoe computes at commit 942a78b:
- vmoe/nn/routing.py ``NoisyTopExpertsPerItemRouter._compute_gates_softmax_and_metrics`` (lines 63-115): the
  importance loss per group on the clean softmax (``jax.vmap(_importance_auxiliary_loss)``); with
  ``deterministic or noise_std == 0.0`` the auxiliary loss is ``_weighted_sum((importance_loss_weight,
  importance_loss))`` -- the load term is left out and the importance term KEEPS its weight; otherwise noise of
  std ``noise_std / num_experts`` is added and the load loss joins at ``load_loss_weight``;
- ``_importance_auxiliary_loss`` (lines 150-157) and ``_load_auxiliary_loss`` (lines 159-184): (std / mean)^2 over
  experts of the summed gates, and of the mean over tokens of ``1 - Phi((threshold - logit) / noise_std)`` with
  the threshold the k-th largest noisy logit (taken by index and one-hot, as there);
- ``_weighted_sum`` (lines 247-252): the sum of weight x loss over the weights > 0;
- vmoe/nn/vit_moe.py ``EncoderMoe.__call__`` (lines 261-263): the blocks' losses SUMMED, and
  vmoe/train/trainer.py ``train_step`` (lines 658-665): ``jax.tree_util.tree_map(jnp.mean, metrics)``, the mean
  over groups, added to the main loss;
- vmoe/configs/vmoe_paper/common.py (lines 242-243): importance_loss_weight = load_loss_weight = 0.005.
The library's loss equals it: with the router noise off (before this test, 2.000x vmoe's: lambda = 0.01 on
the importance loss alone), with noise on the same logits and noise, and summed over layers for the paper
presets.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from moe_course import routing
from moe_course.configs import PRESETS
from moe_course.configs.vmoe import VMoEConfig
from moe_course.layers.moe import SparseMoE, vmoe_aux_loss
from moe_course.models import VMoE

PAPER_WEIGHT = 0.005  # vmoe/configs/vmoe_paper/common.py: importance_loss_weight = load_loss_weight


def _vmoe_importance(gates):  # routing.py _importance_auxiliary_loss, one group (tokens, experts)
    importance_per_expert = jnp.sum(gates, axis=tuple(range(gates.ndim - 1)))
    return (jnp.std(importance_per_expert) / jnp.mean(importance_per_expert)) ** 2


def _vmoe_load(logits, logits_noisy, noise_std, num_selected_experts):  # routing.py _load_auxiliary_loss
    num_experts = logits_noisy.shape[-1]
    threshold_per_item_index = jax.lax.top_k(logits_noisy, num_selected_experts)[-1][..., -1]
    threshold_per_item = jnp.sum(jax.nn.one_hot(threshold_per_item_index, num_experts) * logits_noisy, axis=-1)
    noise_required_to_win = (threshold_per_item[..., None] - logits) / noise_std
    p = 1. - jax.scipy.stats.norm.cdf(noise_required_to_win)
    p_mean = jnp.mean(p, axis=0)
    return (jnp.std(p_mean) / jnp.mean(p_mean)) ** 2


def _vmoe_router_aux(gates_logits, *, k, noise_std=1.0, logits_noise=None, importance_loss_weight=PAPER_WEIGHT,
                     load_loss_weight=PAPER_WEIGHT):
    """vmoe's per-group ``metrics["auxiliary_loss"]`` (groups,) for router logits (groups, tokens, experts);
    ``logits_noise`` None: the ``deterministic or noise_std == 0.0`` branch; else the standard-normal draw that
    the router scales by ``noise_std / num_experts``."""
    num_experts = gates_logits.shape[-1]
    importance_loss = jax.vmap(_vmoe_importance)(jax.nn.softmax(gates_logits))
    weighted = lambda *args: sum(x * w for w, x in args if w > 0)  # noqa: E731 -- routing.py _weighted_sum
    if logits_noise is None or noise_std == 0.0:
        return weighted((importance_loss_weight, importance_loss))
    scaled_std = (1.0 / num_experts) * noise_std
    noisy = gates_logits + scaled_std * logits_noise
    load_loss = jax.vmap(lambda a, b: _vmoe_load(a, b, scaled_std, k))(gates_logits, noisy)
    return weighted((importance_loss_weight, importance_loss), (load_loss_weight, load_loss))


def _layer(noise_std, k=1, experts=8) -> SparseMoE:
    return SparseMoE(32, 64, experts, k=k, capacity_ratio=1.05, group_size=2, noise_std=noise_std,
                     aux_loss_weight=0.01, rngs=nnx.Rngs(0))


def _logits(seed=0, groups=3, tokens=20, experts=8):
    return 0.3 * jax.random.normal(jax.random.key(seed), (groups, tokens, experts))


def test_without_router_noise_the_aux_loss_is_vmoes():
    """noise_std = 0 on identical logits: lambda x 0.5 x L_imp per group, mean over groups -- vmoe's 0.005 x L_imp
    (before: lambda x L_imp, exactly twice it)."""
    logits = _logits()
    ours = float(vmoe_aux_loss(routing, _layer(0.0), logits, logits))
    theirs = float(jnp.mean(_vmoe_router_aux(logits, k=1)))
    np.testing.assert_allclose(ours, theirs, rtol=1e-6)
    np.testing.assert_allclose(float(0.01 * routing.importance_loss(logits)) / theirs, 2.0, rtol=1e-6)  # the old


@pytest.mark.parametrize("k", [1, 2])
def test_with_router_noise_the_aux_loss_is_vmoes_on_the_same_noise(k):
    """noise on (sigma = 1/E, vmoe's noise_std = 1.0 scaled by 1/E): 0.005 L_imp + 0.005 L_load per group, the
    same standard-normal draw on both sides, mean over groups."""
    logits, draw = _logits(1), jax.random.normal(jax.random.key(2), (3, 20, 8))
    noisy = logits + draw / 8
    ours = float(vmoe_aux_loss(routing, _layer(None, k=k), logits, noisy))
    theirs = float(jnp.mean(_vmoe_router_aux(logits, k=k, logits_noise=draw)))
    np.testing.assert_allclose(ours, theirs, rtol=1e-5)


def test_a_paper_preset_sums_its_layers_losses_as_vmoes_encoder(monkeypatch):
    """Every preset named for the paper (vmoe-*-every-2 / -last-n, Table 7 and the -i1k variants) sums over its
    MoE layers (vmoe/nn/vit_moe.py EncoderMoe), the CPU presets average; a model of a paper preset's settings
    (shrunk) reports the sum of its layers' vmoe losses, computed from each layer's router logits."""
    paper = {name: c for name, c in PRESETS["vmoe"].items()
             if name.startswith("vmoe-") and ("every-2" in name or "last-" in name)}
    assert len(paper) == 16 and {c.aux_loss_reduction for c in paper.values()} == {"sum"}
    assert PRESETS["vmoe"]["digits-tiny-moe"].aux_loss_reduction == "mean"
    assert PRESETS["vmoe"]["vmoe-h/14-every-2"].moe_blocks() == tuple(range(1, 32, 2))  # 16 layers summed

    config = paper["vmoe-s/32-every-2"].replace(image_size=16, patch_size=4, width=32, depth=4, heads=2,
                                                 mlp_dim=64, num_classes=5, representation_size=None,
                                                 num_experts=4, group_size=2, noise_std=0.0)
    model = VMoE(config, rngs=nnx.Rngs(0))
    images = jax.random.uniform(jax.random.key(3), (4, 16, 16, 3))
    captured = []  # each MoE layer's router logits (groups, tokens, experts), as the layer computes them
    original = SparseMoE.__call__

    def recording(self, x, **kwargs):
        captured.append(self.router(x.reshape(x.shape[0] // self.group_size, -1, x.shape[-1])).astype(jnp.float32))
        return original(self, x, **kwargs)

    monkeypatch.setattr(SparseMoE, "__call__", recording)
    aux = float(model(images, deterministic=False, rngs=nnx.Rngs(4)).aux_loss)
    monkeypatch.undo()
    assert len(captured) == 2
    theirs = sum(float(jnp.mean(_vmoe_router_aux(logits, k=config.k))) for logits in captured)
    np.testing.assert_allclose(aux, theirs, rtol=1e-6)
    mean = VMoE(config.replace(aux_loss_reduction="mean"), rngs=nnx.Rngs(0))
    np.testing.assert_allclose(float(mean(images, deterministic=False, rngs=nnx.Rngs(4)).aux_loss), theirs / 2,
                               rtol=1e-6)
