"""The transformer MLP: MLP(x) = W2 gelu(W1 x), exact (erf) GELU by default, as in ViT and every V-MoE expert."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx


class MLP(nnx.Module):
    """x (..., width) -> (..., width) through a hidden layer of ``hidden`` units (SPEC Sec. 1).
    gelu: "exact" (erf) or "tanh" (the tanh approximation of the released big_vision / vmoe checkpoints).
    dtype / param_dtype: computation and parameter dtypes (Flax's fields)."""

    def __init__(self, width: int, hidden: int, *, gelu: str = "exact", dtype=jnp.float32, param_dtype=jnp.float32,
                 rngs: nnx.Rngs):
        self.gelu = gelu
        self.fc1 = nnx.Linear(width, hidden, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        self.fc2 = nnx.Linear(hidden, width, dtype=dtype, param_dtype=param_dtype, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.fc2(jax.nn.gelu(self.fc1(x), approximate=self.gelu == "tanh"))
