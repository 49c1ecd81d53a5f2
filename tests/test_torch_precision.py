"""The PyTorch twins under torch.autocast(bfloat16): routing in float32 inside, outputs close to the JAX models
computing in bfloat16 (``dtype="bfloat16"``); the float32 equality tests (test_torch_models.py) are unchanged."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the PyTorch twins need torch (pip install 'moe-course[torch]')")

import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

from moe_course.configs import MoDConfig, SoftMoEConfig, VMoEConfig  # noqa: E402
from moe_course.models import build_model  # noqa: E402
from moe_course.torch.convert import to_torch  # noqa: E402
from moe_course.torch.precision import autocast_for  # noqa: E402
from torch_twins import randomize_nnx  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::moe_course.routing.CapacityRoundingWarning")

SHAPE = dict(image_size=8, patch_size=2, channels=3, width=16, depth=4, heads=2, mlp_dim=24, num_classes=5,
             dtype="bfloat16")
CONFIGS = {
    "vmoe-bpr": VMoEConfig(name="t-vmoe", k=2, capacity_ratio=0.5, allocation="bpr", num_experts=4, group_size=2,
                           placement="every-2", pool="cls", representation_size=12, **SHAPE),
    "soft": SoftMoEConfig(name="t-soft", router="soft", slots_per_expert=2, num_experts=4, group_size=1,
                          placement="second-half", **SHAPE),
    "mod-attention": MoDConfig(name="t-mod", capacity=0.5, router="attention", pool="cls", **SHAPE),
}
# Largest |twin - JAX| / max |JAX logits| measured here: 1.7% (MoD, Soft MoE), 4.7% (V-MoE, BPR at C = 0.5: a
# near-tied choice can drop another token). Both round to bfloat16, at different places:
# autocast keeps LayerNorm outputs and residual sums float32, the JAX model carries them in bfloat16).
RELATIVE_TOLERANCE = 0.06


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_twin_under_autocast_is_close_to_the_bfloat16_jax_model(name):
    model = build_model(CONFIGS[name], rngs=nnx.Rngs(0))
    randomize_nnx(model, seed=len(name))
    twin = to_torch(model)
    x = np.random.default_rng(0).normal(size=(4, 8, 8, 3)).astype(np.float32)
    ours = nnx.jit(lambda m, images: m(images))(model, jnp.asarray(x))
    with torch.no_grad(), autocast_for(model.config, "cpu"):
        got = twin(torch.from_numpy(x).permute(0, 3, 1, 2))
    assert got.logits.dtype == torch.float32 and all(p.dtype == torch.float32 for p in twin.parameters())
    reference = np.asarray(ours.logits)
    error = np.abs(got.logits.numpy() - reference).max() / np.abs(reference).max()
    print(f'{name}: relative error {error:.4f}')
    assert error <= RELATIVE_TOLERANCE
    for record in got.routing:  # every float routing field stays float32 inside autocast
        for value in record:
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                assert value.dtype == torch.float32
