"""What every model in the course returns."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct


@struct.dataclass
class ModelOutput:
    """logits: (batch, num_classes) float32. aux_loss: scalar added to the task loss (0 for dense models).
    attention: per block (batch, heads, tokens, tokens) maps, when asked for. routing: per routed layer a
    routing record (MoE chapters), else empty.
    """

    logits: jax.Array
    aux_loss: jax.Array = struct.field(default_factory=lambda: jnp.zeros(()))
    attention: tuple[jax.Array, ...] = ()
    routing: tuple[Any, ...] = ()
