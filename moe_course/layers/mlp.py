"""The transformer MLP: MLP(x) = W2 gelu(W1 x), exact (erf) GELU by default, as in ViT and every V-MoE expert."""

from __future__ import annotations

import jax
from flax import nnx


class MLP(nnx.Module):
    """x (..., width) -> (..., width) through a hidden layer of ``hidden`` units (SPEC Sec. 1).
    gelu: "exact" (erf) or "tanh" (the tanh approximation of the released big_vision / vmoe checkpoints)."""

    def __init__(self, width: int, hidden: int, *, gelu: str = "exact", rngs: nnx.Rngs):
        self.gelu = gelu
        self.fc1 = nnx.Linear(width, hidden, rngs=rngs)
        self.fc2 = nnx.Linear(hidden, width, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.fc2(jax.nn.gelu(self.fc1(x), approximate=self.gelu == "tanh"))
