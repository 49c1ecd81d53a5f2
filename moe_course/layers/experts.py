"""E expert MLPs with separate weights, applied to their dispatched buffers in one batched einsum."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx


class Experts(nnx.Module):
    """E MLPs of the ViT MLP shape, e_i(x) = W2_i gelu(W1_i x + b1_i) + b2_i (V-MoE Sec. 2.1; exact
    GELU, or its tanh approximation with gelu="tanh").

    Call: buffers (groups, experts, capacity, width) -> same shape, in ``dtype`` (the computation dtype; the
    parameters are stored in ``param_dtype`` and cast to it); buffer e goes through expert e.
    Empty buffer slots hold zeros and are never combined back. ``dropout`` acts on the hidden units during
    training (expert dropout, V-MoE App. B fine-tuning uses 0.1).
    Parameters: fc1_kernel (E, width, hidden), fc1_bias (E, hidden), fc2_kernel (E, hidden, width),
    fc2_bias (E, width) -- each expert initialised like ``nnx.Linear``.
    """

    def __init__(self, num_experts: int, width: int, hidden: int, *, dropout: float = 0.0, gelu: str = "exact",
                 dtype=jnp.float32, param_dtype=jnp.float32, rngs: nnx.Rngs):
        self.gelu, self.dtype = gelu, dtype
        init = nnx.initializers.lecun_normal(in_axis=-2, out_axis=-1, batch_axis=(0,))  # per expert, as nnx.Linear
        self.fc1_kernel = nnx.Param(init(rngs.params(), (num_experts, width, hidden), param_dtype))
        self.fc1_bias = nnx.Param(jnp.zeros((num_experts, hidden), param_dtype))
        self.fc2_kernel = nnx.Param(init(rngs.params(), (num_experts, hidden, width), param_dtype))
        self.fc2_bias = nnx.Param(jnp.zeros((num_experts, width), param_dtype))
        self.drop = nnx.Dropout(dropout)

    def __call__(self, buffers: jax.Array, *, deterministic: bool = True, rngs: nnx.Rngs | None = None) -> jax.Array:
        groups, experts, capacity, width = buffers.shape
        # Expert-major: every expert multiplies all its groups' slots in one matmul. (A batched einsum over
        # "gecd" puts the batch axis second, which XLA:CPU transposes for the forward and the backward pass.)
        x = jnp.swapaxes(buffers, 0, 1).reshape(experts, groups * capacity, width).astype(self.dtype)
        w1, b1, w2, b2 = (p[...].astype(self.dtype) for p in (self.fc1_kernel, self.fc1_bias, self.fc2_kernel,
                                                               self.fc2_bias))
        h = jnp.einsum("end,edh->enh", x, w1) + b1[:, None]
        h = self.drop(jax.nn.gelu(h, approximate=self.gelu == "tanh"), deterministic=deterministic, rngs=rngs)
        y = jnp.einsum("enh,ehd->end", h, w2) + b2[:, None]
        return jnp.swapaxes(y.reshape(experts, groups, capacity, width), 0, 1)
