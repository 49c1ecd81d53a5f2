"""The PyTorch twins under torch.autocast(bfloat16): routing in float32 inside, outputs close to the JAX models
computing in bfloat16 (``dtype="bfloat16"``); the float32 equality tests (test_torch_models.py) are unchanged."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the PyTorch twins need torch (pip install 'moe-course[torch]')")

import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

from moe_course.configs import VMoEConfig  # noqa: E402
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
}
# Largest |twin - JAX| / max |JAX logits| measured here: 4.8% (BPR at C = 0.5: a near-tied choice can drop another
# token). Both carry the residual stream in float32 and compute the branches in bfloat16; they round at slightly
# different places (autocast's LayerNorm output is float32 until the next product, the JAX LayerNorm rounds its
# output to bfloat16; the JAX router reads that bfloat16 output, the twin's the float32 one).
RELATIVE_TOLERANCE = 0.06


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_twin_under_autocast_is_close_to_the_bfloat16_jax_model(name):
    model = build_model(CONFIGS[name], rngs=nnx.Rngs(0))
    randomize_nnx(model, seed=len(name))
    twin = to_torch(model)
    x = np.random.default_rng(0).normal(size=(4, 8, 8, 3)).astype(np.float32)
    ours = nnx.jit(lambda m, images: m(images))(model, jnp.asarray(x))
    stream = []  # the residual stream: the patch embedding's and every block's output
    for module in [twin.patch_embed, *twin.blocks]:
        module.register_forward_hook(lambda m, args, out: stream.append(out[0] if isinstance(out, tuple) else out))
    with torch.no_grad(), autocast_for(model.config, "cpu"):
        got = twin(torch.from_numpy(x).permute(0, 3, 1, 2))
    assert got.logits.dtype == torch.float32 and all(p.dtype == torch.float32 for p in twin.parameters())
    assert [s.dtype for s in stream] == [torch.float32] * (1 + model.config.depth)
    reference = np.asarray(ours.logits)
    error = np.abs(got.logits.numpy() - reference).max() / np.abs(reference).max()
    print(f'{name}: relative error {error:.4f}')
    assert error <= RELATIVE_TOLERANCE
    for record in got.routing:  # every float routing field stays float32 inside autocast
        for value in record:
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                assert value.dtype == torch.float32


@pytest.mark.skipif(not hasattr(torch, "_grouped_mm"), reason="this torch has no torch._grouped_mm")
def test_grouped_gemm_experts_equal_the_einsum_path(monkeypatch):
    """The Hopper path (torch._grouped_mm, forced here on the CPU, whose torch has a fallback kernel) computes
    the expert MLPs of the batched-einsum path, gradients included, within bfloat16 rounding."""
    from moe_course.torch.layers import experts as experts_module

    torch.manual_seed(0)
    layer = experts_module.Experts(4, 16, 32)
    buffers = torch.randn(3, 4, 5, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        reference = layer(buffers)
    reference.float().square().sum().backward()
    expected = [p.grad.clone() for p in layer.parameters()]
    layer.zero_grad()
    monkeypatch.setattr(experts_module, "grouped_gemm_dtype", lambda x: torch.bfloat16)
    grouped = layer(buffers)
    grouped.float().square().sum().backward()
    assert grouped.shape == reference.shape and grouped.dtype == torch.bfloat16
    torch.testing.assert_close(grouped.float(), reference.float(), atol=0.05, rtol=0.02)
    for got, want in zip((p.grad for p in layer.parameters()), expected):
        torch.testing.assert_close(got, want, atol=0.1, rtol=0.05)


def test_twin_layers_compile_without_graph_breaks():
    """torch.compile sees each twin layer as one graph (torch._dynamo.explain; no compilation runs)."""
    from moe_course.torch.layers import MoDBlock, SoftMoE, SparseMoE

    x = torch.randn(4, 16, 32)
    for layer in (SparseMoE(32, 64, 8, k=2, group_size=2, capacity_ratio=1.05), SoftMoE(32, 64, 8),
                  MoDBlock(32, 4, 64, capacity=0.5, router="standard", keep_first=False, num_tokens=16)):
        explained = torch._dynamo.explain(layer.eval())(x)
        assert explained.graph_break_count == 0, [str(b.reason)[:200] for b in explained.break_reasons]
